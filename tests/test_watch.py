"""The host-side watcher's pure parts, run here as a module: how it follows a log and bounds a match."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

from fleet.host.common import bounded_search
from fleet.host.watch import LogFollower


def test_each_line_carries_its_own_offset_so_a_resume_inside_a_batch_repeats_and_skips_nothing(
    tmp_path: Path,
) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"one\ntwo\nthree\nfour")  # the last line is still being written
    first = LogFollower(str(log), 0).read()[0]
    assert [t for _, t in first] == ["one", "two", "three"]
    for i, (offset, _) in enumerate(first):  # the connection dropped after line i was delivered
        resumed = LogFollower(str(log), offset)
        assert [t for _, t in resumed.read()[0]] == ["one", "two", "three"][i + 1 :]
    with log.open("ab") as f:
        f.write(b"\nfive\n")
    later = LogFollower(str(log), first[-1][0]).read()[0]
    assert [t for _, t in later] == ["four", "five"] and later[-1][0] == log.stat().st_size


def test_an_unterminated_last_line_is_delivered_once_the_process_ended(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"a\nKilled")
    follower = LogFollower(str(log), 0)
    assert [t for _, t in follower.read()[0]] == ["a"]
    assert follower.rest() == [(len(b"a\nKilled"), "Killed")]


def test_a_truncated_replaced_or_deleted_log_is_followed_and_reported(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"loading\nweights\n")
    follower = LogFollower(str(log), 0)
    follower.read()
    os.truncate(log, 0)
    log.write_bytes(b"again\n")
    lines, events = follower.read()
    assert events == [{"e": "log_reset", "why": "truncated"}] and [t for _, t in lines] == ["again"]
    log.unlink()
    assert follower.read() == ([], [{"e": "log_reset", "why": "deleted"}])
    assert follower.read() == ([], [])  # reported once
    log.write_bytes(b"new\n")
    lines, events = follower.read()
    assert [t for _, t in lines] == ["new"]
    replacement = tmp_path / "b.log"
    replacement.write_bytes(b"x\n")
    replacement.replace(log)
    lines, events = follower.read()
    assert events == [{"e": "log_reset", "why": "replaced"}] and [t for _, t in lines] == ["x"]


def test_a_log_truncated_and_written_past_the_old_offset_is_still_noticed(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"loading weights\n" * 3)
    follower = LogFollower(str(log), 0)
    follower.read()
    log.write_bytes(b"restarted: a much longer first line than before\n" * 2)  # cut to 0, then written again
    lines, events = follower.read()
    assert events == [{"e": "log_reset", "why": "truncated"}]
    assert [t for _, t in lines] == ["restarted: a much longer first line than before"] * 2


def test_a_log_replaced_by_a_fifo_never_blocks_the_watcher(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(b"x\n")
    follower = LogFollower(str(log), 0)
    follower.read()
    log.unlink()
    os.mkfifo(log)  # opening it for reading would wait for a writer forever
    start = time.monotonic()
    assert follower.read() == ([], [{"e": "log_reset", "why": "made unreadable (not a regular file)"}])
    assert time.monotonic() - start < 1


def test_a_catastrophic_pattern_is_stopped_and_leaves_no_process() -> None:
    assert bounded_search(r"\d+", "answer 42") is True
    assert bounded_search(r"^\d+$", "no") is False
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    before = set(children.read_text().split())
    start = time.monotonic()
    assert bounded_search(r"^(a|a)*b$", "a" * 40, limit_s=0.5) is None
    assert time.monotonic() - start < 3
    assert set(children.read_text().split()) <= before


def test_a_huge_line_is_cut_and_its_offsets_stay_exact(tmp_path: Path) -> None:
    """A 40 MB line (a config dump, a file of NULs): one line of LINE_LIMIT bytes and a note reaches fleet,
    the rest is skipped as it is read (never held), and the next line's offset is still exact."""
    from fleet.host.watch import LINE_LIMIT

    log = tmp_path / "a.log"
    with log.open("wb") as f:
        f.write(b"before\n" + b"x" * (40 << 20) + b"\nafter\n")
    follower = LogFollower(str(log), 0)
    got = []
    while True:
        lines = follower.read()[0]
        got += lines
        assert len(follower.pending) <= LINE_LIMIT  # what is held of the line in progress
        if any(t == "after" for _, t in lines):
            break
    texts = [t for _, t in got]
    assert texts[0] == "before" and texts[-1] == "after" and len(texts) == 3
    assert texts[1].startswith("x" * 100) and f"{(40 << 20) - LINE_LIMIT} more bytes" in texts[1]
    assert len(texts[1]) < LINE_LIMIT + 100
    assert got[-1][0] == log.stat().st_size and got[1][0] == 7 + (40 << 20) + 1


