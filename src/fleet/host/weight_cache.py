"""On the host, in the act step: SGLang's weight cache daemon of a deployment (fleet.plan.weight_cache).

The daemon runs in a process group of its own, under fleet's launcher, recorded in the deployment's
state as `weight_cache` with the same exact identity as its server (boot, group leader's start ticks).
An engine that crashes, is restarted or healed is relaunched against the same daemon while its `key`
(the settings its CacheConfig depends on) is unchanged; a new key, a deploy without `weight_cache:` or a
stop ends it. The engine's launcher waits for the daemon's ranks to listen before it starts the engine
(host/launchers.py await_weight_cache): an engine started before that would load the weights from disk
beside the daemon's copy.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional, Tuple, cast

try:  # the shared host code is prepended when this script is sent to a host
    recorded_group_is_ours  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.free import recorded_group_is_ours
    from fleet.host.procs import boot_id
    from fleet.protocol import Launched, WeightCacheEntry, WeightCacheRequest

WAIT_ENV = "FLEET_WEIGHT_CACHE_WAIT"  # read (and removed) by the launcher, never passed to the engine
READY_WAIT_S = 3600  # a large model's load from a slow disk; the daemon's own limit is 1800 s a step


def running_daemon(record: Optional[Mapping[str, object]]) -> Optional[WeightCacheEntry]:
    """The daemon a deployment's record names, when that exact process group still runs."""
    entry = (record or {}).get("weight_cache")
    if not isinstance(entry, dict):
        return None
    pgid = entry.get("pgid")
    if type(pgid) is not int or pgid <= 1 or not recorded_group_is_ours(pgid, entry):
        return None
    if os.path.exists(str(entry.get("exit_file") or "")):  # its launcher saw it end
        return None
    return cast("WeightCacheEntry", dict(entry))


def keep_or_stop(
    want: Optional[WeightCacheRequest], record: Optional[Mapping[str, object]]
) -> Tuple[Optional[WeightCacheEntry], Optional[int], str]:
    """(the daemon kept, the daemon's group to stop, why) for a run that wants `want` (None: none, or a
    stop) where `record` is the deployment's record."""
    running = running_daemon(record)
    if running is None:
        return None, None, "no daemon of this deployment runs" if want else ""
    if want is not None and running.get("key") == want["key"]:
        return running, None, "its weights are reused: the daemon runs with the same settings"
    if want is None:
        return None, running["pgid"], "stopped with its deployment's server"
    return None, running["pgid"], "started again: its settings changed (model, parallel sizes, quantisation or GPUs)"


def daemon_entry(started: Launched, want: WeightCacheRequest) -> WeightCacheEntry:
    """The record entry naming a daemon just started (relay_from 0: its lines go into the attempt's log)."""
    return {
        "pid": started["pid"],
        "pgid": started["pgid"],
        "start_ticks": started["start_ticks"],
        "boot_id": boot_id(),
        "started": started["started"],
        "log": started["log"],
        "exit_file": started["exit_file"],
        "key": want["key"],
        "ranks": want["ranks"],
        "relay_from": 0,
    }


def wait_spec(entry: WeightCacheEntry) -> str:
    """What the engine's launcher waits for before it starts the engine: the daemon's ranks listening, as
    its log says; the lines of a daemon started for this attempt are copied into the attempt's log."""
    log = str(entry["log"])
    relay_from = 0 if entry.get("relay_from") == 0 else _size(log)
    return json.dumps(
        {
            "log": log,
            "pid": entry["pid"],
            "start_ticks": entry.get("start_ticks"),
            "exit_file": entry.get("exit_file"),
            "ranks": entry.get("ranks", 1),
            "relay_from": relay_from,
            "timeout_s": READY_WAIT_S,
        }
    )


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
