"""The deploy's progress events: every kind is JSON-ready and has a line on the terminal."""

from __future__ import annotations

import io
import json
import typing
from typing import Any

import pytest

from fleet import events
from fleet.cli.report import Reporter

SAMPLES: list[events.Event] = [
    events.Planned("Qwen3.6-27B (dense, 27B)", ["python", "-m", "sglang.launch_server"], ["sglang-x"]),
    events.Adopted(4242, ["health: ok", "smoke: ok"]),
    events.NotAdopted(["smoke: wrong answer"]),
    events.EngineCheckSkipped("sglang 0.5.11"),
    events.AttemptStarted(1, 3, ["python", "-m", "sglang.launch_server"]),
    events.LockTakenOver({"owner": "ana@laptop", "command": "deploy"}),
    events.EngineChecked("accepted"),
    events.Replanned({"MoE runner": "flashinfer_cutlass"}, ["--moe-runner-backend", "flashinfer_cutlass"], []),
    events.Stopped(
        [{"pid": 7, "pgid": 7, "cmdline": "python -m sglang.launch_server", "why": "fleet's server", "user": "u"}],
        [{"pid": 9, "why": "GPU daemon nvidia-persistenced", "user": "root"}],
        {"before_mib": [1024], "after_mib": [0], "waited_s": 0.5},
    ),
    events.WeightCache(False, "no daemon of this deployment runs", 4242, "/var/log/fleet/a~weight-cache-1.log"),
    events.Launched(4243, "/var/log/fleet/a.log"),
    events.LogLine("Load weight begin"),
    events.Pulling("lmsysorg/sglang:v0.5.11-cu129", "Copying blob sha256:4f4fb700ef54 done"),
    events.ModelPullPlanned("/models/Qwen3.6-27B", "0123456789abcdef" * 2 + "01234567", 15, 55 << 30, 0, 900 << 30),
    events.ModelPullProgress(10 << 30, 55 << 30, 120e6, 402.0),
    events.StartupPhase("graphs", 72.0, 8, 23, 41.0, 29.0, 3),
    events.StartupStalled("graphs", 95.0, 87.0, 29.0, 900.0),
    events.LogReset("truncated", "/var/log/fleet/a.log"),
    events.Reconnecting(1234),
    events.Diagnosed(
        1,
        "crashed",
        {"category": "oom", "signature": "sglang-kv", "explanation": "too little KV", "evidence": ["RuntimeError"]},
    ),
    events.Relaunching(2, 3, "sglang-kv", "memory fraction +0.04", "too little KV", 3.5, False),
    events.Ready(1, {"e": "smoke", "ok": True, "text": "Paris"}),
    events.ServiceStep("qwen36", "registered http://10.0.0.7:30000", "ct129/qwen36-1"),
]


def test_the_samples_cover_every_kind_of_event() -> None:
    assert {type(e) for e in SAMPLES} == set(typing.get_args(events.Event))
    assert len({e.kind for e in SAMPLES}) == len(SAMPLES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_every_event_is_one_json_line_with_its_kind_and_host(event: events.Event) -> None:
    out = io.StringIO()
    events.JsonLines("blackwell", out)(event)
    line = json.loads(out.getvalue())
    assert out.getvalue().count("\n") == 1
    assert line["event"] == event.kind and line["host"] == "blackwell" and line["elapsed_s"] >= 0


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_every_event_has_a_line_on_the_terminal(event: events.Event, capsys: pytest.CaptureFixture[str]) -> None:
    Reporter("blackwell", show_log=True)(event)
    assert capsys.readouterr().err.startswith(("blackwell: ", "  | "))


def test_a_start_up_phase_is_said_once_with_its_eta_and_none_is_made_up_on_a_first_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = Reporter("blackwell")
    report(events.StartupPhase("weights", 2.0))
    report(events.StartupPhase("weights", 9.0, 1, 9))  # progress: the live line only, on a terminal
    report(events.StartupPhase("graphs", 72.0, None, None, 131.0, 29.0, 3))
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "blackwell: start-up: loading weights — no ETA yet: the first start of this model, engine version and "
        "GPUs on this host",
        "blackwell: start-up: capturing CUDA graphs — ready in about 2m11s (from 3 earlier starts here)",
    ]


def test_a_stall_waited_through_says_how_long_against_what_and_until_when(capsys: pytest.CaptureFixture[str]) -> None:
    Reporter("blackwell")(events.StartupStalled("graphs", 95.0, 87.0, 29.0, 900.0))
    Reporter("blackwell")(events.StartupStalled("weights", 620.0, 600.0, None, 1800.0))
    assert capsys.readouterr().err.splitlines() == [
        "blackwell: start-up: capturing CUDA graphs quiet for 1m35s (stall bound 1m27s, usually 29s here); waiting on "
        "as the playbook says (on_stall: wait), up to ready_timeout_s 15m00s",
        "blackwell: start-up: loading weights quiet for 10m20s (stall bound 10m00s, no history here); waiting on as "
        "the playbook says (on_stall: wait), up to ready_timeout_s 30m00s",
    ]