def test_output_fleet_does_not_read_is_bounded_and_then_called_a_stall() -> None:
    """A watcher whose fleet stopped reading keeps running: log lines past OUT_LIMIT are dropped and
    counted, other events kept, and the stall is seen (it blocked on its pipe for minutes, issue 39)."""
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from fleet.host import watch as rw\n"
        "for i in range(4000):\n"
        "    rw.emit({'e': 'line', 'o': i, 't': 'x' * 4000})\n"
        "rw.emit({'e': 'timeout', 'what': 'ready'})\n"
        "held = len(rw.OUT.pending)\n"
        "time.sleep(1.2)\n"
        "said = bytes(rw.OUT.pending)\n"
        "sys.stderr.write('%d %s %s %s' % (held, b'\"skipped\"' in said, rw.OUT.stalled(1.0), b'timeout' in said))\n"
    )
    # stdout is a pipe nobody reads: 64 KiB fit in it, the rest waits in the watcher
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stderr is not None
        err = child.stderr.read().decode()  # stdout stays unread until the child has said its piece
        child.wait(60)
    held, skipped, stalled, kept = err.split()
    from fleet.host.watch import OUT_LIMIT

    assert int(held) < OUT_LIMIT + (64 << 10) and skipped == stalled == kept == "True"


def test_the_end_of_a_log_sent_for_diagnosis_is_bounded_in_bytes(tmp_path: Path, monkeypatch: Any) -> None:
    """`fleet diagnose --host` of a log with one 300 MB line took 977 MB (tail -n sends whole lines): the
    host reads at most LOG_END_BYTES of the log's end, whatever its lines, and resumes after the last."""
    from fleet.host import logs as remote_logs

    log = tmp_path / "m-1.log"
    with log.open("wb") as f:
        f.write(b"x" * (3 << 20) + b"\nTraceback (most recent call last):\nRuntimeError: boom\n")
    monkeypatch.setattr(remote_logs, "LOG_END_BYTES", 1 << 20)
    texts, offset = remote_logs.last_lines(str(log), 5000)
    assert texts == ["Traceback (most recent call last):", "RuntimeError: boom"]  # the cut line is not shown
    assert offset == log.stat().st_size


def test_a_progress_bar_redrawn_in_one_unended_line_is_read_as_it_moves(tmp_path: Path) -> None:
    """tqdm writing to a file ends its line only when the bar closes: each redraw is seen as it comes,
    once, and the line itself is delivered whole when it ends."""
    log = tmp_path / "engine.log"
    log.write_bytes(b"[t TP0] Load weight begin.\n")
    follower = LogFollower(str(log), 0)
    assert [t for _, t in follower.read()[0]] == ["[t TP0] Load weight begin."] and follower.redrawn() is None
    bar = "\rLoading safetensors checkpoint shards:  {p}% Completed | {i}/4 [00:0{i}<00:03]"
    with log.open("ab") as f:
        for i in range(3):
            f.write(bar.format(p=i * 25, i=i).encode())
            f.flush()
            assert follower.read()[0] == []
            said = follower.redrawn()
            # the last redraw may be half written: the one before it is read (none before the second)
            assert said == (bar.format(p=(i - 1) * 25, i=i - 1)[1:] if i else None)
        assert follower.redrawn() is None  # nothing new: said once
        f.write(b"\rLoading safetensors checkpoint shards: 100% Completed | 4/4 [00:04<00:00]\n")
    whole = follower.read()[0]
    assert len(whole) == 1 and whole[0][1].endswith("4/4 [00:04<00:00]") and follower.redrawn() is None


