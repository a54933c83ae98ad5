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
        # issue 39's misses, and more of their families
        ("tool --auth s3cr3t --tp 2", "tool --auth *** --tp 2"),
        ("tool --passphrase 'open sesame'", "tool --passphrase ***"),
        ("tool --basic-auth user:pass --x", "tool --basic-auth *** --x"),
        ("tool --pw hunter2", "tool --pw ***"),
        ("tool --pass hunter2", "tool --pass ***"),
        ("tool --proxy-authorization=x", "tool --proxy-authorization=***"),
        ("curl -H Authorization: Bearer sk-abc http://h", "curl -H Authorization: Bearer *** http://h"),
        ("curl -H 'Authorization: Basic dXNlcjpwYXNz' http://h", "curl -H 'Authorization: Basic ***' http://h"),
        (
            "pip install --index-url https://me:s3cr3t@pypi.corp/simple x",
            "pip install --index-url https://me:***@pypi.corp/simple x",
        ),
        ("PIP_PASSWORD=x pip install y", "PIP_PASSWORD=*** pip install y"),
        (
            "python -m vllm --author-name ann --passthrough-mode 1",
            "python -m vllm --author-name ann --passthrough-mode 1",
        ),
        # the third pass's review: other credential headers, a token as a URL's user, counts of tokens
        ("curl -H 'X-Api-Key: sk-abc' http://h", "curl -H 'X-Api-Key: ***' http://h"),
        ("curl -H X-Auth-Token:abc http://h", "curl -H X-Auth-Token:*** http://h"),
        ("curl -H 'Cookie: session=abc' http://h", "curl -H 'Cookie: ***' http://h"),
        ("git clone https://ghp_abc123@github.com/o/r", "git clone https://***@github.com/o/r"),
        (
            "vllm serve m --max-num-batched-tokens 8192 --max-total-tokens 4096",
            "vllm serve m --max-num-batched-tokens 8192 --max-total-tokens 4096",
        ),
    ],
)
def test_credentials_on_other_processes_command_lines_are_masked(cmdline: str, shown: str) -> None:
    from fleet.secrets import mask_credentials

    assert mask_credentials(cmdline) == shown


@pytest.mark.parametrize("word", ["a." * 50_000, "key" * 30_000, "a-" * 50_000, "a:" * 50_000, "x://" * 25_000])
def test_a_long_hostile_word_on_a_command_line_costs_its_length_not_its_square(word: str) -> None:
    """Another user's process can put one word of any shape on its command line, and every probe reads
    it. Names are tried once per word and never backtracked into: these end at once; before, the first
    took about 100 s (a 2,000-character one already 0.4 s, per process and per probe)."""
    from fleet.secrets import mask_credentials

    assert mask_credentials(f"tool {word} --api-key sk-x1 --port 1") == f"tool {word} --api-key *** --port 1"


SECRET = "hf_SECRETtoken1234"


@pytest.mark.parametrize(
    "said",
    [
        f"using {SECRET}",
        "using hf_SEC\x1b[0mRETtoken1234",  # a colour code inside: the terminal shows the secret
        "using hf_SE\x1b]0;title\x07CRETtoken1234",  # an OSC sequence inside
        "using hf_SE\x9bCRETtoken1234",  # a C1 control inside
        "using hf_SE\u200bCRETtoken1234",  # a zero-width space inside
        "using hf_SE^[[31mCRETtoken1234",  # colour pasted as text
        "GET /v1?token=hf%5FSECRETtoken1234",  # percent-encoded
        "GET /v1?token=%68%66%5f%53ECRETtoken1234",  # every character encoded, lower-case hex
    ],
)
def test_a_secret_is_redacted_in_every_spelling_it_is_shown_in(said: str) -> None:
    from fleet.secrets import redact
    from fleet.terminal import safe_text

    shown = safe_text(redact(said, {"HF_TOKEN": SECRET}))
    assert "SECRET" not in shown and "***" in shown, shown


def test_redaction_of_a_run_of_escape_characters_is_linear() -> None:
    """A line of ESCs had 2**n ways to match the gap between a secret's characters (24 took seconds; a
    client can make an engine log such a line). It is matched one way now: bounded, not timed."""
    import re

    from fleet.secrets import _GAP

    assert "(?>" in _GAP and _GAP.endswith(")*+")  # atomic, possessive: no backtracking into the gap
    from fleet.secrets import redact

    line = "h" + "\x1b" * 60 + "X " + SECRET
    assert redact(line, {"HF_TOKEN": SECRET}).endswith("***")
    assert re.compile(_GAP)  # compiles on the client's Python (3.11+)
