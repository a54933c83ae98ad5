"""The commands a reader is meant to type, typed: every `fleet` line in a code block of the README and the
guides, and every command the README names in backticks, runs against the simulated fleet in the order the
page gives them (placeholders filled with the sandbox's names), and must succeed. A command that cannot
run here is listed below with the reason; a listed one that no page shows any more fails too, so neither
list rots. Inline mentions in the guides are checked against the command tree (tests/test_docs.py)."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fleet_testbed import simhost

pytestmark = pytest.mark.ssh

GUIDES = [
    *("deployments.md", "startup.md", "containers.md", "services.md", "groups.md", "models.md", "engines.md"),
    "health.md",
]
PAGES = [ROOT / "README.md", *(ROOT / "docs" / g for g in GUIDES)]
CRASH_LOG = ROOT.parent / "shared" / "corpus" / "crash-logs" / "cases" / "001.log"
FILLED = {  # the README's placeholders, as the sandbox names them
    "H/NAME": "blackwell/qwen35-nvfp4",
    "H": "blackwell",
    "PLAYBOOK": "qwen35-nvfp4",
    "SERVICE": "qwen36",
    "LOG": str(CRASH_LOG),
}
CRONTAB = "this machine's crontab; tests/test_health.py installs the entry and restores what was there"
PACKAGE_INDEX = "a package index; tests/test_engines.py installs and switches versions from a local one"
TWO_BOXES = "two 8-GPU boxes; `make tour TOUR_ARGS=group` runs a group's commands (test_tour.py)"
NOT_RUN_HERE = {
    "fleet plan qwen35-two-nodes": TWO_BOXES,
    "fleet deploy qwen35-two-nodes": TWO_BOXES,
    "fleet stop qwen35-two-nodes": TWO_BOXES,
    "fleet pull PLAYBOOK --host H": "the Hugging Face Hub; `make tour TOUR_ARGS=pull` pulls from a stand-in",
    "fleet cron install --heal": CRONTAB,
    'fleet cron install --schedule "* * * * *" --heal': CRONTAB,
    "fleet cron install --heal --deadline 900": CRONTAB,
    "fleet cron show": CRONTAB,
    "fleet cron remove": CRONTAB,
    "fleet cron": "the name of a command group, not a command",
    "fleet pull qwen36-27b --host ct129": "the Hugging Face Hub; `make tour TOUR_ARGS=pull` pulls from a stand-in",
    "fleet engine install sglang==0.5.23 --host blackwell": PACKAGE_INDEX,
    "fleet engine use sglang==0.5.23 --host blackwell": PACKAGE_INDEX,
    "fleet engine pull": "the name of a command without its image; tests/test_engine_images.py runs it",
    "fleet engine audit SPEC": "a local SGLang of the version; tests/test_audit.py runs it with the real one",
    "fleet engine audit sglang==0.5.23 --parser ~/sglang-0.5.23/bin/python": "a local SGLang 0.5.23; "
    "tests/test_audit.py runs it with the real one",
}
CODE_LINE = re.compile(r"^ {4,}(fleet [^#\n]*?)\s*(?:#.*)?$", re.M)
BACKTICKED = re.compile(r"`(fleet [^`]+)`")


def examples(page: Path) -> list[str]:
    """The page's commands in the order a reader meets them: code-block lines (any page), backticked
    commands (the README only: a guide's inline ones name commands, its code blocks show them)."""
    text = page.read_text()
    found = [(m.start(), m.group(1)) for m in CODE_LINE.finditer(text)]
    if page.name == "README.md":
        for m in BACKTICKED.finditer(text):
            found += [(m.start() + i, part.strip()) for i, part in enumerate(m.group(1).split(" / "))]
    commands = [" ".join(c.split()) for _, c in sorted(found)]
    return list(dict.fromkeys(commands))


PREPARED = {  # what a page takes as already done before its first command
    "health.md": [["deploy", "qwen36-27b", "--host", "blackwell"]],
    "startup.md": [["deploy", "qwen36-27b", "--host", "blackwell"]],
}


def filled(command: str, tmp: Path) -> list[str]:
    words = shlex.split(command)
    return [FILLED.get(w, str(tmp / Path(w).name) if w.startswith("/tmp/") else w) for w in words[1:]]


def followed_once(argv: list[str]) -> tuple[int, str]:
    """`fleet logs -f`: its first line, then Ctrl-C as a reader would press it."""
    follow = subprocess.Popen(
        [str(Path(sys.executable).parent / "fleet"), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    timer = threading.Timer(120, follow.kill)  # a follow that shows nothing must not hang the suite
    timer.start()
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        follow.send_signal(signal.SIGINT)
        follow.communicate(timeout=60)
    finally:
        timer.cancel()
    return (0 if first and follow.returncode == 130 else follow.returncode), first


@pytest.fixture
def reader(fleet_env: simhost.Sandbox, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("FLEET_SERVICES", str(ROOT / "services"))
    yield
    for cleanup in (["down", "qwen36"], ["pool", "stop"], ["stop", "--all"]):
        run_cli(*cleanup)


@pytest.mark.parametrize("page", [p for p in PAGES if examples(p)], ids=lambda p: p.name)
def test_every_command_a_page_shows_runs_on_the_simulated_fleet(page: Path, reader: None, tmp_path: Path) -> None:
    for argv in PREPARED.get(page.name, []):
        assert run_cli(*argv).code == 0
    for command in examples(page):
        if command in NOT_RUN_HERE:
            continue
        argv = filled(command, tmp_path)  # a file the page writes in /tmp: here in the test's own
        if "-f" in argv or "--follow" in argv:
            code, out = followed_once(argv)
        else:
            r = run_cli(*argv)
            code, out = r.code, r.out + r.err
        assert code == 0, f"{page.name}: `{command}` ({shlex.join(argv)}) exited {code}:\n{out[-2000:]}"


def test_every_command_not_run_here_is_still_shown_somewhere() -> None:
    shown = {c for page in PAGES for c in examples(page)}
    assert set(NOT_RUN_HERE) <= shown, set(NOT_RUN_HERE) - shown
