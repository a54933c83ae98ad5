"""fleet's records on a host: every file it keeps there is named, read, versioned and written here only.

Runs on the host (prepended to every step: standard library only, Python 3.8, ASCII) and is imported by
fleet's tests. Each record is one JSON object carrying the version of its shape (SCHEMA_KEY):
  - one written by a newer fleet is refused (RecordTooNew says which file and what to do), never set aside
    or written over: that fleet may still be using it;
  - one written by an older fleet is migrated as it is read (MIGRATIONS), and written back in the new shape
    the next time it changes;
  - a file that is not a record (cut short by a full disk, edited by hand) is set aside, not deleted.
A deployment's status changes only along TRANSITIONS (change_status); a new attempt starts a new record.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

try:  # fleet.protocol is prepended before this file when a step is sent to a host
    STARTING  # noqa: B018
except NameError:  # imported as a module (fleet itself, its tests)
    from fleet.host.words import DEPLOYMENT_NAME_RE, FAILED, READY, STARTING, STATE_SCHEMA, STOPPED, UNVERIFIED

# fleet's record files on a host, named here only: every other module uses these names
LEARNED_FILE = "learned.json"  # the host's learned fixes, shared by its deployments
STATE_FILE = "state.json"  # a deployment's record (its plan, server, status)
LOCK_FILE = "lock.json"  # a deployment's lock: the run that may change it
HEALS_FILE = "heals.json"  # a deployment's heals in the last day (the heal rate limit)
HEALTH_FILE = "health.json"  # a deployment's last health checks (fleet health's bookkeeping)
STARTUP_FILE = "startup.json"  # the host's start-up timelines: model x engine version x GPUs -> last starts
PHASE_FILE = "phase.json"  # a starting deployment's current phase, for `fleet status` (gone once it ends)
ROUTER_FILE = "router.json"  # a service's router process, as fleet started it
SERVICE_FILE = "service.json"  # a service's record: its replicas, as its last deploy or roll left them
GUARD_FILE = "lock.guard"  # the host's guard: the flock every change of its shared records is made under

# The host's own records, shared by every deployment and every fleet that uses the host: one written by a
# newer fleet is read as absent and left as it is (a deployment's own records refuse instead).
HOST_WIDE = (LEARNED_FILE, STARTUP_FILE, HEALTH_FILE)
SCHEMA_KEY = "schema"
# The shape of each record this fleet writes. A record without SCHEMA_KEY was written by a fleet from
# before versions: the state record's shape then was version 1, every other record's version 0.
SCHEMAS = {
    STATE_FILE: STATE_SCHEMA,
    LEARNED_FILE: 1,  # 1: {"fixes": {key: [fix, ...]}}; 0 was that dict alone
    HEALS_FILE: 1,  # 1: {"times": [t, ...]}; 0 was that list alone
    LOCK_FILE: 1,
    HEALTH_FILE: 1,
    STARTUP_FILE: 1,
    PHASE_FILE: 1,
    ROUTER_FILE: 1,
    SERVICE_FILE: 1,
}


class RecordTooNew(ValueError):
    """A record written by a newer fleet: this one cannot know what its fields mean, so it changes
    nothing."""

    def __init__(self, path: str, found: int, known: int) -> None:
        ValueError.__init__(
            self,
            "%s was written by a newer fleet (record version %d; this fleet knows up to %d): run that "
            "fleet, or upgrade this one" % (path, found, known),
        )
        self.path = path


def _unversioned(name: str) -> int:
    return 1 if name == STATE_FILE else 0


# (file, version) -> the record in the next version's shape. Version 1 of the state record (an older
# fleet's one-server record) already reads as version 2: every field is optional.
MIGRATIONS: Dict[Tuple[str, int], Callable[[Any], Dict[str, Any]]] = {
    (STATE_FILE, 1): lambda record: dict(record),
    (LEARNED_FILE, 0): lambda fixes: {"fixes": fixes},
    (HEALS_FILE, 0): lambda times: {"times": times},
}


def _current(path: str, data: Any) -> Dict[str, Any]:
    """`data` read from `path` as a record of this fleet's version. Raises RecordTooNew, or ValueError for
    something that is not one of fleet's records."""
    name = os.path.basename(path)
    known = SCHEMAS.get(name, 1)
    if isinstance(data, dict):
        found = data.get(SCHEMA_KEY, _unversioned(name))
    elif isinstance(data, list) and name == HEALS_FILE:  # the one record that was a list before versions
        found = 0
    else:
        raise ValueError("%s: not a JSON object" % path)
    if not isinstance(found, int) or isinstance(found, bool) or found < 0:
        raise ValueError("%s: its %s is not a version: %r" % (path, SCHEMA_KEY, found))
    if found > known:
        raise RecordTooNew(path, found, known)
    record: Dict[str, Any] = data
    while found < known:
        record = MIGRATIONS.get((name, found), dict)(record)
        found += 1
    record[SCHEMA_KEY] = known
    return record


