"""One model over several hosts: a playbook with `hosts:` deployed as one group, that lives and dies together.

Facts of every node in parallel (each also tries rank 0's dist port), the group's pre-flight, then every
rank launched at once through the deploy machinery's act step (lock, engine check, stop, free, launch).
Every rank is watched; rank 0 is proven with the smoke prompt, the others by their /health. When any rank
fails (a crash, a hang that NCCL's watchdog ends, a rendezvous that times out) the whole group is stopped,
diagnosed from the rank that failed first, and relaunched with the known fix (bounded), or given up: a
group is never left half up.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field, replace

from fleet import events
from fleet.control import ops, placing
from fleet.control.answers import synthetic_line
from fleet.control.attempt_watch import Hold
from fleet.control.deploy import Deployer
from fleet.control.gather import model_path, read_facts
from fleet.control.outcomes import Attempt, log_context, refused_before_stopping
from fleet.control.parallel import in_parallel
from fleet.crashes import Diagnosis, GiveUp, Signature, diagnose
from fleet.errors import DeployFailed, FleetError, HostStepError, PreflightError, TransportError
from fleet.facts import HostFacts
from fleet.host.common import base_url
from fleet.inventory import Host, Inventory, NamedPlaybook
from fleet.inventory.runtime import chosen_runtime
from fleet.model import GENERATE
from fleet.plan import LaunchPlan, apply_fix, relint
from fleet.plan.build import PlanResult
from fleet.plan.group import Node, group_preflight, rank_plan
from fleet.plan.relaunch import Failed, Proven, Ready, Replan, next_action
from fleet.protocol import CRASHED, FAILED, READY, STARTING, STOPPED, ActResult, StateRecord, WatchEvent, WatchRequest
from fleet.secrets import read_secrets, redact
from fleet.transport import Transport

Connect = Callable[[Host], AbstractContextManager[Transport]]


@dataclass
class RankOutcome:
    """How one rank's attempt ended: `done`, or the watcher's last event (exit, timeout...) and its log."""

    rank: int
    host: str
    ended: str
    lines: list[str]
    finished_at: float


@dataclass
class GroupResult:
    playbook: str
    hosts: list[str]
    ok: bool
    attempts: list[Attempt] = field(default_factory=list)
    reason: str = ""
    endpoint: str = ""
    failed_rank: RankOutcome | None = None  # the rank whose failure was diagnosed, on the last attempt
    not_stopped: list[str] = field(default_factory=list)  # hosts whose rank could not be stopped, with why

    @property
    def refused_before_stopping(self) -> bool:
        return refused_before_stopping(self.ok, self.attempts)


class GroupRun:
    """A playbook placed on several hosts (`hosts:`), deployed and stopped as one."""

    def __init__(
        self,
        playbook: NamedPlaybook,
        inventory: Inventory,
        connect: Connect,
        progress_for: Callable[[str], events.Sink],
        *,
        force: bool = False,
        engine_check: bool = True,
        signatures: Sequence[Signature] | None = None,
    ) -> None:
        if not playbook.spec.hosts:
            raise PreflightError(f"{playbook.path}: the playbook has no hosts: list.", "Add hosts: [a, b].")
        self.playbook = playbook
        self.hosts = [inventory.hosts[name] for name in playbook.spec.hosts]
        self.connect = connect
        self.progress_for = progress_for
        self.force = force
        self.engine_check = engine_check
        self.signatures = signatures
        self.proof: WatchEvent | None = None  # rank 0's smoke answer, once the group is proven
        self.nodes = [
            Node(i, h.name, h.node_address or "", h.settings.network_interface) for i, h in enumerate(self.hosts)
        ]

    # -- plan ------------------------------------------------------------------------------------------

    def plan(self, upgrade: Callable[[HostFacts], HostFacts] | None = None) -> tuple[list[PlanResult], list[str]]:
        """`fleet plan` of a group: each rank's plan (its rank flags in) and what the group's pre-flight
        refuses; changes nothing. `upgrade`: each host's facts as an engine upgrade would leave them."""
        with ExitStack() as stack:
            transports = [stack.enter_context(self.connect(h)) for h in self.hosts]
            _, placed, problems = self._gather(transports, upgrade)
        pb = self.playbook.spec
        ranked = [
            replace(r, plan=rank_plan(r.plan, self.nodes, i, pb.dist_port)) if r.plan is not None else r
            for i, r in enumerate(placed)
        ]
        return ranked, problems

    def _gather(
        self, transports: list[Transport], upgrade: Callable[[HostFacts], HostFacts] | None = None
    ) -> tuple[list[HostFacts], list[PlanResult], list[str]]:
        """Every node's facts (in parallel), its plan of the group, and what the group's pre-flight refuses."""
        pb = self.playbook.spec
        if any(chosen_runtime(pb.runtime, h.settings.runtime) is not None for h in self.hosts):
            raise PreflightError(
                f"{self.playbook.path}: hosts: with a container runtime is not supported; a group runs its "
                "engine as a process on each host.",
                "Set runtime: process in the playbook, or deploy the image on one host.",
            )
        rank0 = self.nodes[0]

        def facts(i: int) -> HostFacts:
            host = self.hosts[i]
            reach = (rank0.address, pb.dist_port) if rank0.address else None
            return read_facts(transports[i], host, model=model_path(host, pb.model), engine=pb.engine, reach=reach)

        with ThreadPoolExecutor(max_workers=len(self.hosts)) as pool:
            all_facts = [upgrade(f) if upgrade else f for f in pool.map(facts, range(len(self.hosts)))]
        self.nodes = [n.with_found_interface(f.reach_interface) for n, f in zip(self.nodes, all_facts, strict=True)]
        placed = [
            placing.place_and_plan(
                h,
                self.playbook,
                f,
                self.playbook.name,
                None,
                replace=False,
                signatures=self.signatures,
                nodes=len(self.hosts),
            ).result
            for h, f in zip(self.hosts, all_facts, strict=True)
        ]
        problems = [v.message for r in placed for v in r.errors]
        plans = [r.plan for r in placed]
        if not problems and all(p is not None for p in plans):
            ready = [p for p in plans if p is not None]
            counts = [r.gpus.count // len(self.hosts) if r.gpus else 0 for r in placed]
            mine = all_facts[0].remote.deployment(self.playbook.name).recorded.pgid
            own = {p.pid for p in all_facts[0].servers if mine is not None and p.pgid == mine}
            verdicts = group_preflight(self.nodes, all_facts, ready, counts, pb.dist_port, pb.engine, own)
            problems = [v.message for v in verdicts]
        return all_facts, placed, problems

    # -- deploy ----------------------------------------------------------------------------------------

    def deploy(self) -> GroupResult:
        with ExitStack() as stack:
            transports = [stack.enter_context(self.connect(h)) for h in self.hosts]
            all_facts, placed, problems = self._gather(transports)
            if problems:
                raise PreflightError(
                    f"{self.playbook.name} over {', '.join(h.name for h in self.hosts)}: " + "; ".join(problems),
                    "Nothing on any host was changed.",
                )
            pb = self.playbook.spec
            secrets = read_secrets(pb.secret_names, self.playbook.name)
            group = {"hosts": [h.name for h in self.hosts], "dist_port": pb.dist_port}
            deployers = [
                Deployer(
                    t,
                    h,
                    playbook_name=self.playbook.name,
                    smoke=ops.smoke_of(self.playbook, placed[0].plan.task if placed[0].plan else GENERATE)
                    if i == 0
                    else {},
                    kill_policy="force" if self.force else h.settings.kill_policy,
                    secrets=secrets,
                    progress=self.progress_for(h.name),
                    engine_check=self.engine_check,
                    max_attempts=pb.max_attempts,
                    **ops.startup_bounds(pb),
                    signatures=self.signatures,
                    group={**group, "rank": i},
                )
                for i, (t, h) in enumerate(zip(transports, self.hosts, strict=True))
            ]
            try:
                return self._attempts(deployers, placed)
            except KeyboardInterrupt:  # every rank at once: a watcher's host notices its client gone by itself
                in_parallel(lambda i: deployers[i].abandon(), range(len(deployers)))
                raise

    def _attempts(self, deployers: list[Deployer], placed: list[PlanResult]) -> GroupResult:
        pb = self.playbook.spec
        result = GroupResult(self.playbook.name, [h.name for h in self.hosts], False)
        plans = [p.plan for p in placed if p.plan is not None]
        applied: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            ranked = [rank_plan(p, self.nodes, i, pb.dist_port) for i, p in enumerate(plans)]
            rec = Attempt(attempt, ranked[0].argv())
            result.attempts.append(rec)
            t0 = time.monotonic()
            for d, plan in zip(deployers, ranked, strict=True):
                d.progress(events.AttemptStarted(attempt, pb.max_attempts, plan.argv()))
            failed = self._prepare_all(deployers, ranked, attempt)
            if failed is None:
                outs = self._launch_all(deployers, ranked, attempt, result)
                failed = self._watch_all(deployers, ranked, outs, attempt, result)
            rec.seconds = time.monotonic() - t0
            ended = Proven() if failed is None else self._diagnosed(deployers, placed, ranked, failed, rec)
            decision = next_action(ended, applied, attempt, pb.max_attempts, group=True)
            if isinstance(decision, Ready):  # every rank proven: their locks, held until now, go together
                in_parallel(lambda i: deployers[i].release(), range(len(deployers)))
                rec.outcome = READY
                result.ok = True
                result.endpoint = base_url(ranked[0].check_address, ranked[0].port)
                deployers[0].progress(events.Ready(attempt, dict(self.proof or {"e": "smoke", "ok": True})))
                return result
            assert failed is not None and isinstance(ended, Failed) and not isinstance(decision, Replan)
            result.failed_rank = failed
            if isinstance(decision, GiveUp):
                result.reason = f"rank {failed.rank} ({failed.host}): {decision.reason}"
                if any(a.outcome != "rejected" for a in result.attempts):
                    self._give_up(deployers, ranked, attempt, result.reason, ended.diagnosis)
                else:  # the engine refused every command line: nothing was stopped, the running group serves on
                    in_parallel(lambda i: deployers[i].release(), range(len(deployers)))
                return result
            plans = [
                relint(apply_fix(p, decision.fix, decision.signature, decision.reason), r.model, r.gpus, r.wishes)
                for p, r in zip(plans, placed, strict=True)
                if r.model is not None and r.gpus is not None
            ]
            applied.append(decision.signature)
            rec.fix = decision.fix.describe()
            for d in deployers:
                d.progress(
                    events.Relaunching(
                        attempt=attempt + 1,
                        max=pb.max_attempts,
                        signature=decision.signature,
                        fix=rec.fix,
                        explanation=f"the whole group is relaunched: {decision.reason}",
                        elapsed_s=rec.seconds,
                        nothing_stopped=rec.outcome == "rejected",
                    )
                )

    def _diagnosed(
        self,
        deployers: list[Deployer],
        placed: list[PlanResult],
        ranked: list[LaunchPlan],
        failed: RankOutcome,
        rec: Attempt,
    ) -> Failed:
        """The failed rank's log, read, and said on every host's progress."""
        rec.outcome = "rejected" if failed.ended == "rejected" else CRASHED
        where = placed[failed.rank]
        assert where.model is not None and where.gpus is not None
        context = log_context(ranked[failed.rank], where.model, where.gpus)
        rec.diagnosis = diagnose(failed.lines, context, self.signatures)
        for d in deployers:
            d.progress(
                events.Diagnosed(
                    rec.number, f"rank {failed.rank} ({failed.host}) {failed.ended}", rec.diagnosis.to_json()
                )
            )
        lost = failed.lines[-1].removeprefix("[fleet] ") if failed.ended == "lost" and failed.lines else ""
        return Failed(rec.diagnosis, failed.lines, lost)

    def _prepare_all(self, deployers: list[Deployer], plans: list[LaunchPlan], attempt: int) -> RankOutcome | None:
        """Every host locked, the engine's check run, and what holds the GPUs sorted, before anything is
        stopped on any host. A refusal anywhere (locked, a holder fleet will not kill, no disk) frees every
        lock taken and is raised; a rejected command line is returned as the rank's outcome."""

        def prepare(i: int) -> ActResult:
            d = deployers[i]
            check = d.engine_check  # every attempt: a fixed command line may be rejected in a new way
            return d.act(plans[i], op="prepare", attempt=attempt, check=check, state=None)

        answers = in_parallel(prepare, range(len(deployers)))
        error: FleetError | None = None
        rejected: RankOutcome | None = None
        for i, d in enumerate(deployers):
            out = answers[i]
            if isinstance(out, FleetError):
                error = error or out
                continue
            check = out.get("check")
            if check and check["verdict"] == "rejected" and rejected is None:
                from fleet.protocol import log_lines  # here: the module is at its line limit

                said = log_lines(redact(str(check["output"]), d.secrets))
                rejected = RankOutcome(i, self.hosts[i].name, "rejected", said, time.monotonic())
                continue
            try:
                d.stop_if_locked_or_unsafe(out)
            except FleetError as exc:
                error = error or exc
        if error is not None or rejected is not None:
            taken = [
                i for i, out in answers.items() if not isinstance(out, FleetError) and out["lock"]["status"] == "taken"
            ]
            in_parallel(lambda i: deployers[i].release(), taken)
        if error is not None:
            raise error
        return rejected

    def _launch_all(
        self,
        deployers: list[Deployer],
        plans: list[LaunchPlan],
        attempt: int,
        result: GroupResult,
    ) -> list[ActResult]:
        """Every rank stopped and launched at once (the hosts were prepared). A rank that fails now stops
        the ranks that did launch, then its error is raised."""

        def launch(i: int) -> ActResult:
            d = deployers[i]
            state = d.record(plans[i], STARTING, attempt=attempt)
            state["run_id"], state["deployed_by"] = d.run_id, d.owner
            out = d.act(plans[i], op="launch", attempt=attempt, check=False, state=state)
            d.stop_if_locked_or_unsafe(out)
            return out

        answers = in_parallel(launch, range(len(deployers)))
        errors = [a for a in answers.values() if isinstance(a, FleetError)]
        if errors:  # every rank stopped: the new ones launched, and an old one where the launch failed
            result.not_stopped = self._stop_all(
                deployers,
                plans,
                f"another rank could not start: {errors[0].message}",
                range(len(deployers)),
                release=True,
            )
            if result.not_stopped:
                raise DeployFailed(
                    f"{errors[0].message}; the ranks launched elsewhere could NOT all be stopped: "
                    f"{'; '.join(result.not_stopped)}",
                    f"Run fleet stop {self.playbook.name} once the hosts are reachable.",
                )
            raise errors[0]
        return [a for a in answers.values() if not isinstance(a, FleetError)]  # all ActResult here

    def _watch_all(
        self,
        deployers: list[Deployer],
        plans: list[LaunchPlan],
        outs: list[ActResult],
        attempt: int,
        result: GroupResult,
    ) -> RankOutcome | None:
        """Watches every rank; None when all are done. On the first rank that fails (or whose host is
        lost), the group is stopped (so every other watcher ends too) and that rank's outcome returned."""

        ended: queue.Queue[RankOutcome] = queue.Queue()
        holds = [
            Hold(lambda i=i: ended.put(RankOutcome(i, self.hosts[i].name, "done", [], time.monotonic())))  # type: ignore[misc]
            for i in range(len(deployers))
        ]

        def watch(i: int) -> RankOutcome:
            rec = Attempt(0, plans[i].argv())
            success: WatchRequest = {
                "success_state": {
                    "status": READY,
                    "attempts": attempt,
                    "applied_fixes": list(plans[i].applied_fixes),
                },
                "learned_key": "",
                "learned": [],
            }
            try:
                watched, lines = deployers[i].watch_attempt(plans[i], outs[i], rec, success, holds[i])
            except FleetError as exc:  # its host lost while watching: the rank is lost to the group
                return RankOutcome(i, self.hosts[i].name, "lost", [f"[fleet] {exc.message}"], time.monotonic())
            last: WatchEvent = watched[-1] if watched else {"e": "error"}
            said = synthetic_line(last)
            if said:
                lines.append(said)
            return RankOutcome(i, self.hosts[i].name, str(last["e"]), lines, time.monotonic())

        def follow(i: int) -> None:
            try:
                outcome = watch(i)
            except Exception as exc:  # anything else (a closed terminal): the rank's outcome, never a hang
                outcome = RankOutcome(i, self.hosts[i].name, "error", [f"[fleet] {exc!r}"], time.monotonic())
            if not holds[i].proven or outcome.ended != "done":
                ended.put(outcome)

        watchers = [  # daemon threads: Ctrl-C is not held up by a watcher
            threading.Thread(target=follow, args=(i,), name=f"watch-rank{i}", daemon=True)
            for i in range(len(deployers))
        ]
        for w in watchers:
            w.start()
        failed: RankOutcome | None = None
        settled: set[int] = set()
        stopped_at = 0.0
        try:
            while len(settled) < len(deployers):  # each rank once: proven, or failed (a repeat is ignored)
                try:  # before a failure each watcher is bounded by its own timeouts; after it, by this
                    outcome = ended.get(timeout=None if failed is None else _settle_left(stopped_at))
                except queue.Empty:  # stopped, and its watcher still silent: the group does not wait for it
                    break
                if outcome.rank == 0 and holds[0].smoke is not None:
                    self.proof = holds[0].smoke
                if outcome.rank in settled:
                    continue
                settled.add(outcome.rank)
                if outcome.ended != "done" and failed is None:
                    failed = outcome
                    why = f"rank {outcome.rank} ({outcome.host}) {outcome.ended}"
                    result.not_stopped = self._stop_all(deployers, plans, why, range(len(deployers)))
                    stopped_at = time.monotonic()
        finally:
            for h in holds:  # every rank proven (or the group stopped): the watchers let go
                h.released.set()
        if len(settled) == len(deployers):  # each watcher has said its last word and ends now
            deadline = time.monotonic() + 30
            for w in watchers:
                w.join(timeout=max(0.0, deadline - time.monotonic()))
        return failed

    def _stop_all(
        self,
        deployers: list[Deployer],
        plans: list[LaunchPlan],
        why: str,
        ranks: Iterable[int],
        release: bool = False,
    ) -> list[str]:
        """Stops these ranks, each over a connection of its own (its watcher holds the other); returns the
        hosts where that could not be done, with why."""

        def stop(i: int) -> str | None:
            state = deployers[i].record(plans[i], STOPPED, attempt=0)
            state["reason"] = f"the group is stopped as a whole: {why}"
            out = self._stop_rank(deployers[i], plans[i], state, attempt=0, release=release, command="deploy")
            lock = out["lock"]
            return None if lock["status"] == "taken" else f"{self.hosts[i].name}: lock {lock['status']}"

        answers = in_parallel(stop, list(ranks))
        return [
            f"{self.hosts[i].name}: {a.message}" if isinstance(a, FleetError) else str(a)
            for i, a in answers.items()
            if a is not None
        ]

    def _give_up(
        self, deployers: list[Deployer], plans: list[LaunchPlan], attempt: int, reason: str, diagnosis: Diagnosis
    ) -> None:
        def give_up(i: int) -> None:
            d = deployers[i]
            state = d.record(plans[i], FAILED, attempt=attempt)
            state["reason"], state["diagnosis"] = reason, diagnosis.to_json()
            with contextlib.suppress(TransportError, HostStepError):
                self._stop_rank(d, plans[i], state, attempt=attempt, release=True, command="give-up")

        in_parallel(give_up, range(len(deployers)))

    def _stop_rank(
        self, d: Deployer, plan: LaunchPlan, state: StateRecord, *, attempt: int, release: bool, command: str
    ) -> ActResult:
        """The act step that stops one rank and writes its record, over a connection of its own (the rank's
        watcher may still hold the deployer's)."""
        with self.connect(d.host) as t:
            return d.over(t).act(
                plan,
                op="stop",
                attempt=attempt,
                check=False,
                state=state,
                release_lock=release,
                command=command,
            )


SETTLE_S = 60.0  # after the group is stopped, how long the other ranks' watchers get to see it


def _settle_left(stopped_at: float) -> float:
    return max(0.0, stopped_at + SETTLE_S - time.monotonic())
