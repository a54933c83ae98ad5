"""Services: replicas of one playbook behind the real SGLang router, kept by fleet.

`up` starts the router (with no workers), deploys every replica through the normal deploy loop (hosts in
parallel), registers exactly the replicas that proved they answer, and proves a request through the
router. `roll` restarts the replicas one at a time: out of the router, drained, redeployed, proved,
back in; it stops at the first replica that fails (the others keep serving) and never takes out the
last serving replica. `rollback` redeploys a failed replica's last good record. The router is driven
on its host by fleet's router step (host/router.py), so it needs no port open to the control machine.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace
from typing import Any

import msgspec

from fleet import events
from fleet.control import ops, placing
from fleet.control.act_request import owner, run_id
from fleet.control.gather import read_facts
from fleet.control.host_steps import HostLink, steps_of
from fleet.control.outcomes import ReplicaOutcome, ServiceResult
from fleet.control.status_rows import status_row
from fleet.crashes import Signature
from fleet.errors import DeployFailed, FleetError, LockedError, PreflightError
from fleet.facts.recorded import Recorded
from fleet.host.common import base_url
from fleet.inventory import Host, Inventory, NamedPlaybook
from fleet.inventory.services import NamedService, PlacedReplica
from fleet.plan.service import (
    KeptReplica,
    ReplicaState,
    kept_replicas,
    reachable_address,
    recorded_task,
    router_argv,
    take_out_refusal,
    url_host,
    with_router,
)
from fleet.protocol import READY, RouterAction, RouterRequest, StateRecord
from fleet.step_answers import RouterResult
from fleet.terminal import safe_line

Connect = Callable[[Host], AbstractContextManager[HostLink]]
REGISTER_WAIT_S = 60.0
ANOTHERS = "another's"  # a replica's status where its name holds a deployment not of this service
LEASE_TTL_S = 60.0  # a service's lease untouched this long was left by a run that died


def replica_playbook(playbook: NamedPlaybook, r: PlacedReplica, replicas: list[PlacedReplica]) -> NamedPlaybook:
    """The playbook as replica `r` runs it: replicas that share a host and leave gpus: out take as many
    GPUs as the model needs each (gpus: fit), not the whole box the first of them would take alone."""
    sharing = sum(1 for x in replicas if x.host == r.host) > 1
    if r.gpus is not None or not sharing or not placing.takes_free_gpus(playbook):
        return playbook
    return replace(playbook, spec=msgspec.structs.replace(playbook.spec, gpus="fit"))


class ServiceRun:
    """One command on one service. `connect` opens a transport to a host (the CLI's pool-aware one)."""

    def __init__(
        self,
        service: NamedService,
        inventory: Inventory,
        playbook: NamedPlaybook,
        connect: Connect,
        progress_for: Callable[[str], events.Sink],
        signatures: tuple[Signature, ...] | None = None,
    ) -> None:
        self.service, self.inventory, self.playbook = service, inventory, playbook
        self.connect, self.progress_for, self.signatures = connect, progress_for, signatures
        self.replicas = service.replicas(inventory)
        self.router_host = inventory.hosts[service.router_host(inventory)]
        spec, s = service.spec.router, self.router_host.settings
        self.python = spec.python or s.engines.get("sglang") or "python3"
        self.argv = router_argv(self.python, s.bind_address, spec.port, spec.policy, spec.metrics)
        self.common: RouterRequest = {
            "service": service.name,
            "state_dir": s.state_dir,
            "log_dir": s.log_dir,
            "port": spec.port,
            "metrics_port": spec.metrics,
            "bind": s.bind_address,
            "source": str(service.path.resolve()),  # another file of the same name is another service
        }
        self.endpoint = base_url(reachable_address(s.bind_address, s.address, self.router_host.name), spec.port)
        self.progress = progress_for(f"service/{service.name}")
        self._stack: ExitStack | None = None
        self._open: dict[str, HostLink] = {}
        self._lock = threading.Lock()
        self._refusal = ""  # why the roll stopped before a replica (set by _roll_one)
        self.circuit_wait_s = 90.0  # how long a roll waits for an open circuit to close (the router's is 60 s)

    @contextmanager
    def session(self) -> Iterator[HostLink]:
        """One connection per host for a whole command (a roll talks to each host several times), closed
        at its end; yields the router host's."""
        with ExitStack() as stack:
            self._stack, self._open = stack, {}
            try:
                yield self.on(self.router_host)
            finally:
                self._stack, self._open = None, {}

    def on(self, host: Host) -> HostLink:
        """The session's connection to `host` (hosts are reached from several threads, each host from one)."""
        with self._lock:
            if host.name not in self._open:
                assert self._stack is not None, "on() outside a session"
                self._open[host.name] = self._stack.enter_context(self.connect(host))
            return self._open[host.name]

    # --- the service's own lock ---------------------------------------------------------------------

    @contextmanager
    def exclusive(self, rt: HostLink, command: str) -> Iterator[None]:
        """Holds the service's lease (on the router's host) while `command` changes the service: a second
        up, roll or down at once is refused, not interleaved. The lease is touched from a thread of its
        own over its own connection; one left by a run that died expires after LEASE_TTL_S."""
        lease: RouterAction = {
            "do": "lease",
            "run_id": run_id(),
            "owner": owner(),
            "command": command,
            "ttl_s": LEASE_TTL_S,
        }
        got = self.router(rt, lease)[0]
        if got.get("held"):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(got.get("since") or 0)))
            raise LockedError(
                f"service {self.service.name}: {got.get('owner')} is running `{got.get('command')}` on it since "
                f"{since}; nothing was changed.",
                f"Wait for it to end (a lease left by a run that died expires after {LEASE_TTL_S:.0f} s).",
            )
        done = threading.Event()

        def keep() -> None:
            with contextlib.suppress(FleetError), self.connect(self.router_host) as t:
                while not done.wait(LEASE_TTL_S / 4):
                    with contextlib.suppress(FleetError):
                        self.router(t, lease)

        keeper = threading.Thread(target=keep, name="service-lease", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            done.set()
            keeper.join(timeout=10)
            release: RouterAction = {**lease, "release": True}
            with contextlib.suppress(FleetError):
                self.router(rt, release)

    def busy(self, rt: HostLink) -> str | None:
        """Who holds the service's lease now, in words; None when nobody does."""
        got = self.router(rt, {"do": "lease", "run_id": "", "ttl_s": LEASE_TTL_S, "peek": True})[0]
        return f"`{got.get('command')}` by {got.get('owner')} is under way" if got.get("held") else None

    # --- the router ---------------------------------------------------------------------------------

    def router(self, t: HostLink, *actions: RouterAction, timeout_s: float = 300.0) -> list[RouterResult]:
        request: RouterRequest = {**self.common, "actions": list(actions)}
        results = steps_of(t).router(self.python, request, timeout_s=timeout_s).get("results") or []
        failed = next((r for r in results if "error" in r), None)
        if failed is None:
            return results
        where = f"{self.router_host.name}: the router of service {self.service.name}"
        if "foreign" in failed:
            raise PreflightError(
                f"{where}: {failed['error']}; nothing was changed.",
                f"Two service files are named {self.service.name}: rename one (each replica's deployment is "
                "named after it too), or take the other down with its own file first.",
            )
        if failed.get("do") == "ensure" and "holders" in failed:
            held = ", ".join(
                f"pid {p.get('pid')} ({p.get('user')}: {str(p.get('cmdline'))[:60]})" for p in failed["holders"]
            )
            raise PreflightError(
                f"{where}: {failed['error']}{' by ' + held if held else ' by another user'}; nothing was changed.",
                f"Free the port, or change router: port: or metrics_port: in {self.service.path}.",
            )
        tail = "\n".join(failed.get("log_tail") or [])
        hint = (
            f"Is sglang-router installed for {self.python}? (pip install sglang-router)"
            if "No module named" in tail
            else f"Its log: {self.common['log_dir']}/router-{self.service.name}.log"
        )
        raise DeployFailed(f"{where}: {failed.get('do')}: {failed['error']}" + (f"\n{tail}" if tail else ""), hint)

    def ensure_router(self, t: HostLink, *, replace: bool) -> RouterResult:
        """The router running; `replace`: also when it runs with other options (only `fleet up` does: a new
        router starts with no workers, so requests fail until they are registered again)."""
        result = self.router(t, {"do": "ensure", "argv": self.argv, "wait_s": 60, "replace": replace})[0]
        if result.get("differs"):
            said = f"router options changed in {self.service.path}; `fleet up {self.service.name}` applies them"
            self.progress(events.ServiceStep(self.service.name, said + " (a new router: a brief outage)"))
        what = "running" if result["router"] == "running" else "started"
        replaced = f", replacing pid {result['replaced']} (its options changed)" if result.get("replaced") else ""
        self.progress(
            events.ServiceStep(self.service.name, f"router {what} at {self.endpoint} (pid {result['pid']}){replaced}")
        )
        return result

    def ask(self, t: HostLink, task: str) -> dict[str, Any]:
        """The smoke check through the router; `task`: what the replicas' model serves (fleet.model)."""
        smoke = ops.smoke_of(self.playbook, task)
        answer: dict[str, Any] = self.router(
            t, {"do": "ask", "served_name": self.playbook.spec.served_name, "smoke": smoke}
        )[0]["answer"]
        return answer

    # --- replicas -----------------------------------------------------------------------------------

    def host(self, replica: PlacedReplica) -> Host:
        return self.inventory.hosts[replica.host]

    def reachable(self, replica: PlacedReplica) -> str:
        s = self.host(replica).settings
        return reachable_address(s.bind_address, s.address, replica.host)

    def url_of(self, replica: PlacedReplica, port: Any) -> str | None:
        return base_url(self.reachable(replica), port) if isinstance(port, int) else None

    def by_host(self, fn: Callable[[HostLink, PlacedReplica], ReplicaOutcome]) -> list[ReplicaOutcome]:
        """fn for every replica: hosts in parallel, one host's replicas in turn (placement is decided per host)."""
        hosts: dict[str, list[PlacedReplica]] = {}
        for r in self.replicas:
            hosts.setdefault(r.host, []).append(r)

        def on_host(replicas: list[PlacedReplica]) -> list[ReplicaOutcome]:
            try:
                t = self.on(self.host(replicas[0]))
                return [fn(t, r) for r in replicas]
            except FleetError as exc:  # the host could not be reached
                return [ReplicaOutcome(r, error=exc) for r in replicas]

        with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
            done = [o for group in pool.map(on_host, hosts.values()) for o in group]
        order = {r.deployment: i for i, r in enumerate(self.replicas)}
        return sorted(done, key=lambda o: order[o.replica.deployment])

    def _deploy(self, t: HostLink, r: PlacedReplica, *, relaunch: bool) -> ReplicaOutcome:
        """`relaunch`: the roll's redeploy; else `up`'s, which leaves a replica serving another plan alone."""
        try:
            result = ops.deploy(
                t,
                self.host(r),
                replica_playbook(self.playbook, r, self.replicas),
                force=False,
                engine_check=True,
                progress=self.progress_for(f"{r.host}/{r.deployment}"),
                signatures=self.signatures,
                name=r.deployment,
                gpus=r.gpus,
                relaunch=relaunch,
                drain_s=self.service.spec.drain_s,
                keep_other_plan=not relaunch,
                service=self.service.name,
            )
        except FleetError as exc:
            return ReplicaOutcome(r, error=exc)
        return ReplicaOutcome(r, result=result, url=self.url_of(r, result.plan.port))

    def _record(self, t: HostLink, r: PlacedReplica) -> Recorded:
        return read_facts(t, self.host(r)).remote.deployment(r.deployment).recorded

    def states(
        self, t: HostLink, *, router_up: bool = True
    ) -> tuple[list[ReplicaState], list[dict[str, Any]], dict[str, Recorded]]:
        """Each replica's state (its host's record and the router's view, unless the router is down), the
        router's workers, and each replica's record (by deployment)."""
        records: dict[str, Recorded] = {}

        def look(t: HostLink, r: PlacedReplica) -> ReplicaOutcome:
            facts = read_facts(t, self.host(r))
            row = status_row(self.host(r), facts, r.deployment)
            records[r.deployment] = record = facts.remote.deployment(r.deployment).recorded
            if record.other_owner(self.service.name, self.playbook.name):
                return ReplicaOutcome(r, note=ANOTHERS)
            return ReplicaOutcome(r, url=self.url_of(r, row.get("port")), note=str(row["status"]))

        looked = self.by_host(look)
        workers = self.router(t, {"do": "workers"})[0]["workers"] if router_up else []
        plain = [ReplicaState(o.name, o.url, "unreachable" if o.error else o.note or "none") for o in looked]
        return with_router(plain, workers), workers, records

    def others(self, records: dict[str, Recorded]) -> str | None:
        """Why the replicas may not be touched: a replica's name holds another's deployment (left as it is)."""
        name = self.service.name
        for r in self.replicas:
            other = records[r.deployment].other_owner(name, self.playbook.name) if r.deployment in records else None
            if other:
                return safe_line(f"{r.host}/{r.deployment} is {other}, not a replica of {name}; it was left as it is")
        return None

    # --- commands -----------------------------------------------------------------------------------

    def up(self) -> ServiceResult:
        with self.session() as rt, self.exclusive(rt, "up"):
            self.ensure_router(rt, replace=True)
            outcomes = self.by_host(lambda t, r: self._deploy(t, r, relaunch=False))
            ready = [o for o in outcomes if o.ok and o.url]
            urls = [o.url for o in ready if o.url]
            workers = self.router(rt, {"do": "workers"})[0]["workers"]
            wanted = set(urls)
            # a replica fleet could not deploy (its host unreachable, its new plan refused) may still serve:
            # its worker stays; one whose deploy ran and failed has no server left
            unknown = {self.reachable(o.replica) for o in outcomes if o.result is None}
            stale = sorted(u for u in {str(w["url"]) for w in workers} - wanted if url_host(u) not in unknown)
            actions: list[RouterAction] = [{"do": "remove", "url": u} for u in stale]
            actions += [{"do": "add", "url": u, "wait_s": REGISTER_WAIT_S} for u in urls]
            if ready:
                actions.append(self._remember_good(ready))
            if actions:
                self.router(rt, *actions)
            for u in stale:
                self.progress(events.ServiceStep(self.service.name, f"deregistered {u} (not a ready replica of it)"))
            for o in ready:
                self.progress(events.ServiceStep(self.service.name, f"registered {o.url}", o.name))
            answer = self.ask(rt, ready[0].result.plan.task) if ready and ready[0].result else None
        return self._result(outcomes, answer)

    def _remember_good(self, done: list[ReplicaOutcome]) -> RouterAction:
        """The router-step action that keeps each proved replica's record as its last good one."""
        good = {
            o.replica.deployment: {
                "host": o.replica.host,
                "good": self._record(self.on(self.host(o.replica)), o.replica).raw,  # sent back whole on rollback
            }
            for o in done
        }
        return {"do": "remember", "replicas": good}

    def _result(
        self, outcomes: list[ReplicaOutcome], answer: dict[str, Any] | None, stopped: str = "", nothing: str = ""
    ) -> ServiceResult:
        failed = [o for o in outcomes if not o.ok]
        routed = bool(answer and answer.get("ok"))
        if stopped:
            reason = stopped
        elif failed:
            reason = f"{len(failed)} of {len(self.replicas)} replicas failed: {', '.join(o.name for o in failed)}"
        elif not routed:
            reason = f"a request through the router did not answer as expected: {(answer or {}).get('text', '')[:200]}"
        else:
            done = nothing or f"{len(outcomes)} replica(s) done"
            reason = f"{done}; a request through the router answered"
        return ServiceResult(
            self.service.name, not failed and routed and not stopped, reason, self.endpoint, outcomes, answer
        )

    def roll(self, *, rollback: bool = False) -> ServiceResult:
        """Restart the replicas one at a time (or, with `rollback`, redeploy each replica that is not serving
        from its last good record), never leaving fewer than `min_healthy` (at least one) serving. Replicas
        that do not serve go first: they cost no capacity, and they may be what later ones need."""
        with self.session() as rt, self.exclusive(rt, "restart --rollback" if rollback else "restart"):
            started = self.ensure_router(rt, replace=False)["router"] == "started"
            states, workers, records = self.states(rt)
            if (others := self.others(records)) is not None:
                return self._result([], None, others)
            if started:  # a new router knows no workers: the ready replicas first
                adds: list[RouterAction] = [
                    {"do": "add", "url": s.url, "wait_s": REGISTER_WAIT_S}
                    for s in states
                    if s.status == READY and s.url
                ]
                if adds:
                    self.router(rt, *adds)
                states, workers, records = self.states(rt)
            kept = kept_replicas(self.router(rt, {"do": "recall"})[0]["record"]) if rollback else {}
            order = sorted(range(len(self.replicas)), key=lambda i: states[i].serving)
            if rollback:
                order = [i for i in order if not states[i].serving]
                if not order:
                    answer = self.ask(rt, recorded_task(records))
                    return self._result([], answer, "", nothing="nothing to roll back: every replica serves")
            outcomes: list[ReplicaOutcome] = []
            for i in order:
                r, state = self.replicas[i], states[i]
                back = kept.get(r.deployment, KeptReplica(None, None))
                why = back.refusal(r.host) if rollback else None
                if why:
                    outcomes.append(ReplicaOutcome(r, note=why))
                    return self._result(outcomes, None, f"{state.replica}: {why}")
                outcome = self._roll_one(rt, r, state, states, records.get(r.deployment), back.good)
                if outcome is None:  # refused: it stays as it is
                    return self._result(outcomes, None, f"not restarted: {self._refusal}")
                outcomes.append(outcome)
                if not outcome.ok:
                    return self._result(outcomes, None, f"{outcome.name} failed; the roll stopped, the others serve")
                states[i] = ReplicaState(state.replica, outcome.url, READY, True, True)
            answer = self.ask(rt, recorded_task(records))
        return self._result(outcomes, answer)

    def _roll_one(
        self,
        rt: HostLink,
        r: PlacedReplica,
        state: ReplicaState,
        states: list[ReplicaState],
        record: Recorded | None,
        back: StateRecord | None,
    ) -> ReplicaOutcome | None:
        """One replica out of the router, redeployed, proved and back in; None when it may not leave now
        (why in `_refusal`). Whatever interrupts it (a failure, Ctrl-C), a replica whose server still
        serves is registered again before the roll ends."""
        if state.registered:
            refusal = take_out_refusal(state, states, self.service.spec.min_healthy)
            refusal = refusal or self._take_out(rt, state, record)
            if refusal:
                self._refusal = refusal
                self.progress(events.ServiceStep(self.service.name, f"stopped: {refusal}", state.replica))
                return None
        registered = False
        try:
            outcome = self._redeploy(r, back)
            if not outcome.ok:
                why = outcome.result.reason if outcome.result else str(outcome.error)
                said = f"failed: {why}; the roll stops here"
                self.progress(events.ServiceStep(self.service.name, said, outcome.name))
                return outcome
            assert outcome.url
            # (its record becomes its last good one when a later roll takes it out while it serves)
            self.router(rt, {"do": "add", "url": outcome.url, "wait_s": REGISTER_WAIT_S})
            registered = True
            self.progress(events.ServiceStep(self.service.name, f"registered {outcome.url}", outcome.name))
            return outcome
        finally:
            if not registered:
                self._put_back_if_serving(rt, r)

    def _take_out(self, rt: HostLink, state: ReplicaState, record: Recorded | None) -> str | None:
        """Deregister a replica (its serving record kept as its last good one, should the roll fail); the
        router itself refuses when no other worker it lists is healthy (its view, this moment). None: done."""
        if state.url is None:  # never deployed: the router cannot list it
            return None
        actions: list[RouterAction] = []
        if record and record.status == READY:
            host, deployment = state.replica.split("/", 1)
            actions.append({"do": "remember", "replicas": {deployment: {"host": host, "good": record.raw}}})
        actions.append(
            {
                "do": "remove",
                "url": state.url,
                "wait_s": 30,
                "keep_one_healthy": True,
                "circuit_wait_s": self.circuit_wait_s,
            }
        )
        refused = self.router(rt, *actions)[-1].get("refused")
        if refused:
            return str(refused)
        self.progress(events.ServiceStep(self.service.name, f"deregistered {state.url}; draining", state.replica))
        return None

    def _redeploy(self, r: PlacedReplica, good: StateRecord | None) -> ReplicaOutcome:
        try:
            t = self.on(self.host(r))
            if good is None:
                return self._deploy(t, r, relaunch=True)
            result = ops.restart(
                t,
                self.host(r),
                force=False,
                progress=self.progress_for(f"{r.host}/{r.deployment}"),
                signatures=self.signatures,
                name=r.deployment,
                state=good,  # a record the router step kept as it was read
                drain_s=self.service.spec.drain_s,
            )
            return ReplicaOutcome(r, result=result, url=self.url_of(r, result.plan.port))
        except FleetError as exc:
            return ReplicaOutcome(r, error=exc)

    def _put_back_if_serving(self, rt: HostLink, r: PlacedReplica) -> None:
        """A replica whose new plan was refused before its old server stopped still serves: back it goes."""
        try:
            row = status_row(self.host(r), read_facts(self.on(self.host(r)), self.host(r)), r.deployment)
        except FleetError:
            return
        url = self.url_of(r, row.get("port"))
        if row["status"] == READY and url:
            self.router(rt, {"do": "add", "url": url, "wait_s": REGISTER_WAIT_S})
            self.progress(events.ServiceStep(self.service.name, f"registered again {url} (its old server still runs)"))
