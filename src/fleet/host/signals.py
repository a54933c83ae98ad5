"""Host code every step that stops processes shares: signal exactly the process fleet looked at, never one
that got its pid since, and never another user's. Prepended after fleet.host.procs when a step is sent
(fleet.hostscripts); standard library only, Python 3.8.

A pid is only a number, reused within seconds: a process fleet probed and chose to stop can exit during
the drain window and its pid go to another user's job, which a later SIGKILL by number would hit. So a
process is *held* first: a pidfd (Linux 5.3+) opened while /proc still shows the start time fleet probed
and the owner it expects. A pidfd names one process for good: after that process exits, signals through
it fail instead of reaching a newcomer. Where the kernel has no pidfds, the start time and owner are
checked again immediately before each signal (a window of microseconds instead of seconds). Process
groups are never signalled with killpg: a group can hold another user's process (root's setpgid can put
one there), so each member is held and checked on its own.
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import time
from typing import Any, Dict, List, Optional

try:  # the shared host code is prepended when this script is sent to a host
    start_ticks  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import readable
    from fleet.host.procs import process_table, start_ticks, uid_of

# Both syscalls were added after the per-architecture tables were unified: one number everywhere.
_SYS_PIDFD_SEND_SIGNAL = 424
_SYS_PIDFD_OPEN = 434


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _pidfd_open(pid: int) -> Optional[int]:
    """A pidfd for `pid`; None where the kernel or Python offers none. Raises ProcessLookupError if gone."""
    opener = getattr(os, "pidfd_open", None)
    try:
        if opener is not None:
            return int(opener(pid))
        fd = int(_libc().syscall(_SYS_PIDFD_OPEN, pid, 0))
        if fd >= 0:
            return fd
        raise OSError(ctypes.get_errno(), "pidfd_open")
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise ProcessLookupError(pid) from None
        return None  # ENOSYS (kernel < 5.3), EPERM in a sandbox: the start-time check alone


def _pidfd_send(fd: int, sig: int) -> None:
    sender = getattr(__import__("signal"), "pidfd_send_signal", None)
    if sender is not None:
        sender(fd, sig)
        return
    if int(_libc().syscall(_SYS_PIDFD_SEND_SIGNAL, fd, sig, None, 0)) < 0:
        code = ctypes.get_errno()
        raise ProcessLookupError() if code == errno.ESRCH else OSError(code, os.strerror(code))


class Held:
    """One process fleet decided to signal, pinned to its identity (pid + start time, and a pidfd)."""

    def __init__(self, pid: int, ticks: int, uid: Optional[int], fd: Optional[int]) -> None:
        self.pid, self.ticks, self.uid, self.fd = pid, ticks, uid, fd

    def _same(self) -> bool:
        return start_ticks(self.pid) == self.ticks and (self.uid is None or uid_of(self.pid) == self.uid)

    def alive(self) -> bool:
        """Still running: a pidfd is readable once its process has exited (a zombie has)."""
        if self.fd is not None:
            try:
                return not readable(self.fd, 0)
            except (OSError, ValueError):
                return False
        if not self._same():
            return False
        try:
            with open("/proc/%d/stat" % self.pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    def send(self, sig: int) -> bool:
        """Signal this process, and only it: False when it has exited (a zombie still takes signals, and
        would count as stopped by force) or is gone (or its pid is another's now)."""
        if not self.alive():
            return False
        try:
            if self.fd is not None:
                _pidfd_send(self.fd, sig)
                return True
            if not self._same():
                return False
            os.kill(self.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def hold_process(pid: int, ticks: Optional[int], uid: Optional[int] = None) -> Optional[Held]:
    """The process `pid` as probed (started at `ticks`, owned by `uid` when given), held; None when it is
    gone or is not that process any more. The identity is checked after the pidfd is open, so the pidfd
    is known to name the probed process, not one that took its pid in between."""
    if ticks is None:
        return None
    try:
        fd = _pidfd_open(pid)
    except ProcessLookupError:
        return None
    held = Held(pid, ticks, uid, fd)
    if not held._same():
        held.close()
        return None
    return held


def hold_group(pgid: int, uid: int, skip: Any = None) -> Dict[int, Held]:
    """The members of process group `pgid` owned by `uid`, held (a member for which `skip(proc)` is true,
    or of another user, is left out: it is never signalled as part of the group)."""
    out: Dict[int, Held] = {}
    for p in process_table().values():
        if p["pgid"] != pgid or p["uid"] != uid or p.get("state") == "Z" or (skip is not None and skip(p)):
            continue
        held = hold_process(p["pid"], p["start_ticks"], uid)
        if held is not None:
            out[p["pid"]] = held
    return out


def still_in(pgid: int, read: Dict[int, Optional[int]]) -> bool:
    """Whether one of the processes fleet read in group `pgid` (`read`: pid -> start ticks) is still
    there, and in it: the group fleet read lives on, and keeps its id from reuse."""
    for pid, ticks in read.items():
        try:
            # its start is read again after its group: the group read was this process's, not a newcomer's
            if (
                ticks is not None
                and start_ticks(pid) == ticks
                and os.getpgid(pid) == pgid
                and start_ticks(pid) == ticks
            ):
                return True
        except OSError:
            continue
    return False


def hold_same_group(pgid: int, read: Dict[int, Optional[int]], uid: int, skip: Any = None) -> Dict[int, Held]:
    """hold_group, while `pgid` still names the group fleet read (`read`: its members then, pid -> start
    ticks), else nothing. A group's id is its leader's pid: once every member fleet read is gone, a new
    process may have the pid and lead a group of its own, and nothing tells the two apart (a leader gone
    proves nothing either). Asked again after the members are held: the id named fleet's group when
    they were."""
    if not still_in(pgid, read):
        return {}
    members = hold_group(pgid, uid, skip)
    if still_in(pgid, read):
        return members
    release(members)
    return {}


def foreign_members(pgid: int, uid: int) -> List[int]:
    """Pids in group `pgid` of another user than `uid`: left running, and named."""
    return sorted(p["pid"] for p in process_table().values() if p["pgid"] == pgid and p["uid"] != uid)


def wait_ended(held: Any, until: float) -> None:
    """Until every held process has exited, or `until` (a time.time()). A pidfd becomes readable the
    moment its process ends, so the wait ends then too, not at the next tick of a poll loop; a process
    held without a pidfd is looked at every 10 ms."""
    waiting = [h for h in (held.values() if isinstance(held, dict) else held) if h is not None]
    while True:
        waiting = [h for h in waiting if h.alive()]
        left = until - time.time()
        if not waiting or left <= 0:
            return
        if any(h.fd is None for h in waiting):
            time.sleep(min(0.01, left))
            continue
        poller = select.poll()  # not select: a stop may hold pidfds past descriptor 1023
        for h in waiting:
            poller.register(h.fd, select.POLLIN)
        poller.poll(max(1, int(left * 1000)))


def release(held: Any) -> None:
    for h in list(held.values()) if isinstance(held, dict) else list(held):
        if h is not None:
            h.close()
