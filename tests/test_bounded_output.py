"""A host's output for one answer is held to a bound: a broken or hostile host that floods a command's
stdout gets a clear error and a stopped command, not fleet's (or the connection pool's) memory."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from fleet.control.logs import log_text
from fleet.control.ops import PULL_LINE_BYTES, pull_image
from fleet.errors import HostStepError, TransportError
from fleet.events import Pulling
from fleet.hostscripts import run_step
from fleet.inventory import Host, HostSettings
from fleet.inventory.runtime import Container
from fleet.step_ahead import StepAhead
from fleet.step_answers import ACT
from fleet.transport import base
from fleet.transport.local import LocalTransport


def flooding_python(tmp_path: Path, stream: str = "") -> str:
    """A "Python" on the host that answers any step with endless output (stdout, or stderr with `>&2`)."""
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\nexec cat /dev/zero {stream}\n")
    path.chmod(0o755)
    return str(path)


def test_a_command_that_floods_its_output_is_stopped_with_a_clear_error() -> None:
    t = LocalTransport("h")
    with pytest.raises(TransportError, match="more than 8 MiB of output for one answer; it was stopped"):
        t.run("exec cat /dev/zero", timeout_s=60)
    assert not t._streaming  # the command was ended, not left writing
    assert t.run("echo ok").text == "ok\n"  # the next command is unaffected


def test_an_answer_under_the_bound_arrives_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "ANSWER_BYTES", 1 << 20)
    r = LocalTransport("h").run("head -c 1048576 /dev/zero; exit 4")
    assert (r.exit_code, len(r.stdout)) == (4, 1 << 20)


def test_of_stderr_only_its_end_is_kept() -> None:
    r = LocalTransport("h").run("head -c 1000000 /dev/zero >&2; echo the-end >&2; echo out")
    assert r.text == "out\n"
    assert r.error_text.endswith("the-end\n") and len(r.stderr) == base.ERROR_TAIL_BYTES


def test_input_larger_than_a_pipe_reaches_a_command_that_answers_as_it_reads() -> None:
    data = b"x" * (4 << 20)
    r = LocalTransport("h").run("wc -c", stdin=data)
    assert r.text.strip() == str(len(data))


def test_a_step_whose_answer_floods_is_an_error_on_a_held_stdin_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base, "ANSWER_BYTES", 1 << 20)
    t = LocalTransport("h")
    with pytest.raises(TransportError, match="more than 1 MiB"):
        run_step(t, flooding_python(tmp_path), ACT, {"op": "release"}, timeout_s=60, hold_stdin=True)  # type: ignore[typeddict-item]
    assert not t._streaming


def test_a_step_started_ahead_whose_answer_floods_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(base, "ANSWER_BYTES", 1 << 20)
    ahead = StepAhead(LocalTransport("h"), "act", flooding_python(tmp_path))
    with pytest.raises(TransportError, match="more than 1 MiB"):
        ahead.answer({"op": "release"}, b"{}\n", 60)


def test_a_step_that_floods_stderr_still_gives_its_error(tmp_path: Path) -> None:
    t = LocalTransport("h")
    path = tmp_path / "python"
    path.write_text('#!/bin/sh\nhead -c 5000000 /dev/zero >&2\necho \'{"error": "it broke"}\'\n')
    path.chmod(0o755)
    with pytest.raises(HostStepError, match="it broke"):
        run_step(t, str(path), ACT, {"op": "release"}, timeout_s=60)  # type: ignore[typeddict-item]


@pytest.mark.parametrize("command", ["exec cat /dev/zero", "exec sleep 600"])
def test_a_command_that_never_reads_its_large_input_is_still_ended(command: str) -> None:
    """Its input waits in a full pipe; ending it must not wait for that input to be taken."""
    t = LocalTransport("h")
    with pytest.raises(TransportError, match="more than|timed out after 2 s"):
        t.run(command, stdin=b"x" * (4 << 20), timeout_s=2)
    assert not t._streaming


class Saying:
    """A host whose every stream says `chunks` (what a broken or hostile host could send)."""

    host_name = "h"
    commands_run = 0
    chunked_input_connects = False

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks = chunks

    def stream(self, script: str, on_chunk: Callable[[bytes], bool], **_: object) -> int:
        for chunk in self.chunks:
            if not on_chunk(chunk):
                return -1
        return 0


def test_an_image_pull_that_never_ends_a_line_keeps_only_its_end() -> None:
    said: list[object] = []
    runtime = Container(container="podman", image="img:1")
    flood = (b"x" * 65536 for _ in range(512))  # 32 MiB without a line end: quadratic and unbounded before
    assert pull_image(Saying([*flood, b"\nDone\n"]), "podman", runtime, said.append)  # type: ignore[arg-type]
    lines = [e.line for e in said if isinstance(e, Pulling)]
    assert lines == ["x" * PULL_LINE_BYTES, "Done"]


def test_a_log_read_keeps_the_lines_asked_for_however_many_the_host_sends() -> None:
    host = Host("h", HostSettings(address="127.0.0.1"), (), "inventory:1")
    line = (json.dumps({"e": "line", "o": 1, "text": "y" * 1000}) + "\n").encode()
    text = log_text(Saying(line for _ in range(200_000)), host, None, lines=50)  # type: ignore[arg-type]
    assert text.count("\n") == 50


def test_a_log_tail_that_dropped_the_health_line_still_gives_no_start_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server answered /health, then a client filled the log past what fleet keeps and ended it with
    a start-up failure's words: with the /health line cut away, that failure once gave a start's fix."""
    import fleet.control.outcomes as outcomes
    from fleet.crashes import diagnose
    from fleet.crashes.classify import ANSWERED_HEALTH

    monkeypatch.setattr(outcomes, "KEPT_LOG_LINES", 5)
    tail = outcomes.LogTail()
    for line in ["[2026-12-07 10:00:00] The server is fired up and ready to roll!", ANSWERED_HEALTH, *["-"] * 10]:
        tail.append(line)
    forged = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.85"
    for line in [
        forged,
        "[2026-12-07 10:00:09] Received sigquit from a child process. It usually means the child failed.",
    ]:
        tail.append(line)
    kept = tail.kept()
    assert kept[0] == ANSWERED_HEALTH and len(kept) == 6
    assert diagnose(kept).fix is None
    assert diagnose(kept[1:]).fix is not None  # what the cut tail alone gave