RECORD_LIMIT = 4 << 20  # bytes: fleet's largest record (a start-up history) is a few hundred KiB


def own_file(st: os.stat_result) -> bool:
    """Whether a file or directory is fleet's user's and nobody else may write it. A record names the
    process groups fleet stops: one another user planted (a state_dir in /tmp, made by them first) would
    have fleet stop whatever group they chose."""
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def owned(path: str, kind: Callable[[int], bool] = lambda mode: not stat.S_ISLNK(mode)) -> bool:
    """Whether `path` (not followed) is of `kind` (by default anything but a link) and this user's alone:
    what fleet made, not something another user planted."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return kind(st.st_mode) and own_file(st)


def not_ours_alone(path: str) -> Optional[str]:
    """Why fleet may not keep what it later trusts, runs or removes in directory `path`, or None. It must be
    this user's and writable by nobody else: another user could plant there a model fleet counts whole, an
    environment it runs, or a link it removes through. A link to the directory is followed (models on a
    bigger disk): what counts is the directory things are made in."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return "%s cannot be read: %s" % (path, exc.strerror)
    if not stat.S_ISDIR(st.st_mode) or not own_file(st):
        return "%s is not a directory of this user's that only they may write" % path
    return _movable(os.path.realpath(path))


def _movable(real: str) -> Optional[str]:
    """Why another user could swap directory `real` for one of theirs, or None: a directory above it that
    any user may write, without the sticky bit (/tmp has it), lets them rename it and put theirs there."""
    parent = os.path.dirname(real)
    while parent != real:
        try:
            mode = os.stat(parent).st_mode
        except OSError:
            return None
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return "%s is inside %s, which any user may write (one could move it and put theirs there)" % (real, parent)
        real, parent = parent, os.path.dirname(parent)
    return None


def unsafe_state_dir(root: str) -> Optional[str]:
    """Why fleet's records cannot be kept under `root` (its deployments too), or None."""
    for d in (root, os.path.join(root, DEPLOYMENTS)):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode) or not own_file(st):
            return "%s is not a directory of this user's that only they may write" % d
    return _movable(os.path.realpath(root))


def _read_json(path: str) -> Any:
    """A record file's JSON. Only a regular file is read, never through a link and never waiting (a FIFO
    planted in its place would hang every step), and at most RECORD_LIMIT bytes: FileNotFoundError when
    there is none, OSError when it cannot be read, ValueError when it is not JSON or too large."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if not own_file(st):  # planted by another user where they can write: it names nothing of fleet's
            raise OSError(errno.EPERM, "not a file of this user's alone", path)
        data = f.read(RECORD_LIMIT + 1)
    if len(data) > RECORD_LIMIT:
        raise ValueError("%s: larger than %d MiB, not a record of fleet's" % (path, RECORD_LIMIT >> 20))
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # nested past Python's stack: no record of fleet's is
        raise ValueError("%s: not JSON fleet reads (%s)" % (path, type(exc).__name__)) from exc


def load_record(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """A record for reading only (facts: nothing is changed or set aside): (record, None), (None, None) when
    there is none, or (None, why it cannot be read)."""
    try:
        return _current(path, _read_json(path)), None
    except FileNotFoundError:
        return None, None
    except RecordTooNew as exc:  # the host's own files a newer fleet keeps are its: absent here, no fault
        return None, None if os.path.basename(path) in HOST_WIDE else str(exc)
    except OSError as exc:
        return None, "%s: %s" % (path, exc.strerror or exc)
    except ValueError as exc:
        return None, str(exc)


def peek_record(path: str) -> Dict[str, Any]:
    """Another deployment's record, read to leave its server alone (its process group, GPUs and ports):
    nothing is set aside, and one a newer fleet wrote is read as it is, since its server is still not
    this run's to stop; {} when there is none or it is no record."""
    try:
        data = _read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def written_by_newer(path: str) -> bool:
    """Whether `path` is a record a newer fleet wrote (nothing is read into this fleet, nothing changed)."""
    try:
        _current(path, _read_json(path))
    except RecordTooNew:
        return True
    except (OSError, ValueError):
        pass
    return False