def test_status_says_a_starting_servers_phase_its_progress_and_when_it_should_be_ready() -> None:
    from fleet.cli.report import starting_text

    now = {"phase": "graphs", "title": "capturing CUDA graphs", "elapsed_s": 130.0, "in_phase_s": 12.0, "done": 8,
           "of": 23, "eta_s": 41.0, "starts": 3}  # fmt: skip
    assert starting_text(now) == (
        "start-up: capturing CUDA graphs 8/23 for 12s (2m10s since launch); ready in about 41s (from 3 earlier "
        "starts here)"
    )
    first = {**now, "eta_s": None, "starts": 0, "of": None}
    assert starting_text(first).endswith(
        "no ETA yet: the first start of this model, engine version and GPUs on this host"
    )


def test_a_phase_name_from_the_host_reaches_the_terminal_without_its_escape_sequences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    Reporter("blackwell")(events.StartupPhase("weights\x1b]0;pwned\x07\x1b[2J", 1.0))
    err = capsys.readouterr().err
    assert "weights" in err and "\x1b" not in err and "\x07" not in err


def test_a_shown_log_gets_no_made_up_lines_for_a_phases_progress(capsys: pytest.CaptureFixture[str]) -> None:
    report = Reporter("blackwell", show_log=True)
    report(events.StartupPhase("weights", 2.0))
    report(events.StartupPhase("weights", 9.0, 1, 9))  # the engine's own progress line is in the log
    assert capsys.readouterr().err.count("\n") == 1


def test_fanout_sends_each_event_to_every_listener_in_order() -> None:
    a: list[events.Event] = []
    b: list[events.Event] = []
    send = events.fanout(a.append, b.append)
    for e in SAMPLES[:3]:
        send(e)
    assert a == b == SAMPLES[:3]


def test_nobody_reading_the_json_progress_does_not_stop_the_deploy() -> None:
    closed = io.StringIO()
    closed.close()  # like stderr piped into `head -1`, gone
    send = events.JsonLines("blackwell", closed)
    send(SAMPLES[0])
    send(SAMPLES[1])  # no exception: the deploy goes on


def test_the_structured_log_on_a_terminal_gets_no_escape_sequences_from_the_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleet import log

    log.configure(verbose=True)
    try:
        events.logged("blackwell")(events.LogLine("ok \x1b]0;pwned\x07\x1b[2J done"))
        events.logged("blackwell")(events.Launched(7, "/logs/a\x1b[31m.log"))
    finally:
        log.configure(verbose=False)
    err = capsys.readouterr().err
    assert "ok  done" in err and "\x1b]" not in err and "\x1b[2J" not in err and "\x1b[31m" not in err


def test_a_detached_sink_never_blocks_and_counts_the_log_lines_it_could_not_show() -> None:
    """A terminal that does not read holds up only the thread that writes to it: the caller goes on, log
    lines past the limit are dropped and counted, every other event is delivered, in order, by close()."""
    import threading

    from fleet import events

    reading = threading.Event()
    shown: list[events.Event] = []

    def terminal(event: events.Event) -> None:
        reading.wait()
        shown.append(event)

    sink = events.Detached(terminal, limit=3)
    for i in range(10):
        sink(events.LogLine(f"line {i}"))  # returns at once, although nothing is shown
    sink(events.Launched(7, "/log"))
    reading.set()
    sink.close()
    lines = [e.line for e in shown if isinstance(e, events.LogLine)]
    assert lines[:3] == ["line 0", "line 1", "line 2"] and len(lines) <= 5
    assert any(line.startswith("[fleet] ") and "not shown: the terminal was not reading" in line for line in lines)
    assert isinstance(shown[-1], events.Launched)
    sink(events.LogLine("after"))  # closed: delivered at once
    assert shown[-1] == events.LogLine("after")


def terminal() -> tuple[Any, io.StringIO]:
    """A board drawn on a terminal that is a string (rich's Live, as a real terminal gets it)."""
    from rich.console import Console

    from fleet.cli.live import LiveBoard

    out = io.StringIO()
    return LiveBoard(Console(file=out, force_terminal=True, width=160, color_system=None)), out


