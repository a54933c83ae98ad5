"""Runs ON the host as the first part of fleet's act step (fleet.hostscripts): which processes are in the way
of a launch and stopping them -- fleet's own server, stale engines, and (only when forced) foreign holders
of the GPUs or the port -- then waiting for their GPU memory to be released.

Host code: standard library only (plus `pynvml` when the engine's environment has it), Python 3.8. The
policy itself (whose process is whose) is host_common.kill_verdict, tested on its own.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    kill_verdict  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import Lookup, engine_kind, engine_under, gpu_device_files, kill_verdict
    from fleet.host.container import container_names, container_of
    from fleet.host.procs import (
        boot_id,
        client_connections,
        device_holders,
        port_holders,
        process,
        start_ticks,
        table_lookup,
    )
    from fleet.host.signals import foreign_members, hold_process, hold_same_group, release, wait_ended
    from fleet.protocol import FreeRequest, ProcessInfo


def expand(path: str) -> str:
    return os.path.expanduser(path) if path else path


def recorded_group_is_ours(pgid: int, st: Mapping[str, object]) -> bool:
    """Whether the process group id fleet recorded still names the group it launched. A group id is a
    pid, and pids are reused, even within seconds: only the exact identity counts -- the same boot, the
    same pid, and its leader's start time in clock ticks exactly as recorded at launch. A record without
    them (older, or damaged) and a group whose leader is gone get no trust."""
    if st.get("pgid") != pgid or not st.get("boot_id") or st["boot_id"] != boot_id():
        return False
    recorded = st.get("start_ticks")
    return isinstance(recorded, int) and start_ticks(pgid) == recorded


def recorded_group(st: Mapping[str, object]) -> Optional[int]:
    """The process group a record (a deployment's, or its weight cache daemon's entry) names, when it is
    exactly the one fleet launched (a group id is a pid, and pids are reused)."""
    pgid = st.get("pgid")
    return pgid if type(pgid) is int and pgid > 1 and recorded_group_is_ours(pgid, st) else None


def recorded_groups(st: Mapping[str, object]) -> List[int]:
    """Every process group of a deployment its record names exactly: its server's, its weight cache daemon's."""
    cache = st.get("weight_cache")
    groups = (recorded_group(st), recorded_group(cache) if isinstance(cache, dict) else None)
    return [g for g in groups if g is not None]


def is_engine(p: ProcessInfo, lookup: Lookup) -> bool:
    """An inference engine (or fleet's launcher shell), by what the process runs and, for a worker known by
    its title, what started it (`lookup`: procs.table_lookup or procs.live_lookup): see host_common."""
    return engine_under(p["argv"], p["pid"], lookup) is not None


def smi_queries(*queries: str) -> Optional[List[str]]:
    """What `nvidia-smi` answers to each query, as CSV rows without units (None: no nvidia-smi answered)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    asked: List[subprocess.Popen[bytes]] = []
    try:  # at once: each start of nvidia-smi costs tens of milliseconds
        for query in queries:
            asked.append(
                subprocess.Popen(
                    [smi, query, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
                )
            )
        deadline = time.time() + 20
        return [p.communicate(timeout=max(0.0, deadline - time.time()))[0].decode() for p in asked]
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        for p in asked:
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()


def smi_pids_and_memory(
    indices: Optional[List[int]] = None, kept_pids: Optional[Set[int]] = None
) -> Tuple[Set[int], Optional[List[int]]]:
    """As nvml_pids_and_memory, from `nvidia-smi`: the Python running a step may have no NVML binding (the
    host's own python3, running the steps of a deployment in a container, usually has none)."""
    answers = smi_queries("--query-gpu=index,uuid,memory.used", "--query-compute-apps=gpu_uuid,pid,used_memory")
    if answers is None:
        return set(), None
    gpus, apps = answers
    chosen: Dict[str, int] = {}  # uuid -> its place in `used`
    used: List[int] = []
    for row in gpus.splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) == 3 and cells[0].isdigit() and (indices is None or int(cells[0]) in indices):
            chosen[cells[1]] = len(used)
            used.append(int(cells[2]) if cells[2].isdigit() else 0)
    pids = set()
    for row in apps.splitlines():
        cells = [c.strip() for c in row.split(",")]
        if len(cells) == 3 and cells[0] in chosen and cells[1].isdigit():
            pids.add(int(cells[1]))
            if kept_pids and int(cells[1]) in kept_pids and cells[2].isdigit():
                used[chosen[cells[0]]] -= int(cells[2])
    return pids, used if chosen else None


def nvml_pids_and_memory(
    indices: Optional[List[int]] = None, kept_pids: Optional[Set[int]] = None
) -> Tuple[Set[int], Optional[List[int]]]:
    """Processes on, and MiB used of, the GPUs `indices` (None: every GPU), less what `kept_pids` hold (a
    weight cache daemon kept for the next engine: NVML counts memory shared over CUDA IPC once, under the
    process that allocated it, docs/real-gpu.md); nvidia-smi without NVML."""
    try:
        import pynvml as n

        n.nvmlInit()
    except Exception:
        return smi_pids_and_memory(indices, kept_pids)
    try:
        pids, used, unsized = set(), [], False
        for i in range(n.nvmlDeviceGetCount()):
            if indices is not None and i not in indices:
                continue
            h = n.nvmlDeviceGetHandleByIndex(i)
            used.append(n.nvmlDeviceGetMemoryInfo(h).used // (1 << 20))
            try:
                listed = n.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:  # an older driver's binding, vGPU or MIG
                unsized = unsized or bool(kept_pids)
                continue
            pids |= set(p.pid for p in listed)
            used[-1] -= sum((p.usedGpuMemory or 0) >> 20 for p in listed if kept_pids and p.pid in kept_pids)
        if unsized:  # what the kept daemon holds there: nvidia-smi may say; the processes NVML listed stay
            smi_pids, smi_used = smi_pids_and_memory(indices, kept_pids)
            return pids | smi_pids, smi_used
        return pids, used
    finally:
        n.nvmlShutdown()


def all_gpu_indices(device_glob: str) -> Optional[List[int]]:
    """Every GPU of the host by NVML index (from the /dev/nvidiaN files when NVML cannot be asked)."""
    try:
        import pynvml as n

        n.nvmlInit()
        try:
            return list(range(n.nvmlDeviceGetCount()))
        finally:
            n.nvmlShutdown()
    except Exception:
        pass
    names = [os.path.basename(f) for f in gpu_device_files(device_glob)]
    found = sorted(int(x[6:]) for x in names if re.match(r"^nvidia\d+$", x))
    return found or None


def device_files_of(device_glob: str, indices: Optional[List[int]]) -> List[str]:
    """The GPU device files a deployment's processes hold: every one for a deployment on all GPUs;
    else only /dev/nvidiaN of its own GPUs (N is the GPU's minor number, which need not be its index).
    nvidiactl and nvidia-uvm are opened by every CUDA process: holding them says nothing about which GPU."""
    files = gpu_device_files(device_glob)
    if indices is None:
        return files
    minors = set(indices)
    try:
        import pynvml as n

        n.nvmlInit()
        try:
            minors = set(n.nvmlDeviceGetMinorNumber(n.nvmlDeviceGetHandleByIndex(i)) for i in indices)
        finally:
            n.nvmlShutdown()
    except Exception:  # no NVML binding (nvidia-smi only): minor numbers follow the indices on most boxes
        pass
    return [
        f for f in files if re.match(r"^nvidia(\d+)$", os.path.basename(f)) and int(os.path.basename(f)[6:]) in minors
    ]


def stale_groups(gpu_holders: Set[int], procs: Dict[int, ProcessInfo], me: int) -> Set[int]:
    """The process groups of the GPU holders that are engines of user `me`, outside containers."""
    lookup = table_lookup(procs)
    return set(
        procs[p]["pgid"]
        for p in gpu_holders
        if p in procs and is_engine(procs[p], lookup) and procs[p]["uid"] == me and not container_of(p)
    )


def own_command() -> Tuple[int, int]:
    """fleet's own command on the host: this process and its process group, never stopped."""
    return os.getpid(), os.getpgid(0)


def classify(
    a: FreeRequest, procs: Dict[int, ProcessInfo], on_gpus: Optional[Set[int]] = None
) -> Tuple[Dict[int, Dict[str, Any]], List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Split GPU holders and stale servers into what fleet stops, what it must not touch (refused: no
    launch unless forced) and what it leaves running (GPU daemons and tools).

    A deployment on some GPUs looks only at those GPUs, its port and its own recorded server; the
    servers of the host's other deployments (`siblings`: process group -> deployment) are never touched,
    those it was told to replace (`replaced`) are stopped like its own. `on_gpus`: the processes NVML
    lists on the deployment's GPUs, where the caller has read them already."""
    me = os.getuid()
    own_pid, own_pgid = own_command()
    recorded = a.get("recorded_pgid")
    gpus = a.get("gpus")
    siblings = dict((int(k), v) for k, v in (a.get("siblings") or {}).items())
    replaced = set(a.get("replaced") or [])
    targets, refused, left = {}, [], []
    port = a.get("port")
    owners, invisible = port_holders(port, a.get("bind_address", "0.0.0.0")) if port else (set(), False)
    listed = nvml_pids_and_memory(gpus)[0] if on_gpus is None else on_gpus
    gpu_holders = device_holders(device_files_of(expand(a["gpu_devices"]), gpus))[0] | listed
    candidates = owners | gpu_holders
    # A stale server is stopped whole: the other engines of the group of an engine of fleet's own user,
    # outside containers, that holds these GPUs. Only those: a process group is not a server's identity
    # (one script or ssh line starts many things), so another user's group, or a GPU tool's, adds nothing.
    holding = stale_groups(gpu_holders, procs, me)
    lookup = table_lookup(procs)
    cache, kept = a.get("cache_pgid"), a.get("kept_cache_pgid")  # the deployment's weight cache daemon
    for pid, proc in procs.items():
        if proc["pgid"] in (recorded, cache, *replaced) and proc["uid"] == me:
            candidates.add(pid)  # fleet's own server, every process of it (a worker, a resource tracker)
            continue
        if not is_engine(proc, lookup):
            continue
        # An engine is in the way only through what it holds (these GPUs, the port) or its group: never for
        # what it is called, even on all GPUs (a process titled sglang::scheduler_TP0 holding nothing
        # was stopped as an "inference server")
        if proc["pgid"] in (recorded, *replaced) or (proc["pgid"] in holding and proc["uid"] == me):
            candidates.add(pid)
    names: Optional[Dict[str, Tuple[str, str]]] = None
    for pid in sorted(candidates):
        if pid not in procs or procs[pid].get("state") == "Z":  # exited, not yet reaped: nothing to stop
            continue
        info = procs[pid]
        if kept is not None and info["pgid"] == kept and info["uid"] == me:  # kept for this launch
            continue
        container = container_of(pid)
        if container in (a.get("own_containers") or []):  # fleet's own: stopped by name (stop_containers)
            continue
        if container:  # another container's engine is somebody's server, never a stale one of fleet's
            names = container_names(["podman", "docker"]) if names is None else names
            cli, shown = names.get(container, ("", container[:12]))
            info = {**info, "container": shown, "container_id": container, "container_cli": cli}
        if info["pgid"] in siblings and info["pgid"] not in replaced and info["uid"] == me:
            if (pid in owners or pid in gpu_holders) and a.get("launching", True):  # in this launch's way
                refused.append(dict(info, why="deployment %s's server (--replace stops it)" % siblings[info["pgid"]]))
            continue  # a stop leaves the host's other deployments running, and has nothing to say of them
        verdict, why = kill_verdict(
            info,
            me=me,
            own=(own_pid, own_pgid),
            recorded_pgid=info["pgid"] if info["pgid"] in (cache, *replaced) else recorded,
            port=a.get("port") if pid in owners else None,
            force=a["kill_policy"] == "force",
            engine=is_engine(info, lookup),
        )
        if verdict == "leave":
            left.append(dict(info, why=why))
        elif verdict == "refuse":  # another user's job is said as such, whatever the words of `why`
            refused.append(dict(info, why=why, other_user=info["uid"] != me))
        elif verdict == "stop":
            replacing = (a.get("replaced_names") or {}).get(info["pgid"])
            if info["pgid"] in replaced and replacing:  # say which deployment --replace stopped
                why = "deployment %s's server (--replace)" % replacing
            elif cache is not None and info["pgid"] == cache and info["uid"] == me:
                why = "fleet's weight cache daemon"
            targets[pid] = dict(info, why=why)
    if invisible and port:
        refused.append({"pid": None, "user": "?", "cmdline": "?", "why": "port %d held by an invisible process" % port})
    return targets, refused, left


def idle_sglang(members: List[ProcessInfo]) -> bool:
    """An SGLang server with no client connection: SIGTERM would only wait for its watchdog's next 5 s
    tick (engines.md section 3.3) before the same kill_process_tree, so it is killed at once instead."""
    if not any(engine_kind(p["argv"]) == "sglang" for p in members):
        return False
    return client_connections([p["pid"] for p in members]) == 0


def group_members(procs: Dict[int, ProcessInfo]) -> Dict[int, Dict[int, Optional[int]]]:
    """Each process group's members in a process table, pid -> start ticks: what proves a group's id is
    still the group's later (signals.hold_same_group)."""
    read: Dict[int, Dict[int, Optional[int]]] = {}
    for p in procs.values():
        read.setdefault(p["pgid"], {})[p["pid"]] = p["start_ticks"]
    return read


def stop_targets(
    targets: Dict[int, Dict[str, Any]],
    procs: Dict[int, ProcessInfo],
    drain_s: float,
    read: Optional[Dict[int, Dict[int, Optional[int]]]] = None,
) -> Tuple[List[Dict[str, Any]], List[int], List[Dict[str, Any]]]:
    """SIGTERM process groups made only of engine processes (else the pids), wait, then SIGKILL; an idle
    SGLang group is SIGKILLed at once (nothing to drain).

    Every signal goes to a held process (host_signals): a target that exited during the drain cannot pass
    its SIGKILL on to whoever got its pid, and a group is signalled member by member, fleet's user's only:
    another user's process that joined it is named, never signalled. `read` (default: group_members) gains
    each member held, so a worker forked after `procs` was read proves its group's id for the sweep too."""
    me, own_pgid = os.getuid(), own_command()[1]
    lookup = table_lookup(procs)
    read = group_members(procs) if read is None else read
    held = {pid: hold_process(pid, info.get("start_ticks"), info.get("uid")) for pid, info in targets.items()}
    groups: Dict[int, List[int]] = {}
    for pid, info in targets.items():
        groups.setdefault(info["pgid"], []).append(pid)
    signalled = []  # (pgid, whole group?, idle SGLang?)
    for pgid in groups:
        members = [p for p in procs.values() if p["pgid"] == pgid]
        whole = pgid not in (0, 1, own_pgid) and all(p["pid"] in targets or is_engine(p, lookup) for p in members)
        signalled.append((pgid, whole, whole and idle_sglang(members)))

    def send(pgid: int, whole: bool, sig: int) -> List[int]:
        """Signal the targets of group `pgid`, or (whole) every member of fleet's user outside containers
        as the group is now (children forked since included); the pids that were signalled."""
        mine = [h for h in (held[p] for p in groups[pgid]) if h is not None]
        extra: Dict[int, Any] = {}
        if whole:  # the group as it is now, while its id is still the group read (pids are reused)
            ours = set(h.pid for h in mine)
            skip = lambda p: p["pid"] in ours or bool(container_of(p["pid"]))  # noqa: E731
            extra = hold_same_group(pgid, read.setdefault(pgid, {}), me, skip)
            read[pgid].update((pid, h.ticks) for pid, h in extra.items())
        try:
            return [h.pid for h in [*mine, *extra.values()] if h.send(sig)]
        finally:
            release(extra)

    for pgid, whole, idle in signalled:
        for pid in groups[pgid]:
            targets[pid]["stop"] = "idle: killed at once" if idle else "SIGTERM, drained"
            if held[pid] is None:
                targets[pid]["stop"] = "gone before it was signalled"
        send(pgid, whole, signal.SIGKILL if idle else signal.SIGTERM)
    wait_ended(held, time.time() + drain_s)
    forced: List[int] = []
    after_drain = "SIGKILL after the %g s drain window" % drain_s
    for pgid, whole, idle in signalled:
        killed = send(pgid, whole, signal.SIGKILL)
        if killed and not idle:
            forced.append(pgid if whole else killed[0])
            for pid in groups[pgid]:
                if whole or pid in killed:
                    targets[pid]["stop"] = after_drain
    wait_ended(held, time.time() + 5)
    release(held)
    left = []  # another user's processes in a stopped group: named, never signalled
    for pgid, whole, _ in signalled:
        for pid in foreign_members(pgid, me) if whole else []:
            member = procs.get(pid) or {"pid": pid, "pgid": pgid, "user": "?", "cmdline": "?"}
            if pid not in targets:
                left.append(dict(member, why="another user's process in the stopped group: not signalled"))
    return (
        [
            {
                "pid": p,
                "pgid": t["pgid"],
                "user": t["user"],
                "cmdline": t["cmdline"][:200],
                "why": t["why"],
                "stop": t.get("stop"),
            }
            for p, t in sorted(targets.items())
        ],
        forced,
        left,
    )


def not_the_stops(
    before: Dict[int, ProcessInfo], stopped: Dict[int, Dict[str, Any]], by_user: bool
) -> Callable[[Set[int]], Set[int]]:
    """Of the processes a reading finds on the GPUs, those a stop cannot have stopped, so their memory is
    not waited for: one started since the table `before` was read outside the groups the stop signalled
    (another user's job taking the freed GPUs, a sibling deployment restarted meanwhile), or, `by_user`,
    one of a user none of whose processes the stop signalled (fleet signals its own user's only). A stop
    that stopped a container passes `by_user` False: a container's processes may run as any user (root
    under docker, whose listing names no pid), and they are waited for. A process whose owner cannot be
    read (gone as it is read) is waited for."""
    groups = set(t.get("pgid") for t in stopped.values())
    users = set(before[pid]["uid"] for pid in stopped if pid in before) | {os.getuid()}

    def pick(listed: Set[int]) -> Set[int]:
        out = set()
        for pid in listed:
            now = process(pid)
            if now is None or now["uid"] is None:
                continue
            if (by_user and now["uid"] not in users) or (pid not in before and now["pgid"] not in groups):
                out.add(pid)
        return out

    return pick


def wait_memory_released(
    before: Optional[List[int]],
    timeout_s: float,
    ignore_mib: int,
    indices: Optional[List[int]] = None,
    kept_pids: Optional[Set[int]] = None,
    still: bool = False,
    aside: Optional[Callable[[Set[int]], Set[int]]] = None,
) -> Tuple[Optional[List[int]], Optional[List[int]], float]:
    """Until the GPUs `indices` (None: all) are idle but for what `kept_pids` hold (a weight cache daemon
    kept for the next engine) and what `aside` picks at each reading among the processes found there; a
    sibling deployment's memory is not waited for (not in `indices`).
    `still`: nothing was stopped since `before` was read, so it is the first reading."""
    start = time.time()
    held = set(kept_pids or ())

    def reading() -> Optional[List[int]]:
        listed, used = nvml_pids_and_memory(indices, held)
        more = aside(listed - held) if aside else set()
        if more:
            held.update(more)
            used = nvml_pids_and_memory(indices, held)[1]
        return used

    used = before if still else reading()
    while used is not None and time.time() - start < timeout_s:
        if all(u <= ignore_mib for u in used):
            break
        time.sleep(0.1)
        used = reading()
    return before, used, time.time() - start