def ended_attempt(
    tmp_path: Path, monkeypatch: Any, group_member: list[str]
) -> tuple[list[str], subprocess.Popen[bytes]]:
    """An attempt whose process has ended (its exit file written, its log's lines so far) while
    `group_member` still runs in its process group; the lines the watcher said of it."""
    import fleet.host.watch as watch

    log, exit_file = tmp_path / "a.log", tmp_path / "exit"
    log.write_bytes(b"main: exiting\n")
    exit_file.write_text("1\n")
    member = subprocess.Popen([sys.executable, "-c", *group_member, str(log)], start_new_session=True)
    threading.Thread(target=member.wait, daemon=True).start()  # reaped as init reaps the launcher's group
    said: list[dict[str, Any]] = []
    monkeypatch.setattr(watch, "emit", said.append)
    attempt = watch.AttemptWatch.__new__(watch.AttemptWatch)  # only what `exited` reads
    attempt.a = cast(Any, {"pgid": member.pid, "exit_file": str(exit_file)})
    attempt.log = LogFollower(str(log), 0)
    ended = attempt.exited()
    assert ended == {"e": "exit", "code": 1}
    return [str(e["t"]) for e in said if e["e"] == "line"], member


def test_the_lines_an_ended_attempts_group_writes_last_are_read_before_it_is_diagnosed(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A worker's traceback often lands after the main process ended: the watcher reads on until the whole
    group is gone (it once waited a fixed 50 ms, which this worker outlasts), not for a set time."""
    import fleet.host.watch as watch

    monkeypatch.setattr(watch, "LAST_LINES_S", 600.0)  # never reached: the group ends first
    late = "import sys, time; time.sleep(0.3); open(sys.argv[1], 'ab').write(b'TP1: Traceback (most recent call last)')"
    lines, _ = ended_attempt(tmp_path, monkeypatch, [late])
    assert lines == ["main: exiting", "TP1: Traceback (most recent call last)"]


def test_an_ended_attempts_group_that_lingers_is_given_a_bound_not_waited_for(tmp_path: Path, monkeypatch: Any) -> None:
    """A worker that never exits (stuck in a collective) does not hold the diagnosis back past the bound;
    what the log has by then is said."""
    import fleet.host.watch as watch

    monkeypatch.setattr(watch, "LAST_LINES_S", 0.2)
    lines, member = ended_attempt(tmp_path, monkeypatch, ["import time; time.sleep(600)"])
    try:
        assert lines == ["main: exiting"] and member.poll() is None
    finally:
        member.kill()


def test_a_lock_released_while_its_watcher_refreshes_it_stays_released(tmp_path: Path, monkeypatch: Any) -> None:
    """A group gave up while one rank's watcher refreshed the run's lock: the watcher read the lock, the
    release removed it, and the watcher wrote it back, so the host stayed locked with no run behind it
    (seen once in CI). Both now happen under the host's guard, one after the other."""
    import fleet.host.watch as watch
    from fleet.host.records import LOCK_FILE, RunLock, deployment_dir, write_record

    root = str(tmp_path)
    directory = deployment_dir(root, "m")
    os.makedirs(directory)
    path = os.path.join(directory, LOCK_FILE)
    write_record(path, {"run_id": "r", "holder_pid": 1})
    releases: list[threading.Thread] = []
    read = watch.read_record

    def read_then_release(p: str) -> Any:
        cur = read(p)
        release = threading.Thread(target=RunLock(directory, "r", release=True, guard_root=root).release_now)
        release.start()
        releases.append(release)
        release.join(1.0)  # unguarded, the release is done by now: between the watcher's read and its write
        return cur

    monkeypatch.setattr(watch, "read_record", read_then_release)
    watch.touch_lock({"state_dir": root, "deployment": "m", "run_id": "r"})  # type: ignore[typeddict-item]
    releases[0].join(10)
    assert not os.path.exists(path)


def test_a_start_that_is_up_before_its_health_is_asked_still_says_its_phases(tmp_path: Path, monkeypatch: Any) -> None:
    """The log is read, then /health is asked: an engine that writes the rest of its start (and answers)
    in between once had its phases read after it was called ready, so none was said. What the log gained
    meanwhile is read first; here the ready line is among it."""
    import fleet.host.watch as watch

    log = tmp_path / "attempt.log"
    log.write_text("[2026-12-06 18:56:17] server_args=ServerArgs(model_path='/m')\n")
    rest = (
        "[2026-12-06 18:56:18 TP0] Init torch distributed begin.\n"
        "[2026-12-06 18:56:18 TP0] Load weight begin. avail mem=47.99 GB\n"
        "[2026-12-06 18:56:18 TP0] KV Cache is allocated. #tokens: 139392, K size: 4.25 GB, V size: 4.25 GB\n"
        "[2026-12-06 18:56:18] The server is fired up and ready to roll!\n"
    )

    def health_answered_once_the_start_was_written(method: str, url: str, **kw: Any) -> tuple[int, str, float]:
        with log.open("a") as f:
            f.write(rest)
        return 200, "", 0.0

    said: list[dict[str, Any]] = []
    monkeypatch.setattr(watch, "emit", said.append)
    monkeypatch.setattr(watch, "http_request", health_answered_once_the_start_was_written)
    monkeypatch.setattr(watch, "alive_group", lambda pgid: True)
    monkeypatch.setattr(watch, "touch_lock", lambda a: None)  # no run's lock here
    request = {
        "log": str(log), "offset": 0, "exit_file": str(tmp_path / "exit"), "pgid": 1, "address": "127.0.0.1",
        "port": 30000, "ready_regex": "fired up and ready to roll", "state_dir": str(tmp_path / "state"),
        "ready_timeout_s": 600.0, "progress_timeout_s": 600.0, "health_timeout_s": 60.0,
    }  # fmt: skip
    attempt = watch.AttemptWatch(cast(Any, request), cast(Any, None))
    monkeypatch.setattr(attempt, "prove", lambda now: False)  # the smoke request comes next: not here
    now = time.time()
    assert not attempt.step(now)  # the first line
    assert not attempt.step(now + 1)  # nothing new: /health is asked, and the log read again first
    kinds = [e["e"] for e in said if e["e"] != "line"]
    phases = [e["phase"] for e in said if e["e"] == "phase"]
    assert phases == ["distributed", "weights", "kv_cache"] and kinds[-1] == "ready_line", said
    assert attempt.phase == "health"


def test_a_frozen_fleets_stop_leaves_a_group_that_took_the_attempts_id() -> None:
    """The attempt's group ended while fleet was frozen; its id is a pid and may be a new group's now:
    only the leader as launched (its start ticks), or a group with no leader left, is stopped."""
    from fleet.host.procs import start_ticks
    from fleet.host.watch import stop_attempt_group

    other = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a group that holds the id now
    try:
        ticks = start_ticks(other.pid)
        assert ticks is not None
        assert stop_attempt_group(other.pid, ticks + 1) == "0 processes"  # launched at another time: not ours
        assert other.poll() is None
        assert stop_attempt_group(other.pid, ticks) == "1 processes"  # the attempt's own leader: stopped
        assert other.wait(timeout=30) < 0
    finally:
        other.kill()
        other.wait()
