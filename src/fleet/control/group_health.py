"""A group (one model over several hosts) as a whole, after its deploy: its health (and heal) and its stop.
The deploy itself is control/group.py."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fleet.control import ops
from fleet.control.gather import read_facts
from fleet.control.group import GroupRun
from fleet.errors import DeployFailed, FleetError
from fleet.health.checks import CRITICAL, OK, UNKNOWN, Check
from fleet.inventory import Host
from fleet.protocol import FAILED, READY, STOPPED, ActResult


@dataclass
class GroupHealth:
    playbook: str
    status: str
    checks: list[Check]
    heal: str | None = None  # what healing did, when asked


def group_health(run: GroupRun, *, heal: bool, rank0_problems: Sequence[str] = ()) -> GroupHealth | None:
    """The group as a whole: every rank's recorded server alive and ready. None when the group was never
    deployed (or was stopped). Rank 0 may answer while another rank is gone (its collectives hang until
    NCCL's watchdog ends it): one rank down is the group down. `rank0_problems`: what the per-host check
    found wrong with rank 0's server (HTTP, a generation). `heal` relaunches the group whole, unless the
    last deploy gave it up (an operator decides then: a heal would only repeat the failure)."""
    name = run.playbook.name
    checks: list[Check] = []
    recorded_any = False
    broken = bool(rank0_problems)
    given_up = False
    for i, host in enumerate(run.hosts):
        try:
            with run.connect(host) as t:
                f = read_facts(t, host)
        except FleetError as exc:
            checks.append(Check(f"rank{i}", UNKNOWN, f"{host.name}: {exc.message}"))
            broken = True
            continue
        r = f.remote.deployment(name).recorded
        group = r.group
        if group is None or group.get("hosts") != [h.name for h in run.hosts]:
            checks.append(Check(f"rank{i}", CRITICAL, f"{host.name}: no record of rank {i} of this group"))
            broken = True
            continue
        recorded_any = recorded_any or r.status != STOPPED
        given_up = given_up or r.status == FAILED
        alive = any(p.pid == r.pid for p in f.servers)
        if r.status == READY and alive:
            checks.append(Check(f"rank{i}", OK, f"{host.name}: pid {r.pid} alive, ready"))
        else:
            why = "gone" if not alive else r.status
            checks.append(
                Check(
                    f"rank{i}",
                    CRITICAL,
                    f"{host.name}: rank {i} {why} ({r.reason or 'no reason recorded'})",
                )
            )
            broken = True
    if not recorded_any:
        return None
    for problem in rank0_problems:
        checks.append(Check("rank0", CRITICAL, f"{run.hosts[0].name}: {problem}"))
    if not broken:
        return GroupHealth(name, OK, checks)
    checks.append(Check("group", CRITICAL, "a rank is down: the group cannot serve (rank 0 may still answer /health)"))
    if not heal:
        return GroupHealth(name, CRITICAL, checks)
    if given_up:
        return GroupHealth(
            name, CRITICAL, checks, f"not healed: the last deploy gave it up (fleet deploy {name} after a fix)"
        )
    try:
        result = run.deploy()
    except FleetError as exc:
        return GroupHealth(name, CRITICAL, checks, f"relaunching the group failed: {exc.message}")
    if result.ok:
        return GroupHealth(name, OK, checks, f"relaunched the group whole (attempts: {len(result.attempts)})")
    return GroupHealth(name, CRITICAL, checks, f"relaunching the group failed: {result.reason}")


def stop_group(run: GroupRun) -> list[tuple[str, ActResult]]:
    """Stops every rank; returns each host's answer (what it stopped, left, refused, and GPU memory that
    did not come back), in the group's order. Raises DeployFailed when a host could not be reached or
    refused (the others are still stopped)."""
    answers: list[tuple[str, ActResult]] = []
    failures: list[str] = []

    def one(host: Host) -> ActResult:
        with run.connect(host) as t:
            return ops.stop(t, host, force=run.force, name=run.playbook.name)

    with ThreadPoolExecutor(max_workers=len(run.hosts)) as pool:
        futures = {h.name: pool.submit(one, h) for h in run.hosts}
    for name, f in futures.items():
        try:
            answers.append((name, f.result()))
        except FleetError as exc:
            failures.append(f"{name}: {exc.message}")
    if failures:
        raise DeployFailed("; ".join(failures), "The other ranks were stopped; run fleet stop again.")
    return answers