def read_record(path: str) -> Optional[Dict[str, Any]]:
    """A record about to be changed, or None when there is none. A file that is not one is set aside,
    renamed `NAME.corrupt-STAMP`, so the next write starts a good record and nothing is lost; a newer
    fleet's record raises RecordTooNew and stays as it is."""
    try:
        data = _read_json(path)
    except OSError:  # none, or not a file fleet reads (a link, a FIFO): the next write replaces it
        return None
    except ValueError:
        data = None
    try:
        return _current(path, data)
    except RecordTooNew:
        raise
    except ValueError:
        with contextlib.suppress(OSError):
            os.replace(path, "%s.corrupt-%d" % (path, int(time.time())))
        return None


def write_record(path: str, data: Mapping[str, object]) -> None:
    """Replace a record atomically, with its version: a unique temporary file, fsynced, renamed over it. On
    failure (a full disk) the temporary file is removed and the old record is left as it was."""
    tmp = "%s.%d.%d.tmp" % (path, os.getpid(), int(time.time() * 1e6))
    record = dict(data)
    record[SCHEMA_KEY] = SCHEMAS.get(os.path.basename(path), 1)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# Where a deployment's status may go from each status. A record is born STARTING (a new attempt, whatever
# the last one's status was). Nothing goes back to READY or STARTING once stopped or failed: a watcher that
# outlived its run cannot revive a deployment stopped or replaced meanwhile. UNVERIFIED goes back to
# STARTING when the run's watch resumes; a group that stopped its ranks and then gave up says FAILED.
# Saying the same status again (with a new reason) is always allowed.
TRANSITIONS = {
    STARTING: (READY, UNVERIFIED, FAILED, STOPPED),
    UNVERIFIED: (STARTING, READY, FAILED, STOPPED),
    READY: (FAILED, STOPPED),
    FAILED: (STOPPED,),
    STOPPED: (FAILED,),
}


def may_become(current: object, status: str) -> bool:
    """Whether a record whose status is `current` may say `status` next (no record, or a status this fleet
    does not know: the change is the record's first word)."""
    if not isinstance(current, str) or current not in TRANSITIONS:
        return True
    return current == status or status in TRANSITIONS[current]


def change_status(
    path: str, status: str, fields: Optional[Mapping[str, object]] = None, run_id: Optional[str] = None
) -> bool:
    """Set a deployment's status, and what goes with it (reason, attempt...; a field given as None is
    dropped), if the record allows it and, given `run_id`, it is still that run's record (a deployment
    without one gets one). Whether it changed: a refused change leaves the record as it was."""
    record = read_record(path)
    if record is None:
        record = {}
    elif (run_id is not None and record.get("run_id") != run_id) or not may_become(record.get("status"), status):
        return False
    record.update(fields or {}, status=status, updated=time.time())
    write_record(path, dict((k, v) for k, v in record.items() if v is not None))
    return True


def release_lock(state_dir: str, run_id: str, guard_root: Optional[str] = None) -> None:
    """Free the host's lock if this run holds it (or it is gone or was set aside as unreadable). Under the
    host's guard at `guard_root` (None: the caller holds it already), so a watcher refreshing the same
    lock cannot read it before the release and write it back after."""
    path = os.path.join(os.path.expanduser(state_dir), LOCK_FILE)
    with host_guard(guard_root) if guard_root else contextlib.nullcontext():
        cur = read_record(path)
        if cur is None or cur.get("run_id") == run_id:
            with contextlib.suppress(OSError):
                os.unlink(path)


class RunLock:
    """A run's hold on a deployment's lock for the length of one host step, and the one way a step lets it
    go: `with RunLock(directory, run_id, release, root) as lock:` frees it when the step ends if `lock.release`
    then says so (whatever ended it: an exception too), and `lock.release_now()` frees it at once, before
    the step says it is done, so fleet's next command finds the deployment free. Releasing twice is once."""

    def __init__(self, state_dir: str, run_id: str, release: bool, guard_root: str) -> None:
        self.state_dir, self.run_id, self.release, self.guard_root = state_dir, run_id, release, guard_root
        self.released = False

    def release_now(self) -> None:
        if not self.released:
            release_lock(self.state_dir, self.run_id, self.guard_root)
            self.released = True

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.release:
            self.release_now()


