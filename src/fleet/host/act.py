"""Runs ON the host (sent as `python -c`): lock (host/lock.py), the engine's own check (host/check.py),
stop stale servers, free the deployment's GPUs (host/free.py), launch detached and record its state
(host/launch.py) -- all sent before this file: one round trip. Prints one JSON document.

Stand-alone on purpose (standard library only, plus `pynvml` when the engine environment has it).
Safety rules it enforces itself, whatever the caller says:
  - it never signals pid 1, its own process group, sshd, a GPU daemon or tool (nvidia-persistenced, DCGM,
    a display server, an nvidia-smi query: they hold the device files, not the GPU's memory, and are
    left running, reported), or a process group holding non-engine processes (but fleet's own server's,
    the group its record names);
  - other foreign GPU holders (other users' processes, non-engine processes) are refused unless the
    kill policy is "force", and refused holders are reported before anything is stopped.
Secrets arrive on stdin as JSON and reach the engine through its launcher's stdin: never a file or argv.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple, cast

try:  # the shared host code is prepended when this script is sent to a host
    classify  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.check import budget_short, client_gone, engine_check, picks_differ
    from fleet.host.common import at_once, container_owner
    from fleet.host.container import (
        container_of,
        fleet_containers,
        recorded_cli,
        recorded_id,
        remove_recorded,
        run_cli,
        stop_containers,
        stop_foreign_containers,
    )
    from fleet.host.free import (
        all_gpu_indices,
        classify,
        expand,
        group_members,
        is_engine,
        not_the_stops,
        nvml_pids_and_memory,
        recorded_group,
        stop_targets,
        wait_memory_released,
    )
    from fleet.host.launch import launch_and_record, short_of_space, unwritable_dir
    from fleet.host.lock import (
        forget,
        record_replaced,
        sibling_groups,
        take_lock,
        wait_for_steps_of_this_run,
    )
    from fleet.host.procs import live_lookup, process_table
    from fleet.host.records import (
        LEARNED_FILE,
        STATE_FILE,
        RecordTooNew,
        RunLock,
        change_status,
        deployment_dir,
        mark_unverified,
        peek_record,
        read_record,
        write_record,
    )
    from fleet.host.signals import hold_same_group
    from fleet.host.weight_cache import cache_dir, keep_or_stop, unsafe_dir
    from fleet.host.words import STOPPED
    from fleet.protocol import ActRequest, ActResult, CheckResult, FreeRequest, ProcessInfo, StateRecord


def sweep_stopped_groups(groups: Dict[int, Dict[int, Optional[int]]], siblings: Dict[int, str]) -> None:
    """Engine processes that outlived their parent in a group fleet just stopped (JIT workers): SIGKILLed,
    each held first. Only those groups (`groups`: each one's members as fleet read them, pid -> start
    ticks), while their ids still name them: never an engine-looking process elsewhere on the host, which
    may be another container's or a tool's (a sweep by name killed a foreign container's server)."""
    me, own = os.getuid(), os.getpgid(0)

    def outlived(p: ProcessInfo) -> bool:
        return not is_engine(p, live_lookup) or bool(container_of(p["pid"]))  # skipped: what the sweep leaves

    for _sweep in range(3):
        left = {}
        for pgid, read in groups.items():
            if pgid != own and pgid not in siblings:
                left.update(hold_same_group(pgid, read, me, outlived))
        if not left:
            break
        for h in left.values():
            h.send(signal.SIGKILL)
            h.close()
        time.sleep(0.1)


OPS = ("check", "forget", "release", "prepare", "launch", "stop")  # protocol.ActRequest says what each is
LAUNCHING = ("prepare", "launch")  # the operations that free the GPUs for a launch


def main() -> ActResult:
    a = cast("ActRequest", json.loads(sys.argv[1]))
    ahead = cast(Dict[str, Any], a)
    if ahead.get("ahead"):  # started before fleet had planned (fleet/step_ahead.py)
        waited = select.select([0], [], [], float(ahead.get("wait_s") or 660))[0]
        line = sys.stdin.readline() if waited else ""  # the request, then the secrets' line
        if not line:  # never given one (or not in time): nothing asked, nothing done
            return {"host": socket.gethostname(), "error": "started ahead and given no request"}
        a = cast("ActRequest", json.loads(line))
    # the first line: fleet may hold stdin open after it (client_on_stdin), its end meaning fleet is gone
    secrets = json.loads(sys.stdin.readline() or "{}")
    out: ActResult = {"host": socket.gethostname()}
    if a.get("op") not in OPS:  # a request this step does not know: nothing is guessed, nothing done
        out["error"] = "unknown operation %r (this step knows %s)" % (a.get("op"), ", ".join(OPS))
        return out
    if a["op"] == "check":  # an upgrade preview: the engine's own verdict; nothing locked, nothing changed
        out["check"] = engine_check(a["check"], lambda: client_gone(a))
        return out
    if a.get("abandon"):
        wait_for_steps_of_this_run(a["lock"], a["abandon"]["wait_s"])
    out["lock"] = take_lock(a["lock"])
    if out["lock"]["status"] != "taken":  # held by another run, or no state directory to hold it in
        return out
    root = expand(a["lock"]["state_dir"])
    state_dir = deployment_dir(root, a["lock"]["deployment"])
    # released also when the work fails (a newer fleet's record, a full disk): no lock is left behind
    with RunLock(state_dir, a["lock"]["run_id"], release=True, guard_root=root) as lock:
        try:
            lock.release = under_lock(a, secrets, out, root, state_dir)
        except RecordTooNew as exc:  # refused, as the record asks: fleet says so, and whether it stopped anything
            out["record_too_new"] = str(exc)
    return out


def under_lock(a: ActRequest, secrets: Dict[str, str], out: ActResult, root: str, state_dir: str) -> bool:
    """The work once the lock is taken; whether the lock goes now (False: the run holds it on, or forget
    released it)."""
    recorded = read_record(os.path.join(state_dir, STATE_FILE)) or {}  # a damaged record is set aside now
    with contextlib.suppress(RecordTooNew):  # the host's fixes, a newer fleet's: left to it (see watch.learn)
        read_record(os.path.join(root, LEARNED_FILE))
    if a["lock"].get("command") == "heal" and (recorded.get("status") == STOPPED or recorded.get("stopped_by")):
        # stopped by an operator after the health check saw it down (and maybe failed since, by a run that
        # ended late): a heal must not undo that
        out["stopped_since"] = True
        return True
    if a["op"] == "forget":  # fleet forget: the records of a deployment that no longer runs, nothing else
        out["forget"] = forget(state_dir, remove_recorded)
        return not out["forget"]["forgotten"]  # forgotten: the lock went with the directory
    if a["op"] == "release":
        if a.get("abandon"):  # interrupted between steps: a server launched and not yet checked says so
            mark_unverified(state_dir, a["lock"]["run_id"])
        return True

    def gone() -> bool:
        return client_gone(a)

    # the engine's check comes before anything is stopped; a container's check (it holds no GPU) runs
    # while the engine starts when nothing is in its way: a container start is not paid twice
    race = bool(a.get("check")) and may_race(a)
    if a.get("check") and not race:
        refused_now = check_refusal(a, out, engine_check(a["check"], gone))
        if refused_now is not None:
            return refused_now
    refused_now = refusal_before_stopping(a, out)
    if refused_now is not None:
        checked = checked_first(a, out, gone, BEFORE_STOPPING) if race else None
        return refused_now if checked is None else checked
    previous = read_record(os.path.join(state_dir, STATE_FILE))
    way, targets, procs = what_is_in_the_way(a, out, root, previous)
    if race and (out["refused"] or targets or way.ours):  # something to stop or refuse: checked first
        race = False
        refused_now = checked_first(a, out, gone, IN_THE_WAY)
        if refused_now is not None:
            return refused_now
        way, targets, procs = what_is_in_the_way(a, out, root, previous)  # the check took its time
    if out["refused"] and a["op"] in LAUNCHING:  # a launch needs the GPUs free; a stop still stops what is fleet's
        return False
    if a["op"] == "prepare":  # a group's first step on each host: locked and checked, nothing stopped yet
        return False
    if gone():  # nobody would watch what happens next: change nothing, free the host
        out["client_gone"] = True
        return True
    stop_in_the_way(a, out, way, targets, procs)
    if a["op"] == "launch":
        launch_and_record(a, secrets, state_dir, previous, out)
        if "write_failed" in out:
            return True
        if race:  # checked while the engine starts: a refusal, or fleet gone meanwhile, takes it back
            refused_now = check_refusal(a, out, engine_check(a["check"], gone, yielding=True))
            if refused_now is None and gone():
                out["client_gone"] = refused_now = True
            if refused_now is not None:
                withdraw_launch(a, out, state_dir, previous, way)
                return refused_now
        if gone():  # gone after the stop: the launch stands, recorded as never checked
            mark_unverified(state_dir, a["lock"]["run_id"])
            out["client_gone"] = True
            return True
    elif a.get("state_update") is not None:  # a status change (failed, stopped) keeps what the record knew
        change = dict(a.get("state_update") or {})
        if way.free.get("cache_pgid"):  # its weight cache daemon was stopped: the record names it no more
            change["weight_cache"] = None
        if "status" in change:  # said only where the record's status may go (see TRANSITIONS)
            change_status(os.path.join(state_dir, STATE_FILE), str(change.pop("status")), change)
    return bool(a.get("release_lock"))


def may_race(a: ActRequest) -> bool:
    """Whether the engine's check may run while the launched engine starts, when nothing is in the way:
    in a container (it holds no GPU), for a launch with no weight cache daemon to start first and no other
    deployment to replace (whose record a launch changes)."""
    launch = a.get("launch") or {}
    plain = not launch.get("weight_cache") and not a["lock"].get("replace")
    return a["op"] == "launch" and bool(a["check"].get("container")) and plain


# What an answer says before the engine's check, when the check is put off to run beside the launch: the
# refusals it would have come before (the client reads those first), dropped when it refuses itself.
BEFORE_STOPPING = ("log_dir_unwritable", "short_of_space", "record_unwritable")
IN_THE_WAY = ("refused", "left", "weight_cache")


def checked_first(
    a: ActRequest, out: ActResult, gone: Callable[[], bool], said_before: Tuple[str, ...]
) -> Optional[bool]:
    """The engine's check, run where it would have run first, as a refusal (check_refusal); what was said
    since is dropped when it refuses, as if it had not been found."""
    refused_now = check_refusal(a, out, engine_check(a["check"], gone))
    if refused_now is None:
        return None
    for key in said_before:
        out.pop(key, None)  # type: ignore[misc]
    return refused_now


def what_is_in_the_way(
    a: ActRequest, out: ActResult, root: str, previous: Optional[Dict[str, Any]]
) -> Tuple[Way, Dict[int, Dict[str, Any]], Dict[int, ProcessInfo]]:
    """The launch's way (others' containers and holders it will not stop go to out["refused"]), what
    `classify` chose to stop in it, and the process table it was read from."""
    procs = process_table()
    way = in_the_way(a, out, root, previous, procs)
    targets, refused, out["left"] = classify(way.free, procs, way.on_gpus)
    out["refused"] = out.get("refused", []) + refused
    return way, targets, procs


def check_refusal(a: ActRequest, out: ActResult, said: CheckResult) -> Optional[bool]:
    """The engine's check as a refusal (None: it stands on the plan), and whether the lock goes now."""
    out["check"] = said
    if said["verdict"] == "rejected":
        return False
    differ = picks_differ(said.get("picks") or {}, (a["check"].get("picks") or {}).get("expect") or {})
    if differ:  # the plan stood on picks the engine does not make here: fleet plans again, nothing stopped
        out["picks_differ"] = differ
        return True
    short = budget_short(said, a["check"].get("budget"))
    if short:  # the engine's own budget on this host is smaller than the plan counted: refused now
        out["budget_short"] = short
        return True
    return None


def withdraw_launch(
    a: ActRequest, out: ActResult, state_dir: str, previous: Optional[Dict[str, Any]], way: Way
) -> None:
    """Take back a launch the engine's check refused after it started: its container removed, its GPUs'
    memory waited for, the record as it was; its log says why. Nothing else was stopped for it. A
    container that cannot be removed keeps the record that names it (`fleet stop` removes it)."""
    launched = out.pop("launched", None)
    if launched is None:
        return
    container = launched["container"] or {}
    if container.get("id"):  # none: its `run` failed, and launch_container removed what it had made
        code, _, err = run_cli([container["cli"], "rm", "-f", container["id"]], 60)
        if code != 0:
            out["launched"] = launched
            out["withdraw_failed"] = err.strip()[-300:] or "%s rm exited %d" % (container["cli"], code)
            return
    record = os.path.join(state_dir, STATE_FILE)
    with contextlib.suppress(OSError):  # a full disk: the record names a server that is gone, as a crash would
        if previous is None:
            os.unlink(record)
        else:
            write_record(record, previous)
    with contextlib.suppress(OSError), open(launched["log"], "a") as log:
        log.write("[fleet] withdrawn: the engine's check refused this command line (it ran beside the launch)\n")
    wait_memory_released(None, a["free"]["memory_wait_s"], a["free"]["idle_mib"], own_gpus(way), way.kept_pids)
    out["withdrawn"] = launched["log"]


def refusal_before_stopping(a: ActRequest, out: ActResult) -> Optional[bool]:
    """A refusal before anything is stopped but the engine's check's (None: go on), and whether the lock
    goes now."""
    if a["op"] in LAUNCHING:
        unwritable = unwritable_dir(expand(a["launch"]["log_dir"]))
        if unwritable:  # found out after stopping the old server, the host would be left with none
            out["log_dir_unwritable"] = unwritable
            return True
        short = short_of_space(a.get("space") or [])
        if short:
            out["short_of_space"] = short
            return True
        here = deployment_dir(expand(a["lock"]["state_dir"]), a["lock"]["deployment"])
        record = os.path.join(here, STATE_FILE)
        if os.path.isdir(record) and not os.path.islink(record):  # no record could be written over it
            out["record_unwritable"] = {"path": record, "error": "a directory is in its place"}
            return True
        sockets = cache_dir(here)
        unsafe = unsafe_dir(sockets) if a["launch"].get("weight_cache") else None
        if unsafe:  # another user's directory where the daemon's sockets go: nothing of it is trusted
            out["weight_cache_dir"] = {"path": sockets, "error": unsafe}
            return True
    return None


class Way(NamedTuple):
    """What is in a launch's way, read before anything is stopped."""

    free: FreeRequest  # with the deployments beside this one (left running) and those it replaces
    ours: List[Dict[str, Any]]  # fleet's own containers of them
    sibling_gpus: Set[int]
    kept_pids: Set[int]  # a weight cache daemon kept for the launch: its memory is not waited for
    on_gpus: Set[int]  # the processes NVML lists on the deployment's GPUs
    used: Optional[List[int]]  # MiB in use on them, less the kept daemon's


def in_the_way(
    a: ActRequest, out: ActResult, root: str, previous: Optional[Dict[str, Any]], procs: Dict[int, ProcessInfo]
) -> Way:
    """What is in the launch's way (others' containers go to out["refused"]). The runtimes and the GPUs are
    asked at once."""
    container = (a.get("launch") or {}).get("container")
    # the group this deployment's record names is fleet's own: the server of an earlier run, or of this
    # run's last attempt (crashed, timed out or answering garbage), whatever it holds or not
    free = cast("FreeRequest", dict(a["free"]))
    free["recorded_pgid"] = recorded_group(previous or {})
    every = all_gpu_indices(expand(free["gpu_devices"]))
    siblings, replaced, sibling_gpus = sibling_groups(
        root, a["lock"]["deployment"], a["lock"].get("replace") or [], every
    )
    if free.get("gpus") is None and sibling_gpus and every is not None:  # all GPUs, but the siblings'
        free["gpus"] = [i for i in every if i not in sibling_gpus]
    # a sibling's server is left running: for a launch it is in the way (refused), for a stop it is not
    free["launching"] = a["op"] in LAUNCHING
    replaced_names = list(a["lock"].get("replace") or [])
    records = [previous] + [peek_record(os.path.join(deployment_dir(root, n), STATE_FILE)) for n in replaced_names]
    clis = [(container or {}).get("cli")] + [recorded_cli(r) for r in records]
    named = [str(c) for c in clis if c]
    free["siblings"], free["replaced"], free["replaced_names"] = siblings, sorted(replaced), replaced
    want = (a.get("launch") or {}).get("weight_cache")
    kept, free["cache_pgid"], why = keep_or_stop(want, previous)
    free["kept_cache_pgid"] = kept["pgid"] if kept else None
    if why:  # what becomes of the deployment's weight cache daemon, said in the answer
        out["weight_cache"] = {"kept": kept is not None, "why": why}
    kept_pids = set(p["pid"] for p in procs.values() if kept and p["pgid"] == kept["pgid"])

    def listed() -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
        # Asking the runtimes (~70 ms for `podman ps`) is needed only when a record or this launch names one,
        # or some process runs in a container: with neither, no container of fleet's can hold anything.
        if not named and not any(container_of(pid) for pid in procs):
            return [], []
        owner = container_owner(os.getuid(), root)
        name = container["name"] if container else None
        recorded = set(filter(None, (recorded_id(cast("StateRecord", r)) for r in records)))
        return fleet_containers(named, [a["lock"]["deployment"]] + replaced_names, name, owner, recorded)

    # the GPUs are read once, unless something is stopped (stop_in_the_way)
    (ours, out["refused"]), (on_gpus, used) = at_once(listed, lambda: nvml_pids_and_memory(free.get("gpus"), kept_pids))
    free["own_containers"] = [c["id"] for c in ours]
    return Way(free, ours, sibling_gpus, kept_pids, on_gpus, used)


def own_gpus(way: Way) -> Optional[List[int]]:
    """The GPUs whose memory a launch waits for (None: all): never a sibling's, left running beside it."""
    gpus = way.free.get("gpus")
    return gpus if gpus is None or not way.sibling_gpus else [i for i in gpus if i not in way.sibling_gpus]


def pids_of(processes: List[Dict[str, Any]]) -> Set[int]:
    """The pids of processes as steps report them (a runtime that could not list says pid None)."""
    return set(p["pid"] for p in processes if isinstance(p.get("pid"), int))


def stop_in_the_way(
    a: ActRequest, out: ActResult, way: Way, targets: Dict[int, Dict[str, Any]], procs: Dict[int, ProcessInfo]
) -> None:
    """Stop what `classify` chose and wait for this deployment's GPU memory to come back. A stop waits only
    for what it stopped: what it leaves running (another user's process, a GPU tool) keeps its memory."""
    free, ours, kept_pids = way.free, way.ours, way.kept_pids
    stop_only = a["op"] == "stop"
    # A stop waits on its own GPUs, less the memory of what it leaves running there: what it did not stop,
    # and the servers of the deployments beside it (one on all GPUs shares them: its memory is not waited
    # for, the memory of what was stopped on them is)
    wait_gpus = free.get("gpus") if stop_only else own_gpus(way)
    held = set(kept_pids)
    if stop_only:
        siblings = set(int(g) for g in (free.get("siblings") or {}))
        beside = set(pid for pid, proc in procs.items() if proc["pgid"] in siblings)
        held |= pids_of(out["left"] + out.get("refused", [])) | beside
    if wait_gpus == free.get("gpus") and held == kept_pids:
        before = way.used
    else:
        before = nvml_pids_and_memory(wait_gpus, held)[1]
    # what the stop signals, read before stop_foreign_containers takes its own out of `targets`
    stopped = {**targets, **{c["pid"]: {"pgid": c["pid"]} for c in ours if isinstance(c.get("pid"), int)}}
    stopped_containers = stop_containers(ours, a["free"]["drain_s"]) + stop_foreign_containers(
        targets, a["free"]["drain_s"]
    )
    members = group_members(procs)  # each group's members: the stop adds those it holds, the sweep reads them
    out["ended"], out["forced"], left_in_groups = stop_targets(targets, procs, a["free"]["drain_s"], members)
    out["ended"] = stopped_containers + out["ended"]
    out["left"] = out["left"] + left_in_groups
    # gpus: those the readings are of, in their order: by index (None: every GPU)
    read = None if wait_gpus is None else sorted(wait_gpus)
    if stop_only and not (stopped or ours):  # nothing stopped: no memory is coming back
        out["memory"] = {"before_mib": before, "after_mib": before, "waited_s": 0.0, "gpus": read}
    else:
        held |= pids_of(left_in_groups) if stop_only else set()
        boxed = bool(ours) or any(t.get("container_cli") for t in stopped.values())
        aside = not_the_stops(procs, stopped, by_user=not boxed) if stop_only else None
        before, after, waited = wait_memory_released(
            before, a["free"]["memory_wait_s"], a["free"]["idle_mib"], wait_gpus, held, not (stopped or ours), aside
        )
        out["memory"] = {"before_mib": before, "after_mib": after, "waited_s": waited, "gpus": read}
    record_replaced(expand(a["lock"]["state_dir"]), free["replaced_names"], a["lock"]["deployment"])
    stopped_groups = set(t["pgid"] for t in targets.values())
    sweep_stopped_groups(dict((g, members.get(g, {})) for g in stopped_groups), free["siblings"])


if __name__ == "__main__":
    try:
        result = main()
    except Exception as exc:
        import traceback

        result = {"error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()[-3000:]}
    sys.stdout.write(json.dumps(result))
