"""Runs ON the host for `fleet logs`: the end of one or more deployments' server logs, then (with follow)
their new lines as written. Each deployment's `NAME.latest.log` link is watched: when a restart points it
at a new attempt's log, a `switch` event says so and that log is read from its start.

Everything is said as JSON events, one per line, so nothing a log contains can pass for fleet's own
marker: {"e": "log"|"switch", "d", "log"}, {"e": "line", "d", "text"}, {"e": "missing", "d"}, and
`skipped` when fleet read too slowly (lines dropped and counted, never held without bound).

Host code: standard library only, Python 3.8; runs after host/follow.py (LogFollower, OUT).
"""

from __future__ import annotations

import glob
import json
import os
import stat
import sys
from typing import List, Optional, Tuple, cast

try:
    LogFollower  # noqa: B018
except NameError:  # imported as a module (tests), not concatenated into the step
    from fleet.host.common import stdin_closed
    from fleet.host.follow import OUT, ClientGone, LogFollower, cut_line, emit
    from fleet.host.words import DEPLOYMENT_NAME_RE
    from fleet.protocol import LogsRequest

LOG_END_BYTES = 16 << 20  # of a log's end, at most this much is read for its last lines
FOLLOW_POLL_S = 0.25  # how often new lines and the links are looked at while following
LATEST = ".latest.log"


def newest_deployment(log_dir: str) -> Optional[str]:
    """The deployment whose latest-log link was made last (its most recent launch), or None."""
    made = []
    for link in glob.glob(os.path.join(glob.escape(log_dir), "*" + LATEST)):
        try:
            made.append((os.lstat(link).st_mtime, link))
        except OSError:  # gone since it was listed
            pass
    return os.path.basename(max(made)[1])[: -len(LATEST)] if made else None


def within(log_dir: str, target: str) -> bool:
    """Whether a latest-log link's target is a regular file in the log directory: a link that points
    elsewhere (/etc/passwd) is not a server log, whoever made it."""
    return os.path.dirname(target) == os.path.realpath(log_dir) and os.path.isfile(target)


def last_lines(path: str, lines: int) -> Tuple[List[str], int]:
    """The last `lines` whole lines of `path` (reading at most LOG_END_BYTES of its end), and the offset
    just past them, where following it goes on: a line still being written is read there, whole."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put in its place must not block the step
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return [], 0
        size = f.seek(0, 2)
        start = max(0, size - LOG_END_BYTES)
        f.seek(start)
        data = f.read(size - start)
    whole = data[: data.rfind(b"\n") + 1]
    parts = whole.split(b"\n")[:-1]
    if start > 0 and parts:
        parts = parts[1:]  # the line the cut began inside
    return [cut_line(p, len(p)) for p in parts[-lines:]], start + len(whole)


class FollowedLog:
    """One deployment's log: the attempt its link points at, read from where the last read ended."""

    def __init__(self, log_dir: str, name: str) -> None:
        self.name, self.log_dir = name, log_dir
        self.link = os.path.join(log_dir, name + LATEST)
        self.target = os.path.realpath(self.link)
        self.reader = LogFollower(self.target, 0)

    def poll(self) -> None:
        lines, events = self.reader.read()
        for event in events:  # truncated, replaced, deleted: said, then followed from its start
            emit({"e": "reset", "d": self.name, "why": str(event.get("why"))})
        for _end, text in lines:
            emit({"e": "line", "d": self.name, "text": text})
        target = os.path.realpath(self.link)
        if target != self.target and within(self.log_dir, target):  # a restart linked its new attempt's log
            for _end, text in self.reader.rest():  # what the old attempt wrote last, to its end
                emit({"e": "line", "d": self.name, "text": text})
            self.target, self.reader = target, LogFollower(target, 0)
            emit({"e": "switch", "d": self.name, "log": os.path.basename(target)})


def show_logs(a: LogsRequest) -> None:
    log_dir = os.path.expanduser(a["log_dir"])
    followed: List[FollowedLog] = []
    for asked in a["names"]:
        name = newest_deployment(log_dir) if asked is None else asked
        if name is None:  # the host's newest log was asked for, and it has none
            emit({"e": "missing", "d": None})
            continue
        if any(log.name == name for log in followed):
            continue
        # a name is never a path, and a link is followed into the log directory only
        log = FollowedLog(log_dir, name) if DEPLOYMENT_NAME_RE.match(name) else None
        if log is None or not within(log_dir, log.target):
            emit({"e": "missing", "d": name})
            continue
        try:
            texts, log.reader.offset = last_lines(log.target, int(a["lines"]))  # followed on from there
        except OSError:  # removed, or made a directory, since it was looked at
            emit({"e": "missing", "d": name})
            continue
        emit({"e": "log", "d": name, "log": os.path.basename(log.target)})
        if not a["follow"]:  # a last line still without its end counts as one, as tail counts it
            texts = (texts + [text for _end, text in log.reader.rest()])[-int(a["lines"]) :]
        for text in texts:
            emit({"e": "line", "d": name, "text": text})
        followed.append(log)
    while a["follow"] and followed and not stdin_closed():  # until fleet stops following
        for log in followed:
            log.poll()
        OUT.say_skipped()
        OUT.flush()
        OUT.wait(FOLLOW_POLL_S)


def run_logs() -> None:
    a = cast("LogsRequest", json.loads(sys.argv[1]))
    if not a["follow"]:  # the last lines are bounded already: all of them, however slowly fleet reads
        OUT.keep_every_line()
    try:
        show_logs(a)
        OUT.say_skipped()
        OUT.drain(30.0)
    except ClientGone:
        pass


if __name__ == "__main__":
    run_logs()