def mark_unverified(state_dir: str, run_id: str) -> None:
    """fleet went away after this run launched its server and before it was proven: the record says so
    (a record another run wrote since, or one past "starting", is left alone)."""
    path = os.path.join(os.path.expanduser(state_dir), STATE_FILE)
    if (read_record(path) or {}).get("status") == STARTING:
        reason = "fleet's run ended (interrupted or its connection cut) before the server was checked"
        change_status(path, UNVERIFIED, {"reason": reason}, run_id)


# fleet's records on a host: learned.json for the whole host, and a directory per deployment
# (state_dir/deployments/NAME: state.json, lock.json, heals.json, health.json). fleet before deployments
# kept one state.json (and heals.json) in state_dir itself: that is the deployment its record names.
DEPLOYMENTS = "deployments"
LEGACY_FILES = (STATE_FILE, HEALS_FILE)  # health.json stays: it is the host's bookkeeping


@contextlib.contextmanager
def host_guard(state_dir: str) -> Iterator[None]:
    """Hold the host's guard (an exclusive flock on state_dir/lock.guard) for a read-modify-write of a
    record another run may be changing at the same moment. state_dir must exist."""
    with open_guard(os.path.expanduser(state_dir)) as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        yield


def open_guard(root: str) -> IO[bytes]:
    """The host's guard file, opened to be flocked (open_appending)."""
    return open_appending(os.path.join(root, GUARD_FILE))


def open_appending(path: str) -> IO[bytes]:
    """A file of fleet's own opened to append to (a log) or to flock (a guard): a regular file of this
    user's alone, made if missing, never through a link and never waiting (a link planted in its place
    would have fleet create or grow a file anywhere, a FIFO hang the step). OSError when it is anything
    else."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or not own_file(st):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file of this user's alone", path)
    return os.fdopen(fd, "ab")


def deployment_dir(state_dir: str, name: str) -> str:
    if not DEPLOYMENT_NAME_RE.match(name):  # checked by fleet too: a name is a path component here
        raise ValueError("not a deployment name: %r" % name)
    return os.path.join(os.path.expanduser(state_dir), DEPLOYMENTS, name)


def legacy_name(record: Mapping[str, object]) -> str:
    """The deployment an older fleet's one-server record stands for: its playbook's name."""
    name = record.get("playbook")
    return name if isinstance(name, str) and DEPLOYMENT_NAME_RE.match(name) else "default"


def deployment_names(state_dir: str) -> List[str]:
    root = os.path.join(os.path.expanduser(state_dir), DEPLOYMENTS)
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return []
    # a directory fleet made, never a link to (or a directory of) another user's: its records name the
    # process groups fleet stops, and heal writes there
    return [n for n in entries if DEPLOYMENT_NAME_RE.match(n) and owned(os.path.join(root, n), stat.S_ISDIR)]


def migrate_legacy(state_dir: str) -> Optional[str]:
    """Move an older fleet's one-server record into its deployment's directory (nothing running is
    touched: the record moves, its server stays fleet's). Run under the host's guard. Returns the name."""
    root = os.path.expanduser(state_dir)
    legacy = os.path.join(root, STATE_FILE)
    if not os.path.exists(legacy):
        return None
    record = read_record(legacy)
    if record is None:  # set aside as corrupt by read_record: nothing left to move
        return None
    name = legacy_name(record)
    target = deployment_dir(root, name)
    os.makedirs(target, mode=0o700, exist_ok=True)
    for file in LEGACY_FILES:
        src = os.path.join(root, file)
        if not os.path.exists(src):
            continue
        if os.path.exists(os.path.join(target, file)):  # the deployment already has its own: keep the old aside
            os.replace(src, "%s.before-deployments-%d" % (src, int(time.time())))
        else:
            os.replace(src, os.path.join(target, file))
    return name


def record_gpus(record: Mapping[str, object]) -> Optional[List[int]]:
    """A record's GPUs as fleet wrote them (a list of indices); None, meaning all, for anything else."""
    value = record.get("gpus")
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return value
    return None


def record_ports(record: Mapping[str, object]) -> List[int]:
    """Every port a record says its server opens (`ports`; `port` in records written before placements)."""
    value = record.get("ports")
    if isinstance(value, list) and value and all(isinstance(p, int) for p in value):
        return value
    port = record.get("port")
    return [port] if isinstance(port, int) else []
