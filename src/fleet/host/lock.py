"""Runs ON the host as part of fleet's act step (sent after host/free.py, before host/act.py): the
deployment's lock, and what the host's other deployments hold -- checked here, under one host-wide
guard (a flock), so two runs placing deployments at once cannot both take a GPU or a port.

Layout: state_dir/lock.guard (the guard), state_dir/deployments/NAME/lock.json (a deployment's lock);
an older fleet's one-server records in state_dir itself are moved into their deployment's directory
the first time a lock is taken (host_records.migrate_legacy).

Host code: standard library only, Python 3.8.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, cast

try:  # the shared host code is prepended when this script is sent to a host
    recorded_groups  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.free import expand, recorded_group, recorded_groups
    from fleet.host.procs import alive, live_process_groups, started_as, still_runs
    from fleet.host.records import (
        LOCK_FILE,
        STATE_FILE,
        change_status,
        deployment_dir,
        deployment_names,
        migrate_legacy,
        open_guard,
        owned,
        peek_record,
        read_record,
        record_gpus,
        record_ports,
        release_lock,
        unsafe_state_dir,
        write_record,
        written_by_newer,
    )
    from fleet.host.words import STOPPED
    from fleet.protocol import ForgetResult, LockRequest, LockResult, StateRecord


def take_lock(a: LockRequest) -> LockResult:
    """The deployment's lock, taken under the host's guard (one flock for all deployments: placing
    one and checking the others' GPUs is then one step no other run interleaves with)."""
    root = expand(a["state_dir"])
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        unsafe = unsafe_state_dir(root)
        if unsafe:  # another user could plant records naming what fleet stops
            return {"status": "unwritable", "path": root, "error": unsafe}
        guard = open_guard(root)
    except OSError as exc:  # the first write of a run: nothing has been changed yet
        return {"status": "unwritable", "path": root, "error": exc.strerror or str(exc)}
    with guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        # an older fleet's run, still going, holds the one lock it knew; one it left behind is removed
        legacy_lock = os.path.join(root, LOCK_FILE)
        held = held_by_another(legacy_lock, a)
        if held is not None:
            return held
        if os.path.exists(legacy_lock):
            release_lock(root, (read_record(legacy_lock) or {}).get("run_id", ""))
        try:
            migrate_legacy(root)
            directory = deployment_dir(root, a["deployment"])
            if os.path.lexists(directory) and not owned(directory, stat.S_ISDIR):
                why = "not a directory of this user's that only they may write (a link, or another's)"
                return {"status": "unwritable", "path": directory, "error": why}
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            return {"status": "unwritable", "path": root, "error": exc.strerror or str(exc)}
        path = os.path.join(directory, LOCK_FILE)
        held = held_by_another(path, a)
        if held is not None:
            return held
        overlap = overlapping(root, a)
        if overlap:
            return {"status": "overlap", "overlap": overlap}
        cur = read_record(path)
        taken_over = cur if cur is not None and cur.get("run_id") != a["run_id"] else None
        if cur is None or cur.get("run_id") != a["run_id"]:
            cur = {"run_id": a["run_id"], "owner": a["owner"], "since": time.time(), "command": a.get("command")}
        if a.get("places"):
            cur["gpus"], cur["ports"] = record_gpus(a), record_ports(a)
        cur["holder_pid"] = os.getpid()
        cur["holder_start"] = started_as(os.getpid())  # its pid alone is another's after a reboot
        cur["hold_s"] = a.get("hold_s") or 0  # a group's prepared host: held this long with no process
        try:
            write_record(path, cur)
        except OSError as exc:  # a full disk: nothing has been changed yet
            return {"status": "unwritable", "path": directory, "error": exc.strerror or str(exc)}
        return {"status": "taken", "taken_over": taken_over}


def held_by_another(path: str, a: LockRequest) -> Optional[LockResult]:
    """Held while a host process of that run is alive (act, watch), or within a short grace between its
    round trips (longer, `hold_s`, for a group's host prepared while the others are: until every host is,
    and the launch); a run whose fleet was killed leaves a stale lock that the next run takes over."""
    cur = read_record(path)
    if cur is None or cur.get("run_id") == a["run_id"]:
        return None
    age = time.time() - os.path.getmtime(path) if os.path.exists(path) else None
    holder = cur.get("holder_pid")
    live = still_runs(holder, cur.get("holder_start"))
    grace = max(float(a["grace_s"]), float(cur.get("hold_s") or 0))
    if age is None or not (age < grace or live):
        return None
    return {
        "status": "held",
        "owner": cur.get("owner"),
        "since": cur.get("since"),
        "age_s": age,
        "command": cur.get("command"),
        "holder_pid": holder if live else None,
    }


def overlapping(root: str, a: LockRequest) -> List[Dict[str, Any]]:
    """Other deployments on a GPU or a port this one is placed on (and that it was not told to replace):
    a running server of theirs, or a run of theirs under way (its lock names its GPUs and ports). The
    check fleet made from the facts, made again here, where no other run can interleave."""
    if not a.get("places"):  # a stop or a lock release places nothing
        return []
    mine = record_gpus(a)  # None: all GPUs
    my_ports = set(record_ports(a))
    out = []
    for name in deployment_names(root):
        if name == a["deployment"] or name in (a.get("replace") or []):
            continue
        directory = deployment_dir(root, name)
        st = peek_record(os.path.join(directory, STATE_FILE))
        pgid = recorded_group(st)
        # a leader nobody reaped (no init in a container) is a crashed server
        running = pgid is not None and alive(pgid) and st.get("status") != STOPPED
        if not running and held_by_another(os.path.join(directory, LOCK_FILE), a) is None:
            continue
        claim = st if running else peek_record(os.path.join(directory, LOCK_FILE))
        theirs = record_gpus(claim)
        shared_gpus = mine is None or theirs is None or bool(set(mine) & set(theirs))
        shared_ports = sorted(my_ports & set(record_ports(claim)))
        if shared_gpus or shared_ports:
            out.append(
                {
                    "deployment": name,
                    "gpus": theirs,
                    "port": shared_ports[0] if shared_ports else None,
                    "pid": st.get("pid") if running else None,
                }
            )
    return out


def sibling_groups(
    root: str, me: str, replace: List[str], every: Optional[List[int]] = None
) -> Tuple[Dict[int, str], Dict[int, str], Set[int]]:
    """The running servers of the host's other deployments, by process group (exact identity only):
    (those left alone, those this run replaces, the GPUs the ones left alone run on). A deployment on
    all GPUs (its record names none) runs on `every` one: it yielded no GPU at all, and a stop beside it
    waited for memory that deployment keeps."""
    siblings: Dict[int, str] = {}
    replaced: Dict[int, str] = {}
    gpus: Set[int] = set()
    for name in deployment_names(root):
        if name == me:
            continue
        st = peek_record(os.path.join(deployment_dir(root, name), STATE_FILE))
        for pgid in recorded_groups(st):  # its weight cache daemon is the deployment's too, even with no server
            (replaced if name in replace else siblings)[pgid] = name
            if name not in replace:
                gpus |= set(record_gpus(st) or every or [])
    return siblings, replaced, gpus


def record_replaced(root: str, replaced: Dict[int, str], by: str) -> None:
    for name in replaced.values():
        path = os.path.join(deployment_dir(root, name), STATE_FILE)
        change_status(path, STOPPED, {"reason": "replaced by deployment %s" % by})


def wait_for_steps_of_this_run(a: LockRequest, wait_s: float) -> None:
    """fleet was interrupted: a step of the same run still working on the host (it saw fleet's end of its
    stdin close and is finishing: recording, releasing) goes first, so the lock is not freed under it."""
    path = os.path.join(deployment_dir(a["state_dir"], a["deployment"]), LOCK_FILE)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        cur = read_record(path) or {}
        holder = cur.get("holder_pid")
        if cur.get("run_id") != a["run_id"] or not isinstance(holder, int) or holder == os.getpid():
            return
        if not still_runs(holder, cur.get("holder_start")):
            return
        time.sleep(0.1)


# What fleet writes in a deployment's directory: its JSON records, and those set aside as corrupt; and the
# directory a container's launcher reads its secrets from, with only what a killed step left there.
FLEET_RECORD_RE = re.compile(r"^[a-z]+\.json(\.corrupt-[0-9]+)?\Z")
SECRETS_DIR = "secrets"
LEFT_SECRETS_RE = re.compile(r"^env-.+\.json\Z")


def fleets_own(directory: str, name: str) -> bool:
    """Whether `name` in a deployment's directory is what fleet writes there (never through a link)."""
    mode = os.lstat(os.path.join(directory, name)).st_mode
    if name == SECRETS_DIR and stat.S_ISDIR(mode):
        return removed_secrets(os.path.join(directory, name), only_look=True)
    return bool(FLEET_RECORD_RE.match(name)) and stat.S_ISREG(mode)


def removed_secrets(path: str, only_look: bool = False) -> bool:
    """Remove the secrets directory at `path` if it holds nothing but the files a container's launcher
    reads (`only_look`: just say whether it does). Read and emptied through one descriptor of the directory
    itself, never a link: what is removed is what was looked at."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        names = os.listdir(fd)
        for n in names:
            if not LEFT_SECRETS_RE.match(n) or not stat.S_ISREG(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode):
                return False
        if only_look:
            return True
        for n in names:
            os.unlink(n, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(path)
    return True


def forget(directory: str, clear: Callable[[StateRecord], Optional[str]] = lambda st: None) -> ForgetResult:
    """`fleet forget`: a deployment's records, once nothing of it runs, under its lock (this run's, which
    goes with the directory; the act step releases it when anything refuses). A server still running
    refuses; so does a directory holding anything fleet did not write there (it is somebody's: nothing is
    removed). Files are removed by name, never through a link. `clear`: what the record names outside the
    directory (its stopped container) removed first, or why it could not be (then nothing is forgotten:
    without its record nothing would prove it fleet's)."""
    st = read_record(os.path.join(directory, STATE_FILE)) or {}
    # its launcher's group, exactly as recorded, with a member still running (a zombie leader is not); its
    # weight cache daemon's the same way: forgotten, nothing would ever stop it
    for pgid in recorded_groups(st):
        if pgid in live_process_groups():
            return {"forgotten": False, "running": pgid}
    names = sorted(os.listdir(directory))
    foreign = [n for n in names if not fleets_own(directory, n)]
    if foreign:
        return {"forgotten": False, "left": foreign}
    newer = [n for n in names if n != SECRETS_DIR and written_by_newer(os.path.join(directory, n))]
    if newer:  # a newer fleet's records: its to keep or remove
        return {"forgotten": False, "newer": newer}
    box = clear(cast("StateRecord", st))  # before anything of the directory goes: a refusal changes nothing
    if box:
        return {"forgotten": False, "container": box}
    if SECRETS_DIR in names and not removed_secrets(os.path.join(directory, SECRETS_DIR)):
        return {"forgotten": False, "left": [SECRETS_DIR]}  # changed since it was looked at: left as it is
    for n in names:  # the lock last: until the directory goes, this run holds it
        if n not in (LOCK_FILE, SECRETS_DIR):
            os.unlink(os.path.join(directory, n))
    os.unlink(os.path.join(directory, LOCK_FILE))
    os.rmdir(directory)
    return {"forgotten": True}
