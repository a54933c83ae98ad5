"""The host-side watcher's pure parts, run here as a module: how it follows a log and bounds a match."""

from __future__ import annotations

import os
import time
from pathlib import Path

from fleet.control.remote_watch import LogFollower
from fleet.host_common import bounded_search


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
