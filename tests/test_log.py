"""fleet.log: JSON lines into a log file, warnings only on a terminal, structlog imported only when an
event is actually written (it is a tenth of a second of every command's start-up)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import log


def test_events_go_to_the_log_file_as_json_lines_with_their_bound_context(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "health.log"
    log.configure(json_file=path)
    try:
        logger = log.get(command="health")
        logger.info("host_checked", host="ct129", status="ok")
        logger.debug("not_at_info_level")
    finally:
        log.configure()
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(entries) == 1
    assert entries[0]["event"] == "host_checked"
    assert entries[0]["command"] == "health" and entries[0]["host"] == "ct129" and entries[0]["level"] == "info"
    assert entries[0]["timestamp"].endswith("Z")


def test_a_terminal_run_drops_info_events_without_importing_structlog() -> None:
    code = (
        "import sys\n"
        "from fleet import log\n"
        "log.configure()\n"
        "log.get(command='health').info('host_checked', host='ct129')\n"
        "assert 'structlog' not in sys.modules, 'structlog imported for a dropped event'\n"
        "log.get(command='health').warning('health_skipped_overlap', other='pid 1')\n"
        "assert 'structlog' in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "health_skipped_overlap" in r.stderr and "host_checked" not in r.stderr


@pytest.mark.parametrize(
    ("cmdline", "shown"),
    [
        (
            "sglang serve --api-key sk-123 --port 1",
            "sglang serve --api-key *** --port 1",
        ),
        ("vllm serve m --hf-token=hf_abc", "vllm serve m --hf-token=***"),
        ("x --admin-api-key k --password p", "x --admin-api-key *** --password ***"),
        ("x --api-key --port 1", "x --api-key --port 1"),  # no value: the next flag is not one
        ("x --keyboard-layout us --tp 2", "x --keyboard-layout *** --tp 2"),  # better masked than shown
        ("vllm serve --api-key k1 k2 --port 8000", "vllm serve --api-key *** --port 8000"),  # several keys
        ("x --api-key=a b --tp 2", "x --api-key=*** --tp 2"),  # one argv word with a space in it
        ("sh -c OPENAI_API_KEY=sk-1 python -m vllm", "sh -c OPENAI_API_KEY=*** python -m vllm"),
        ("x --tokenizer-path /m/tok --tp 2", "x --tokenizer-path /m/tok --tp 2"),
        ("python -m sglang.launch_server --port 30000", "python -m sglang.launch_server --port 30000"),
    ],
)
def test_credentials_on_other_processes_command_lines_are_masked(cmdline: str, shown: str) -> None:
    from fleet.secrets import mask_credentials

    assert mask_credentials(cmdline) == shown
