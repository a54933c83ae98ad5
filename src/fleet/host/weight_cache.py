"""On the host, in the act step: SGLang's weight cache daemon of a deployment (fleet.plan.weight_cache).

The daemon runs in a process group of its own, under fleet's launcher, recorded in the deployment's
state as `weight_cache` with the same exact identity as its server (boot, group leader's start ticks).
An engine that crashes, is restarted or healed is relaunched against the same daemon while its `key`
(the settings it loaded with) is unchanged; a new key, a deploy without `weight_cache:` or a stop ends
it. Its sockets and .ready files live in a directory of the deployment's own, fleet's user's alone
(SGLang's templates point the daemon and the engine there): SGLang's default, /tmp/sglang_weight_cache_*,
is a name any local user can take first. The engine's launcher starts the engine once every rank's
.ready file names a live process (host/launchers.py await_weight_cache): an engine started before that
would load the weights from disk beside the daemon's copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Dict, List, Mapping, Optional, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    recorded_group  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.free import recorded_group
    from fleet.host.procs import boot_id
    from fleet.host.words import SECRET_WORD
    from fleet.protocol import Launched, WeightCacheEntry, WeightCacheRequest

WAIT_ENV = "FLEET_WEIGHT_CACHE_WAIT"  # read (and removed) by the launcher, never passed to the engine
READY_WAIT_S = 3600  # a large model's load from a slow disk; the daemon's own limit is 1800 s a step
TEMPLATES = ("SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE", "SGLANG_WEIGHT_CACHE_READY_TEMPLATE")


def cache_dir(state_dir: str) -> str:
    """The deployment's daemon directory: short (a socket's path has 107 bytes at most), under /tmp in a
    directory of fleet's user, one per deployment (its state directory's)."""
    tag = hashlib.sha256(os.path.realpath(state_dir).encode()).hexdigest()[:12]
    return os.path.join("/tmp", "fleet-wc-%d" % os.getuid(), tag)


def unsafe_dir(path: str) -> Optional[str]:
    """Why `path` (made, with its parent, if missing) cannot hold the daemon's sockets, or None: each must
    be a real directory of fleet's user that nobody else may write or read."""
    for d in (os.path.dirname(path), path):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            return "%s: %s" % (d, exc.strerror or exc)
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return "%s is not a directory of this user's alone (mode 0700)" % d
    return None


def clear_dir(directory: str) -> None:
    """The sockets and .ready files left in the deployment's daemon directory by daemons that were killed
    (a rank killed with its parent writes no goodbye): a live pid in a stale .ready file, reused since,
    would pass for a ready rank. Called only with no daemon of the deployment running."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(".ready") or name.endswith(".sock"):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def template_env(directory: str) -> Dict[str, str]:
    return {
        TEMPLATES[0]: os.path.join(directory, "{device_uuid}.sock"),
        TEMPLATES[1]: os.path.join(directory, "{device_uuid}.ready"),
    }


def running_daemon(record: Optional[Mapping[str, object]]) -> Optional[WeightCacheEntry]:
    """The daemon a deployment's record names, when that exact process group still runs; only the fields
    fleet wrote, of the types it wrote (a damaged entry names no daemon)."""
    entry = (record or {}).get("weight_cache")
    if not isinstance(entry, dict):
        return None
    pgid, pid, key, exit_file = entry.get("pgid"), entry.get("pid"), entry.get("key"), entry.get("exit_file")
    if type(pgid) is not int or pgid <= 1 or type(pid) is not int or not isinstance(key, str):
        return None
    if pgid == (record or {}).get("pgid") or not isinstance(exit_file, str) or os.path.exists(exit_file):
        return None  # its server's own group is no daemon; an exit file: its launcher saw it end
    if recorded_group(entry) is None:
        return None
    kept: WeightCacheEntry = {"pid": pid, "pgid": pgid, "key": key, "exit_file": exit_file}
    for name in ("start_ticks", "boot_id", "started", "log"):
        if name in entry:
            kept[name] = entry[name]
    return kept


def keep_or_stop(
    want: Optional[WeightCacheRequest], record: Optional[Mapping[str, object]]
) -> Tuple[Optional[WeightCacheEntry], Optional[int], str]:
    """(the daemon kept, the daemon's group to stop, why) for a run that wants `want` (None: none, or a
    stop) where `record` is the deployment's record."""
    running = running_daemon(record)
    if running is None:
        return None, None, "no daemon of this deployment runs" if want else ""
    if want is not None and want.get("restart"):
        return None, running["pgid"], "started again: %s" % want["restart"]
    if want is not None and running.get("key") == want["key"]:
        return running, None, "its weights are reused: the daemon runs with the same settings"
    if want is None:
        return None, running["pgid"], "stopped with its deployment's server"
    return None, running["pgid"], "started again: its settings changed (model, parallel sizes, quantisation or GPUs)"


def daemon_entry(started: Launched, want: WeightCacheRequest) -> WeightCacheEntry:
    """The record entry naming a daemon just started."""
    return {
        "pid": started["pid"],
        "pgid": started["pgid"],
        "start_ticks": started["start_ticks"],
        "boot_id": boot_id(),
        "started": started["started"],
        "log": started["log"],
        "exit_file": started["exit_file"],
        "key": want["key"],
    }


def daemon_secrets(secrets: Mapping[str, str], argv: List[str]) -> Dict[str, str]:
    """The secrets the daemon gets: the engine's (a Hub token), but its API key: the daemon serves nothing."""
    keys = set(w[len(SECRET_WORD) :] for i, w in enumerate(argv) if i and argv[i - 1] == "--api-key")
    return dict((k, v) for k, v in secrets.items() if k not in keys)


def wait_spec(entry: WeightCacheEntry, directory: str, ranks: int, started_now: bool) -> str:
    """What the engine's launcher waits for before it starts the engine: `ranks` .ready files in the
    daemon's directory naming live processes; a daemon started for this attempt has its lines copied into
    the attempt's log meanwhile."""
    return json.dumps(
        {
            "dir": directory,
            "ranks": ranks,
            "pid": entry["pid"],
            "start_ticks": entry.get("start_ticks"),
            "exit_file": entry["exit_file"],
            "log": entry.get("log") if started_now else None,
            "timeout_s": READY_WAIT_S,
        }
    )
