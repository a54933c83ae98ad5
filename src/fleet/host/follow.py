"""Runs ON the host inside the watch step (fleet.hostscripts): what the watcher reads and says. The
attempt's log followed from a byte offset (truncation, replacement and deletion noticed; a progress bar
redrawn inside one unended line read as it moves), and the watcher's own output, which never blocks on a
fleet that stopped reading.

Host code: standard library only, Python 3.8.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import stat
import sys
import time
from typing import IO, Any, Dict, List, Mapping, Optional, Tuple

try:  # fleet.protocol is prepended when this script is sent to a host
    CUT_NOTE  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.words import CUT_NOTE

LINE_LIMIT = 16 << 10  # bytes of one log line sent (a 300 MB line of a config dump is cut, not carried)
OUT_LIMIT = 4 << 20  # bytes of log lines waiting for fleet to read them: past it, lines are dropped and counted
STALLED_S = 30.0  # fleet read nothing for this long while output waited: it is frozen (stopped, swapped out)


class ClientGone(Exception):
    """fleet's end of the channel is closed: nobody reads what this watcher says any more."""


class Output:
    """This watcher's stdout, never blocking: a fleet that stops reading (frozen with SIGSTOP, a stalled
    connection) must not stop the watcher, which keeps the deadlines and the lock. Log lines beyond
    OUT_LIMIT waiting are dropped and counted (said in a `skipped` event); every other event is kept."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.lines_held = 0  # bytes of log lines in `pending`
        self.skipped = 0
        self.last_write = time.time()
        self.nonblocking = False
        self.may_drop = True  # False: every line is kept, and a write waits for fleet (a bounded read)

    def keep_every_line(self) -> None:
        """Write through, waiting for fleet: for output that is bounded already (a log's last lines)."""
        self.may_drop, self.nonblocking = False, True

    def say_skipped(self) -> None:
        """Say how many lines were dropped since it was last said, if any (a quiet log says it now)."""
        if self.skipped:
            self.pending += (json.dumps({"e": "skipped", "lines": self.skipped}) + "\n").encode()
            self.skipped = 0
            self.flush()

    def _nonblocking(self) -> None:
        if not self.nonblocking:
            try:
                fd = sys.stdout.fileno()
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
            except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
                pass
            self.nonblocking = True

    def emit(self, obj: Mapping[str, object]) -> None:
        self._nonblocking()
        line = obj.get("e") == "line"
        if line and self.may_drop and self.lines_held > OUT_LIMIT:
            self.skipped += 1
            return
        if not line:
            self.say_skipped()
        data = (json.dumps(obj) + "\n").encode()
        self.pending += data
        if line:
            self.lines_held += len(data)
        self.flush()

    def flush(self) -> None:
        try:
            fd = sys.stdout.fileno()
        except (ValueError, AttributeError):  # a test's capture: written through, no descriptor
            sys.stdout.write(self.pending.decode())
            sys.stdout.flush()
            self.pending, self.lines_held = bytearray(), 0
            return
        while self.pending:
            try:
                n = os.write(fd, bytes(self.pending[: 1 << 16]))
            except BlockingIOError:
                return
            except (BrokenPipeError, OSError) as exc:
                raise ClientGone() from exc
            del self.pending[:n]
            self.lines_held = max(0, self.lines_held - n)
            self.last_write = time.time()
        self.last_write = time.time()

    def wait(self, timeout_s: float) -> None:
        """Let `timeout_s` pass, writing what waits as fleet reads it: a reader catching up after a pause
        gets the backlog at the connection's pace, not one pipe-full per wait."""
        deadline = time.monotonic() + timeout_s  # not the wall clock: a clock stepped back must not stall it
        while self.pending and time.monotonic() < deadline:
            try:
                poller = select.poll()
                poller.register(sys.stdout.fileno(), select.POLLOUT)
            except (ValueError, AttributeError):  # a test's capture: written through already
                break
            if poller.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                self.flush()  # room to write (or fleet gone: ClientGone)
        time.sleep(max(0.0, deadline - time.monotonic()))

    def stalled(self, after_s: float = STALLED_S) -> bool:
        """Output has waited `after_s` with nothing read: fleet is not listening, though it is connected."""
        return bool(self.pending) and time.time() - self.last_write > after_s

    def drain(self, timeout_s: float) -> bool:
        """Wait (up to timeout_s) until fleet has read everything; False when it did not."""
        deadline = time.time() + timeout_s
        while self.pending and time.time() < deadline:
            self.flush()
            time.sleep(0.05)
        return not self.pending


OUT = Output()


def emit(obj: Mapping[str, object]) -> None:
    OUT.emit(obj)


def cut_line(raw: bytes, size: int) -> str:
    """A log line of `size` bytes, of which `raw` was read, as it is sent: its first LINE_LIMIT bytes,
    then how many more there were."""
    text = raw[:LINE_LIMIT].decode("utf-8", "replace")
    return text + CUT_NOTE % (size - LINE_LIMIT) if size > LINE_LIMIT else text


class LogFollower:
    """Reads new lines of the attempt's log from a byte offset; a log that is truncated, replaced or
    deleted is followed (offset reset, reported) instead of silently read from the wrong place."""

    TAIL = 64  # bytes before the offset remembered: a log cut and written again past the offset differs there

    def __init__(self, path: str, offset: int) -> None:
        self.path, self.offset, self.pending, self.missing = path, offset, b"", False
        self.cut = 0  # bytes of the unterminated line past LINE_LIMIT, skipped
        self.inode: Optional[int] = None
        self.tail = b""
        self.redraws = 0  # carriage returns seen in the unterminated line (a progress bar redrawing itself)

    def read(self) -> Tuple[List[Tuple[int, str]], List[Dict[str, Any]]]:
        """(complete lines as (end offset, text), events about the file)."""
        events: List[Dict[str, Any]] = []
        try:
            # a FIFO put in its place must not block; a link put there must not lead out of the log directory
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise OSError("not a regular file")
                if self.inode is not None and st.st_ino != self.inode:
                    events.append({"e": "log_reset", "why": "replaced"})
                    self.offset, self.pending, self.tail, self.cut = 0, b"", b"", 0
                elif st.st_size < self.offset or not self._same_tail(f):
                    events.append({"e": "log_reset", "why": "truncated"})
                    self.offset, self.pending, self.tail, self.cut = 0, b"", b"", 0
                self.inode, self.missing = st.st_ino, False
                f.seek(self.offset)
                chunk = f.read(1 << 20)
        except OSError as exc:
            if not self.missing:
                why = "deleted" if isinstance(exc, FileNotFoundError) else "made unreadable (%s)" % exc
                events.append({"e": "log_reset", "why": why})
                self.missing = True
            return [], events
        return self._lines(chunk), events

    def _same_tail(self, f: IO[bytes]) -> bool:
        """Whether the bytes just before the offset are still those read there (a truncated log that was
        already written past the old offset again is longer, not shorter)."""
        if not self.tail:
            return True
        f.seek(self.offset - len(self.tail))
        return f.read(len(self.tail)) == self.tail

    def _lines(self, chunk: bytes, final: bool = False) -> List[Tuple[int, str]]:
        """Whole lines, each cut to LINE_LIMIT bytes; a line without an end is held only up to LINE_LIMIT
        (what comes after, to its end, is skipped: a 300 MB line costs no memory here or in fleet)."""
        self.tail = (self.tail + chunk)[-self.TAIL :]
        base = self.offset - len(self.pending) - self.cut
        self.offset += len(chunk)
        data = self.pending + chunk
        *whole, rest = data.split(b"\n")
        out = []
        for i, raw in enumerate(whole):
            size = len(raw) + (self.cut if i == 0 else 0)
            base += size + 1
            out.append((min(base, self.offset), cut_line(raw, size)))
        if whole:
            self.cut, self.redraws = 0, 0
        if len(rest) > LINE_LIMIT:
            self.cut += len(rest) - LINE_LIMIT
            rest = rest[:LINE_LIMIT]
        self.pending = rest
        if final and self.pending:
            out.append((self.offset, self.pending.decode("utf-8", "replace")))
            self.pending, self.cut = b"", 0
        return out

    def redrawn(self) -> Optional[str]:
        """The last whole redraw of a progress bar in the line not yet ended, when it redrew since the last
        call; else None. tqdm, writing to a file, ends its line only when the bar closes: a 5-minute load
        is one line, and without this the watcher would see neither its progress nor that it moves."""
        redraws = self.pending.count(b"\r")
        if redraws <= self.redraws:
            return None
        self.redraws = redraws
        whole = [part for part in self.pending.split(b"\r")[:-1] if part.strip()]  # the last may be half written
        return whole[-1].decode("utf-8", "replace") if whole else None

    def rest(self) -> List[Tuple[int, str]]:
        """Every line left, the unterminated last one included (the process has ended)."""
        lines, _ = self.read()
        return lines + self._lines(b"", final=True)
