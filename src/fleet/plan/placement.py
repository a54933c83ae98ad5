"""Where a deployment runs on its host: the GPUs asked for (indices, a count, or all of them), checked
against the GPUs the host has, the other deployments there and processes fleet does not own.

Pure: facts in, a placement or a refusal out. The act step checks the same again on the host, under
the host's guard, so two deploys placing themselves at once cannot both take a GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fleet.errors import PreflightError
from fleet.facts import HostFacts, Listener
from fleet.facts.recorded import Recorded
from fleet.host.common import safelisted
from fleet.host.records import record_gpus, record_ports
from fleet.plan.rules import nccl_port_for
from fleet.protocol import STOPPED

Asked = int | tuple[int, ...] | None


@dataclass(frozen=True)
class Occupant:
    """Another deployment on the host whose server runs (or whose deploy is under way) on `gpus`."""

    name: str
    gpus: tuple[int, ...]
    pid: int | None


@dataclass(frozen=True)
class Placement:
    name: str
    gpus: tuple[int, ...]  # nvidia-smi's indices (PCI bus order): what CUDA_VISIBLE_DEVICES lists
    how: str  # said with the plan
    replaces: tuple[Occupant, ...] = ()  # other deployments on these GPUs that --replace stops first


def daemon_pids(facts: HostFacts, record: Recorded) -> set[int]:
    """The GPU holders of the weight cache daemon a deployment's record names: of fleet's user only (a group
    id the record keeps may be reused by another user's job)."""
    cache = record.cache_group
    return {p.pid for p in facts.holders if cache is not None and p.pgid == cache and p.uid == facts.uid}


def occupants(facts: HostFacts, me: str) -> list[Occupant]:
    """The host's other deployments that hold GPUs now: a live recorded server, or a run under way."""
    every = tuple(g.index for g in facts.gpus)
    live = {p.pid for p in facts.servers}
    out = []
    for rec in facts.remote.deployments.values():
        if rec.name == me:
            continue
        pid = rec.recorded.pid
        running = pid is not None and pid in live and rec.recorded.status != STOPPED
        if not running and daemon_pids(facts, rec.recorded):  # its weight cache daemon holds the GPUs, no server
            running, pid = True, rec.recorded.cache_group
        if running:
            out.append(Occupant(rec.name, rec.gpus if rec.gpus is not None else every, pid))
        elif rec.lock_live:  # a run under way: its lock names the GPUs it is placing itself on
            claimed = record_gpus(rec.lock or {})
            out.append(Occupant(rec.name, tuple(claimed) if claimed is not None else every, None))
    return out


def busy_gpus(facts: HostFacts, me: str) -> dict[int, list[int]]:
    """GPU index -> pids using it (in NVML's list, or holding its /dev/nvidiaN) that are not deployment
    `me`'s own server nor a GPU daemon or tool: a count is never placed there. The servers of other
    deployments are among them, and so is a server started by hand, or one whose record was lost."""
    record = facts.remote.deployment(me).recorded
    mine = record.pgid
    own = {p.pid for p in facts.servers if mine is not None and p.pgid == mine} | daemon_pids(facts, record)
    tools = {p.pid for p in facts.holders if safelisted({"comm": p.comm, "cmdline": p.cmdline})}
    out: dict[int, list[int]] = {}
    for g in facts.gpus:
        users = sorted({p.pid for p in g.processes} | set(g.holders))
        others = [pid for pid in users if pid not in own and pid not in tools]
        if others:
            out[g.index] = others
    return out


def _stale_servers(facts: HostFacts, me: str) -> dict[int, int]:
    """pid -> process group of every engine server of fleet's own user, outside containers, that no
    deployment records: a stale server, started by hand or left by a run whose record is gone. Freeing
    stops it as it always stopped stale servers (host_common.kill_verdict: an engine of fleet's user).
    Nothing while another deployment's record is unreadable: its server would look stale."""
    if any(r.state_error for r in facts.remote.deployments.values() if r.name != me):
        return {}
    recorded = {r.recorded.pgid for r in facts.remote.deployments.values()}
    return {
        p.pid: p.pgid for p in facts.servers if p.uid == facts.uid and p.container is None and p.pgid not in recorded
    }


def stopped_with(facts: HostFacts, name: str, gpus: tuple[int, ...] | None) -> set[int]:
    """The process groups of the stale servers that freeing deployment `name`'s GPUs (every GPU: None)
    stops, each whole (fleet.host.free.classify): what they listen on is the deployment's to take."""
    stale, busy = _stale_servers(facts, name), busy_gpus(facts, name)
    return {stale[pid] for i in (busy if gpus is None else gpus) for pid in busy.get(i, ()) if pid in stale}


def _with_stale_servers(
    facts: HostFacts, me: str, asked: int, free: list[int], taken: set[int], busy: dict[int, list[int]]
) -> tuple[tuple[int, ...], str] | None:
    """`asked` GPUs from the free ones and those of as few stale servers as it takes (each is stopped
    whole): the servers holding most GPUs first, a GPU counted once every server on it is stopped. The
    reason names the stale servers' pids on the GPUs taken."""
    group_of = _stale_servers(facts, me)
    stale = {i: pids for i, pids in busy.items() if all(pid in group_of for pid in pids)}  # only theirs
    held: dict[int, set[int]] = {}
    for i, pids in stale.items():
        for pid in pids:
            held.setdefault(group_of[pid], set()).add(i)
    chosen: set[int] = set()
    for group in sorted(held, key=lambda g: (-len(held[g]), min(held[g]))):
        chosen.add(group)
        back = [i for i, pids in stale.items() if i not in taken and all(group_of[p] in chosen for p in pids)]
        closest = _closest(sorted({*free, *back}), asked, facts.gpu_topology)
        if closest is not None:
            stopped = ", ".join(map(str, sorted({pid for i in closest[0] if i in stale for pid in stale[i]})))
            why = f"{closest[1]}; a server no deployment records holds some (pids {stopped}): stopped as a stale server"
            return closest[0], why
    return None


# What a deployment whose playbook leaves gpus: out may take, widest last: it takes the first that holds
# the model (fleet.control.ops), so nothing is stopped that the free GPUs make unnecessary.
FREE, WITH_STALE, WITH_REPLACED = "free", "free or a stale server's", "free or a deployment's --replace stops"


def free_gpus(facts: HostFacts, me: str, reach: str = FREE) -> list[int]:
    """The GPUs deployment `me` may take: held by no other deployment and no process but its own server
    (FREE); also those only stale servers of fleet's user hold, stopped when it is freed (WITH_STALE);
    also other deployments', which --replace stops (WITH_REPLACED). Another user's process never."""
    taken = set() if reach == WITH_REPLACED else {i for o in occupants(facts, me) for i in o.gpus}
    stale = _stale_servers(facts, me) if reach != FREE else {}
    replaced = {r.recorded.pgid for r in facts.remote.deployments.values() if r.name != me}
    theirs = {p.pid for p in facts.servers if p.pgid in replaced} if reach == WITH_REPLACED else set()
    busy = {i for i, pids in busy_gpus(facts, me).items() if not all(p in stale or p in theirs for p in pids)}
    return [g.index for g in facts.gpus if g.index not in taken and g.index not in busy]


def gpu_owners(facts: HostFacts) -> dict[int, str]:
    """GPU index -> who holds it, as `fleet facts` shows it: a deployment of fleet's, or the pids of
    processes that are not (another user's job, a hand-started server)."""
    owners = {i: f"deployment {o.name}" for o in occupants(facts, "") for i in o.gpus}
    in_container = {p.pid: p.container for p in (*facts.servers, *facts.holders) if p.container}
    names = {c.id: c.name for c in facts.containers}
    for index, pids in busy_gpus(facts, "").items():
        if index not in owners:
            boxes = sorted(
                {names.get(str(in_container[pid]), str(in_container[pid])[:12]) for pid in pids if pid in in_container}
            )
            shown = "pids " + ", ".join(map(str, pids))
            owners[index] = f"container {', '.join(boxes)} ({shown})" if boxes else shown
    return owners


def place(
    name: str, asked: Asked, facts: HostFacts, *, replace: bool, where: str, take_stale: bool = False
) -> Placement:
    """`where` is the setting's `file:line` (or the option) for errors. `replace`: GPUs held by other
    deployments are taken, those deployments stopped first. `take_stale` (a count fleet chose, not the
    operator's): when too few GPUs are free, GPUs only stale servers hold are taken, and they are stopped."""
    indices = tuple(g.index for g in facts.gpus)
    others = occupants(facts, name)
    shown = _shown(indices)
    if isinstance(asked, tuple):
        missing = [i for i in asked if i not in indices]
        if missing:
            raise PreflightError(
                f"{where}: GPU {_shown(tuple(missing))} does not exist on {facts.host} (it has GPUs {shown}).",
                "List GPUs the host has (fleet facts shows them), or give a count: gpus: N.",
            )
        gpus, how = tuple(asked), f"GPUs {_shown(asked)} as asked"
    elif isinstance(asked, int):
        if asked > len(indices):
            raise PreflightError(
                f"{where}: {asked} GPUs asked for; {facts.host} has {len(indices)} (GPUs {shown}).",
                "Ask for fewer GPUs.",
            )
        taken = {i for o in others for i in o.gpus}
        busy = busy_gpus(facts, name)
        free = [i for i in indices if i not in taken and i not in busy]
        closest = _closest(free, asked, facts.gpu_topology)
        if closest is None and take_stale:  # the GPUs a stale server holds come back when it is stopped
            closest = _with_stale_servers(facts, name, asked, free, taken, busy)
        if closest is None and replace:  # free GPUs first; another deployment's only when they run out
            closest = _closest([i for i in indices if i not in busy or i in taken], asked, facts.gpu_topology)
        if closest is None:
            held = "; ".join(f"{_shown(o.gpus)}: deployment {o.name}" for o in others)
            users = {p.pid: p.user for p in (*facts.holders, *facts.servers)}
            foreign = "; ".join(
                f"GPU {i}: pids {', '.join(f'{pid} ({users[pid]})' if pid in users else str(pid) for pid in p)}"
                for i, p in busy.items()
                if i not in taken
            )
            raise PreflightError(
                f"{where}: {asked} free GPUs asked for; {facts.host} has {len(free)} free "
                f"({'; '.join(x for x in (held, foreign) if x) or 'none held'}).",
                _hint(bool(held), bool(foreign)),
            )
        gpus, how = closest[0], f"{asked} free GPU{'' if asked == 1 else 's'} picked: {_shown(closest[0])}{closest[1]}"
    else:
        gpus, how = indices, f"all {len(indices)} GPUs"
    clash = tuple(o for o in others if set(o.gpus) & set(gpus))
    if clash and not replace:
        raise PreflightError(
            f"{where}: GPUs {_shown(gpus)} for deployment {name} overlap "
            + "; ".join(
                f"deployment {o.name} on GPUs {_shown(o.gpus)}" + (f" (pid {o.pid})" if o.pid else " (deploying now)")
                for o in clash
            )
            + ".",
            "Place it on other GPUs (gpus: in the playbook, or --gpus), or pass --replace to stop "
            + ("those deployments" if len(clash) > 1 else f"{clash[0].name}")
            + " first.",
        )
    return Placement(name, tuple(gpus), how, clash)


def _hint(deployments: bool, foreign: bool) -> str:
    """What to do when too few GPUs are free: other deployments hold some, processes fleet did not start
    (another user's, a server in a container) hold others, or both."""
    said = []
    if deployments or not foreign:
        said.append("Stop a deployment there first, pass --replace to take its GPUs, or ask for fewer.")
    if foreign:
        said.append(
            "Processes fleet did not start are never placed over: name the GPUs (gpus: [...] or --gpus) and "
            "pass --force to stop them, or ask for fewer."
        )
    return " ".join(said)


# NVML's topology levels (nvmlGpuTopologyLevel_t): how close two GPUs are, as a placement says it.
LINKS = {0: "one board", 10: "one PCIe switch", 20: "PCIe switches", 30: "one host bridge", 40: "one NUMA node"}
LINKS_APART = "across NUMA nodes"
MAX_SEARCHED_GPUS = 16  # every subset is weighed up to here (16 choose 8 is 12870); beyond, adjacency


def _closest(free: Sequence[int], n: int, topology: dict[tuple[int, int], int]) -> tuple[tuple[int, ...], str] | None:
    """n free GPUs that share the closest links: the fewest hops between the farthest pair, then in all
    (NCCL's all-reduce runs at the pace of the slowest link). Without NVML's topology, adjacent indices
    (neighbours usually share a PCIe switch), else the lowest n."""
    if len(free) < n:
        return None
    known = all((a, b) in topology for a, b in itertools.combinations(free, 2))
    if topology and known and len(free) <= MAX_SEARCHED_GPUS and n > 1:

        def cost(group: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
            links = [topology[pair] for pair in itertools.combinations(group, 2)]
            return max(links), sum(links), group

        best = min(itertools.combinations(free, n), key=cost)
        worst = cost(best)[0]
        return best, f" ({LINKS.get(worst, LINKS_APART)})"
    for start in range(len(free) - n + 1):
        window = free[start : start + n]
        if window[-1] - window[0] == n - 1:
            return tuple(window), ""
    return tuple(free[:n]), ""


def _shown(gpus: Sequence[int]) -> str:
    return ",".join(map(str, gpus))


PORT_STEP = 10  # SGLang's DP-attention ports sit at port+233..+239: neighbours 10 apart never share them


def port_for(
    name: str,
    wanted: int,
    facts: HostFacts,
    bind_address: str = "0.0.0.0",
    stopping: Collection[int] = (),
    replacing: Collection[str] = (),
) -> tuple[int, str]:
    """The deployment's HTTP port: the one it already has (a redeploy keeps its endpoint), else the
    playbook's, unless another deployment on the host uses it or its internal base (then the next one,
    in steps of PORT_STEP, that no deployment records and nothing else listens on). A port is free once
    what holds it is stopped first: process groups freeing stops (`stopping`: stopped_with), deployments
    --replace stops (`replacing`)."""
    taken: dict[int, str] = {}
    replaced = set()
    for rec in facts.remote.deployments.values():
        if rec.name in replacing:
            replaced.add(rec.recorded.pgid)
        elif rec.name != name and rec.recorded.status != STOPPED:
            taken.update((p, rec.name) for p in rec.recorded.ports)
        if rec.name != name and rec.lock_live and rec.lock:  # a run under way claims the ports it plans
            taken.update((p, rec.name) for p in record_ports(rec.lock))
    own = facts.remote.deployment(name).recorded.port
    own_group = facts.remote.deployment(name).recorded.pgid
    # what a port's listener belongs to: its server's process group; one that is stopped first counts only
    # when it is fleet's user's own, outside containers (another user's process in that group is refused)
    groups = {p.pid: p.pgid for p in facts.servers}
    ours = {p.pid for p in facts.servers if p.uid == facts.uid and p.container is None}

    def gone(listener: Listener) -> str | None:
        """'own', 'stale' or 'replaced' when the listener is gone by the launch; None when it stays."""
        group = groups.get(listener.pid) if listener.pid is not None else None
        if group is not None and group == own_group:
            return "own"
        if group is None or listener.pid not in ours:
            return None
        return "stale" if group in stopping else "replaced" if group in replaced else None

    def free(port: int) -> bool:
        if port in taken or nccl_port_for(port) in taken:
            return False
        return all(gone(lst) for lst in facts.port_holders(port, bind_address))

    if free(wanted):
        reasons = {gone(lst) for lst in facts.port_holders(wanted, bind_address)}
        if "stale" in reasons:
            return wanted, f"port {wanted} is a stale server's, stopped first"
        return wanted, f"port {wanted} is a replaced deployment's, stopped first" if "replaced" in reasons else ""
    if isinstance(own, int) and own != wanted and free(own):
        return own, f"port {wanted} is deployment {taken.get(wanted, '?')}'s: {name} keeps {own}"
    port = wanted
    while not free(port):
        port += PORT_STEP
        if port > 65535 - 10000:
            raise PreflightError(
                f"{facts.host}: no free port for deployment {name} from {wanted} on.", "Set port: in the playbook."
            )
    clash = taken.get(wanted) or taken.get(nccl_port_for(wanted))
    why = f"deployment {clash}'s" if clash else "in use"
    return port, f"port {wanted} is {why}: {name} uses {port}"
