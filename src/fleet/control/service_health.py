"""A service as a whole, after `fleet up`: its health (and heal) and `fleet down`. Bringing it up and
rolling it: control/service.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleet.control import ops
from fleet.control.gather import read_facts
from fleet.control.host_steps import HostLink
from fleet.control.outcomes import ReplicaOutcome
from fleet.control.service import REGISTER_WAIT_S, ServiceRun
from fleet.errors import DeployFailed, FleetError, HostStepError
from fleet.inventory.services import PlacedReplica
from fleet.plan.service import ReplicaState, recorded_task, service_checks, strangers
from fleet.protocol import READY, RouterAction
from fleet.terminal import safe_line


@dataclass
class ServiceHealth:
    service: str
    status: str
    checks: list[Any]
    states: list[ReplicaState]
    heal: list[str] = field(default_factory=list)


def service_health(run: ServiceRun, *, heal: bool, ask: bool = True) -> ServiceHealth | None:
    """The service as a whole; `heal` starts a router that died and registers again each ready replica
    the router lost (a dead replica is restarted by the host's own heal, which `fleet health --heal`
    runs first). None: the service is not up (`fleet up` never ran, or `fleet down` did)."""
    from fleet.plan.service import overall

    with run.session() as rt:
        router = run.router(rt, {"do": "health"})[0]
        if not router.get("up"):  # never brought up (or taken down): a file, not a service to check
            return None
        healed = []
        busy = run.busy(rt) if heal else None
        if busy:  # a roll takes replicas out on purpose: healing now would undo its work
            healed.append(f"not healed: {busy}")
            heal = False
        if heal and router.get("health") != 200 and not router.get("router_running"):
            run.ensure_router(rt, replace=False)
            healed.append("router started again")
            router = run.router(rt, {"do": "health"})[0]
        if router.get("health") != 200:  # each replica's own state still says what would serve
            states = run.states(rt, router_up=False)[0]
            checks = service_checks(router, states, run.service.spec.min_healthy, None)
            return ServiceHealth(run.service.name, overall(checks), checks, states, healed)
        states, workers, records = run.states(rt)
        if heal:
            lost = [s for s in states if s.status == READY and s.url and not s.registered]
            if lost:
                adds: list[RouterAction] = [
                    {"do": "add", "url": s.url, "wait_s": REGISTER_WAIT_S} for s in lost if s.url
                ]
                run.router(rt, *adds)
                healed += [f"registered {s.replica} again" for s in lost]
                states, workers, records = run.states(rt)
        answer = run.ask(rt, recorded_task(records)) if ask and any(s.serving for s in states) else None
        if ask and answer is None:
            answer = {"ok": False, "status": None, "text": "no replica serves through the router"}
        checks = service_checks(router, states, run.service.spec.min_healthy, answer)
        extra = strangers(states, workers)
        if extra:
            from fleet.health.checks import WARNING, Check

            checks.append(Check("router_workers", WARNING, f"the router also routes to {', '.join(extra)}"))
        return ServiceHealth(run.service.name, overall(checks), checks, states, healed)


def service_down(run: ServiceRun) -> tuple[list[str], list[FleetError]]:
    """Deregister and stop every replica, then stop the router: what was done, one line each, and what
    failed (a replica whose host could not be reached still runs)."""
    done = []
    with run.session() as rt, run.exclusive(rt, "down"):
        running = run.router(rt, {"do": "health"})[0].get("router_running")
        if running:
            try:
                workers = run.router(rt, {"do": "workers"})[0]["workers"]
                if workers:
                    removes: list[RouterAction] = [{"do": "remove", "url": str(w["url"])} for w in workers]
                    run.router(rt, *removes)
                    done.append(f"deregistered {len(workers)} worker(s)")
            except (DeployFailed, HostStepError) as exc:  # a router answering nonsense is still stopped
                done.append(f"workers not deregistered ({exc.message}); the replicas and router are stopped")

        def stop_one(t: HostLink, r: PlacedReplica) -> ReplicaOutcome:
            facts = read_facts(t, run.host(r))
            if r.deployment not in facts.remote.deployments:
                return ReplicaOutcome(r, note="not deployed")
            other = facts.remote.deployment(r.deployment).recorded.other_owner(run.service.name, run.playbook.name)
            if other:
                return ReplicaOutcome(r, note=safe_line(f"left as it is: {other}, not a replica of this service"))
            out = ops.stop(t, run.host(r), force=False, name=r.deployment)
            return ReplicaOutcome(r, note=f"stopped {len(out.get('ended', []))} process(es)")

        outcomes = run.by_host(stop_one)
        for o in outcomes:
            done.append(f"{o.name}: {o.note or f'NOT stopped: {o.error}'}")
        stopped = run.router(rt, {"do": "stop"})[0].get("ended_pid")
        done.append(f"router stopped (pid {stopped})" if stopped else "router was not running")
    return done, [o.error for o in outcomes if o.error]