def test_a_terminal_gets_a_live_line_with_the_phase_its_bar_and_eta_and_the_engines_last_line() -> None:
    board, out = terminal()
    report = Reporter("ct129", board=board)
    report(events.Launched(pid=7, log="/l/q.log"))
    assert board.live is not None  # drawn from the launch on
    report(events.LogLine("[2026-12-04 10:00:00 TP0] Capture cuda graph begin."))
    report(events.StartupPhase("graphs", 72.0, 8, 23, 41.0, 29.0, 3))
    report(events.LogLine("Capturing batches (bs=8 avail_mem=1 GB): 35% 8/23 \x1b]0;pwned\x07"))
    board.live.refresh()  # type: ignore[union-attr]
    shown = out.getvalue()
    assert "ct129: start-up: capturing CUDA graphs 8/23 — ready in about 41s (from 3 earlier starts here)" in shown
    assert "ct129 [1/1" in shown and "capturing CUDA graphs" in shown and "8/23" in shown and "left" in shown
    assert "━" in shown  # rich's progress bar
    assert "Capturing batches (bs=8" in shown and "\x1b]0;" not in shown and "\x07" not in shown
    report.close()
    assert board.live is None  # gone with the deploy; what was said stays
    report(events.Relaunching(2, 4, "cuda-graph-oom", "a smaller capture", "", 9.0, False))  # printed as usual


def test_a_pull_on_a_terminal_is_a_live_bar_and_in_a_pipe_a_line_each_tenth(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from fleet.cli.provision import ProgressLines

    planned = events.ModelPullPlanned("/models/q", "c0ffee" * 7, 5, 10 << 30, 0, 50 << 30)
    board, out = terminal()
    pull = ProgressLines("ct129")
    pull.board, pull.row = board, board.row("ct129")
    pull(planned)
    for done in (1 << 30, 2 << 30, 4 << 30):
        pull(events.ModelPullProgress(done, 10 << 30, 200 << 20, 30.0))
    board.live.refresh()  # type: ignore[union-attr]
    drawn = out.getvalue()
    said = capsys.readouterr().err  # before the bar was drawn: printed as any line
    assert said.startswith("ct129: pulling commit c0ffeec0ffee to /models/q: 5 files, 10.0 GiB")
    assert "ct129 [" in drawn and "[1/1" not in drawn and "pulling" in drawn and "━" in drawn
    assert "40% 4.0 GiB of 10.0 GiB, 200.0 MiB/s" in drawn
    assert "~30s left" in drawn and "10% 1.0 GiB" not in drawn  # no line per tenth on a terminal
    pull.close()
    assert board.live is None
    piped = ProgressLines("ct129")  # pytest's stderr is no terminal: lines, as a log file gets them
    assert piped.board is None
    piped(planned)
    for done in (1 << 30, 1 << 30, 2 << 30):
        piped(events.ModelPullProgress(done, 10 << 30, 200 << 20, 30.0))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[1][:3] for line in lines[1:]] == ["10%", "20%"]  # each tenth once


def test_several_deploys_share_one_display_until_the_last_ends() -> None:
    board, out = terminal()
    a, b = Reporter("node-a", board=board), Reporter("node-b", board=board)
    a(events.Launched(pid=7, log="/l/a.log"))
    b(events.Launched(pid=8, log="/l/b.log"))
    assert [r.host for r in board.rows] == ["node-a", "node-b"]
    board.live.refresh()  # type: ignore[union-attr]
    assert "node-a [1/1" in out.getvalue() and "node-b [1/1" in out.getvalue()
    a.close()
    assert board.live is not None and [r.host for r in board.rows] == ["node-b"]
    b.close()
    assert board.live is None


def test_no_live_display_without_a_terminal_or_with_the_log_shown(capsys: pytest.CaptureFixture[str]) -> None:
    board, _ = terminal()
    shown = Reporter("ct129", show_log=True, board=board)
    shown(events.Launched(pid=7, log="/l/q.log"))
    shown(events.LogLine("hello"))
    assert board.live is None and "  | hello" in capsys.readouterr().err
    assert Reporter("ct129").board is None  # pytest's stderr is not a terminal: plain lines, as in a log file


def test_a_run_whose_stderr_is_no_terminal_never_loads_the_terminal_ui() -> None:
    """rich's console is ~60 ms of a command's start: cron, a pipe and CI pay none of it; a stream told to
    be taken for a terminal (FORCE_COLOR, TTY_COMPATIBLE) is left to rich to decide."""
    import os
    import subprocess
    import sys

    from fleet.cli.report import may_be_terminal

    code = "import sys; from fleet.cli.report import Reporter; Reporter('h'); print('rich' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert ran.stdout.strip() == "False"
    assert not may_be_terminal(io.StringIO())
    closed = io.StringIO()
    closed.close()
    assert not may_be_terminal(closed)


def test_a_stream_told_to_look_like_a_terminal_is_asked_of_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.cli.report import may_be_terminal

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
        monkeypatch.setenv(name, "1")
        assert may_be_terminal(io.StringIO())


def test_fleet_exiting_takes_the_display_down_and_nothing_draws_it_again() -> None:
    board, _ = terminal()
    report = Reporter("ct129", board=board)
    report(events.Launched(pid=7, log="/l/q.log"))
    board.end()  # atexit: Ctrl-C or an error while a deploy ran
    report(events.LogLine("a late line"))  # delivered by the progress thread after that
    assert board.live is None and not board.rows
