"""`fleet status`: one row per deployment on a host, from its record and the processes the host runs."""

from __future__ import annotations

from typing import Any

from fleet.control.ops import recorded_names
from fleet.facts import HostFacts
from fleet.facts.parse import Proc
from fleet.facts.recorded import Recorded
from fleet.inventory import Host
from fleet.plan.placement import daemon_pids
from fleet.protocol import DEAD, READY, STARTING, UNVERIFIED
from fleet.startup import phase_now


def status_rows(host: Host, facts: HostFacts) -> list[dict[str, Any]]:
    """One row per deployment on the host (one saying "none" when it has none)."""
    names = recorded_names(facts)
    return [status_row(host, facts, n) for n in names] if names else [status_row(host, facts, None)]


def _launched_as(p: Proc, r: Recorded, uid: int) -> bool:
    """Whether process `p` is the one the record launched, not another given its pid since: this user's,
    and started when the record says (a record an older fleet wrote may not say)."""
    return (p.uid is None or p.uid == uid) and (r.start_ticks is None or p.start_ticks == r.start_ticks)


def status_row(host: Host, facts: HostFacts, deployment: str | None) -> dict[str, Any]:
    record = facts.remote.deployment(deployment) if deployment else None
    r = record.recorded if record else Recorded()
    pid = r.pid
    main = next((p for p in facts.servers if p.pid == pid and _launched_as(p, r, facts.uid)), None)
    alive = main is not None
    uptime = facts.uptime_s(main) if main else None
    status = r.status or ("unreadable" if record and (record.state_error or record.state) else "none")
    if (status == READY or (status in (STARTING, UNVERIFIED) and pid is not None)) and not alive:
        status = DEAD  # also "starting" with its engine gone: it crashed, or the run launching it died
    gpus = r.gpus
    return {
        "host": host.name,
        "deployment": deployment,
        "gpus": list(gpus) if gpus is not None else ("all" if record and record.state else None),
        "playbook": r.playbook,
        "engine": r.engine,
        "engine_version": r.engine_version,
        "pid": pid if alive else None,  # fleet's launcher: the process group it records and stops
        "engine_pid": engine_pid(facts, pid) if alive and pid is not None else None,
        "port": r.port,
        "uptime_s": round(uptime) if uptime is not None else None,
        "status": status,
        "attempts": r.attempts,
        "last_outcome": r.reason or status,
        "applied_fixes": list(r.applied_fixes),
        "container": str(r.container.get("name")) if r.container and r.container.get("name") else None,
        "other_servers": len([p for p in facts.servers if p.pgid not in _recorded_groups(facts)]),
        "group": _group_said(r),
        "weight_cache": r.cache_group if daemon_pids(facts, r) else None,
        # while it starts: its phase and ETA, as its watcher on the host last said them
        "startup": phase_now(record.phase, r.run_id, facts.time) if record and status == STARTING else None,
    }


def engine_pid(facts: HostFacts, launcher: int) -> int:
    """The engine's own process under fleet's launcher (the pid `nvidia-smi` and `fleet stop` show), or
    the launcher's when it has none (yet)."""
    child = next((p for p in facts.servers if p.ppid == launcher and p.engine), None)
    return child.pid if child else launcher


def _group_said(r: Recorded) -> str | None:
    """`rank 1 of 2 (node-a, node-b)` for a rank of a group (one model over several hosts)."""
    g = r.group
    if g is None or not isinstance(g.get("hosts"), list):
        return None
    return f"rank {g.get('rank')} of {len(g['hosts'])} ({', '.join(map(str, g['hosts']))})"


def _recorded_groups(facts: HostFacts) -> set[int]:
    return {d.recorded.pgid for d in facts.remote.deployments.values() if d.recorded.pgid is not None}
