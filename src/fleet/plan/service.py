"""What a service needs decided without touching a host: the router's command line, each replica's URL
as the router reaches it, whether a replica may be taken out of the router now, and the service's
health from what the router and the replicas' hosts said. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from fleet.facts.recorded import Recorded
from fleet.health.checks import CRITICAL, OK, WARNING, Check, worst
from fleet.model import GENERATE
from fleet.protocol import READY, StateRecord

ROUTER_MODULE = "sglang_router.launch_router"


def router_argv(python: str, bind: str, port: int, policy: str, metrics_port: int) -> list[str]:
    """The router with no workers: fleet registers each replica once it has proved it answers (the router
    started with --worker-urls refuses to start until every one is healthy, sglang #3802). Its metrics
    exporter gets a port of its own: left at 29000, a second router on the host cannot start."""
    return [
        python,
        "-m",
        ROUTER_MODULE,
        "--host",
        bind,
        "--port",
        str(port),
        "--policy",
        policy,
        "--prometheus-host",
        bind,
        "--prometheus-port",
        str(metrics_port),
    ]


def reachable_address(bind_address: str, address: str | None, name: str) -> str:
    """Where the router reaches a server on this host: the address it binds, unless that is every
    address, then the inventory's SSH address (or the host's name)."""
    return bind_address if bind_address not in ("0.0.0.0", "::") else (address or name)


def url_host(url: str) -> str:
    """The address part of a worker URL (http://[fd00::7]:30000 → fd00::7)."""
    rest = url.split("://", 1)[-1].rsplit(":", 1)[0]
    return rest[1:-1] if rest.startswith("[") else rest


@dataclass(frozen=True)
class ReplicaState:
    """One replica as the service sees it: where it is, what its host's record says, what the router says."""

    replica: str  # host/deployment
    url: str | None  # None: no port recorded (never deployed)
    status: str  # the deployment's status on its host ("ready", "dead", "none", "unreachable"...)
    registered: bool = False
    healthy_in_router: bool = False
    circuit_open: bool = False  # the router refuses to send it requests for now (its circuit breaker)

    @property
    def serving(self) -> bool:
        return self.status == READY and self.registered and self.healthy_in_router and not self.circuit_open

    @property
    def in_router(self) -> str:
        """What the router does with it, in a word or three."""
        if not self.registered:
            return "not registered"
        if self.circuit_open:
            return "circuit open (requests refused)"
        return "healthy" if self.healthy_in_router else "unhealthy"


@dataclass(frozen=True)
class KeptReplica:
    """A replica's last good record, as the service's record on the router's host keeps it: a roll keeps
    a serving replica's as it takes it out, a rollback redeploys it (on the host it ran on only)."""

    host: str | None
    good: StateRecord | None  # whole, as the replica's host wrote it: sent back as it is

    def refusal(self, host: str) -> str | None:
        """Why this record cannot be rolled back to on `host`; None when it can."""
        if self.good is None:
            return "no good record to roll back to"
        return None if self.host == host else f"its last good record is from host {self.host}, not {host}"


def kept_replicas(record: Mapping[str, object]) -> dict[str, KeptReplica]:
    """The service record's last good replicas, by deployment (a file on a host: anything else is none)."""
    replicas = record.get("replicas")
    out: dict[str, KeptReplica] = {}
    for name, entry in replicas.items() if isinstance(replicas, dict) else ():
        host, good = (entry.get("host"), entry.get("good")) if isinstance(entry, dict) else (None, None)
        kept = cast(StateRecord, good) if isinstance(good, dict) else None  # a deployment record, as written
        out[str(name)] = KeptReplica(host if isinstance(host, str) else None, kept)
    return out


def with_router(states: Sequence[ReplicaState], workers: Sequence[dict[str, Any]]) -> list[ReplicaState]:
    """The replicas' states with what the router's `GET /workers` says of each."""
    by_url: dict[str, list[dict[str, Any]]] = {}
    for w in workers:
        by_url.setdefault(str(w.get("url")), []).append(w)
    out = []
    for s in states:
        listed = by_url.get(s.url or "", [])
        healthy = bool(listed) and all(bool(w.get("is_healthy")) for w in listed)
        tripped = any(bool(w.get("circuit_open")) for w in listed)
        out.append(ReplicaState(s.replica, s.url, s.status, bool(listed), healthy, tripped))
    return out


def strangers(states: Sequence[ReplicaState], workers: Sequence[dict[str, Any]]) -> list[str]:
    """Workers the router routes to that are no replica of this service (someone added them by hand)."""
    ours = {s.url for s in states}
    return sorted({str(w.get("url")) for w in workers} - ours)


def take_out_refusal(replica: ReplicaState, states: Sequence[ReplicaState], min_healthy: int = 1) -> str | None:
    """Why `replica` may not leave the router now: fewer than `min_healthy` (at least one) would serve."""
    others = [s for s in states if s.replica != replica.replica and s.serving]
    if len(others) >= max(1, min_healthy):
        return None
    left = "no serving replica" if not others else f"{len(others)} serving, fewer than min_healthy {min_healthy}"
    return (
        f"taking {replica.replica} out would leave the router {left} "
        f"(serving: {', '.join(s.replica for s in states if s.serving) or 'none'})"
    )


def service_checks(
    router: Mapping[str, object], states: Sequence[ReplicaState], min_healthy: int, answer: dict[str, Any] | None
) -> list[Check]:
    """The service as a whole: the router up, at least `min_healthy` replicas serving through it, and a
    request through the router answered as the playbook's smoke test expects (`answer`; None: not sent)."""
    checks = []
    up = router.get("health") == 200
    checks.append(
        Check(
            "router",
            OK if up else CRITICAL,
            "answers /health"
            if up
            else f"router not answering (/health: {router.get('health') or router.get('text')})",
        )
    )
    serving = [s for s in states if s.serving]
    count_status = OK if len(serving) == len(states) else WARNING if len(serving) >= min_healthy else CRITICAL
    checks.append(
        Check(
            "replicas", count_status, f"{len(serving)} of {len(states)} serving through the router (min {min_healthy})"
        )
    )
    for s in states:
        if not s.serving:
            why = (
                f"its server is {s.status}"
                if s.status != READY
                else "not registered in the router"
                if not s.registered
                else "the router holds its circuit open: it refuses to send it requests"
                if s.circuit_open
                else "the router marks it unhealthy"
            )
            checks.append(Check("replica", WARNING, f"{s.replica}: {why}", deployment=s.replica))
    if answer is not None:
        ok = bool(answer.get("ok"))
        detail = (
            f"answered in {answer.get('seconds', 0):.2f}s"
            if ok
            else f"HTTP {answer.get('status')}: {answer.get('text', '')[:120]}"
        )
        checks.append(Check("routed_generation", OK if ok else CRITICAL, detail))
    return checks


def overall(checks: Sequence[Check]) -> str:
    return worst([c.status for c in checks])


def recorded_task(records: Mapping[str, Recorded]) -> str:
    """What the replicas' model serves, as their records' plans say (a replica's plan is its service's)."""
    tasks = [str(r.plan.get("task") or GENERATE) for r in records.values() if r.plan]
    return tasks[0] if tasks else GENERATE
