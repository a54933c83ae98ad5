"""The deploy loop: facts → plan → pre-flight → (lock, engine check, stop, free, launch) → watch →
diagnose → relaunch with the known fix or give up.

Round trips after connect, for a deploy that works the first time: facts, act, watch; a relaunch costs act
and watch. What follows an attempt is `fleet.plan.relaunch.next_action` (pure, shared with groups).
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from fleet import events
from fleet.control.act_request import (
    cache_restart,
    check_args,
    free_request,
    launch_args,
    lock_request,
    owner,
    planned_ports,
    run_id,
)
from fleet.control.answers import act_refusal, engine_resolved, synthetic_line
from fleet.control.attempt_watch import Hold, watch_attempt
from fleet.control.host_steps import HostLink, steps_of
from fleet.control.outcomes import Attempt, DeployResult, LogTail, log_context
from fleet.crashes import GiveUp, LogContext, Relaunch, Signature, diagnose, traceback_of
from fleet.errors import (
    HostStepError,
    LockedError,
    TransportError,
    UnsafeToKill,
)
from fleet.host.common import api_key_name, base_url
from fleet.hostscripts import deployment_python
from fleet.inventory import Host
from fleet.model import ModelSpec
from fleet.plan import GpuSummary, LaunchPlan, Wishes, apply_fix, keyed_premises, learnable, relint, show_version
from fleet.plan.build import ENGINE_PICKS
from fleet.plan.picks import told_picks
from fleet.plan.preflight import MIN_LOG_DISK_BYTES, MIN_STATE_DISK_BYTES
from fleet.plan.relaunch import Ended, Failed, PicksDiffer, Proven, Ready, Replan, next_action
from fleet.plan.types import RESTART_WEIGHT_CACHE
from fleet.protocol import (
    CRASHED,
    FAILED,
    READY,
    STARTING,
    STATE_SCHEMA,
    ActRequest,
    ActResult,
    FreeRequest,
    LockRequest,
    Premises,
    SmokeSpec,
    StateRecord,
    WatchEvent,
    WatchRequest,
    log_lines,
)
from fleet.secrets import redact
from fleet.startup import STALL_FLOOR_S, history_key

PREPARED_HOLD_S = 120.0  # a group's prepared host keeps its lock this long without a process holding it


DRAIN_S = 15.0  # how long a stopped server may finish its requests after SIGTERM


class Deployer:
    """One deploy (or restart) of one host; holds the transport, the plan and what happened so far."""

    def __init__(
        self,
        transport: HostLink,
        host: Host,
        *,
        playbook_name: str,
        smoke: SmokeSpec,
        kill_policy: str,
        secrets: dict[str, str],
        progress: events.Sink = events.ignore,
        engine_check: bool = True,
        max_attempts: int = 4,
        ready_timeout_s: float = 900.0,
        on_stall: str = "fail",
        progress_timeout_s: float = 300.0,
        drain_s: float = DRAIN_S,
        signatures: Sequence[Signature] | None = None,
        deployment: str | None = None,
        gpus: tuple[int, ...] | None = None,
        replace: tuple[str, ...] = (),
        group: dict[str, Any] | None = None,
        command: str = "deploy",
        service: str | None = "",
    ) -> None:
        """`transport`: the host's connection, or its steps (a scripted host in tests); `deployment`: its
        name on the host (the playbook's by default); `gpus`: its placement (None: all of the host's
        GPUs); `replace`: other deployments on those GPUs to stop first; `group`: this host's rank of a
        group (hosts, rank, dist_port), kept in its record; a rank other than 0 has no smoke prompt (`smoke`
        empty): it is ready when its /health answers. `command`: what the lock says this run is ("heal":
        the host refuses it once an operator stopped the deployment). `service`: the service it is a replica
        of, kept in its record ("": none; None: a restart of a record that never said)."""
        self.steps = steps_of(transport)
        self.host = host
        self.playbook_name = playbook_name
        self.deployment = deployment or playbook_name
        self.gpus = gpus
        self.replace = replace
        self.smoke = smoke
        self.kill_policy = kill_policy
        self.secrets = secrets
        self.progress = progress
        self.engine_check = engine_check
        self.restart_cache: str | None = None  # why the next launch starts the weight cache daemon again
        self.max_attempts = max_attempts
        self.ready_timeout_s = ready_timeout_s
        self.on_stall = on_stall
        self.progress_timeout_s = progress_timeout_s
        self.drain_s = drain_s
        self.signatures = signatures
        self.group = group
        self.command = command
        self.service = service
        self.run_id = run_id()
        self.owner = owner()
        self.stall_floor_s = STALL_FLOOR_S  # a phase is never called stalled sooner (tests lower it)

    def over(self, transport: HostLink) -> Deployer:
        """This run over another connection to its host (a group stops a rank its watcher still streams)."""
        other = copy.copy(self)
        other.steps = steps_of(transport)
        return other

    # -- remote steps ---------------------------------------------------------------------------------

    def record(self, plan: LaunchPlan, status: str, *, attempt: int) -> StateRecord:
        """The deployment record (state.json) for this plan: the one place its shape is written."""
        rec: StateRecord = {
            "schema": STATE_SCHEMA,
            "deployment": self.deployment,
            "playbook": self.playbook_name,
            "host": self.host.name,
            "engine": plan.engine,
            "engine_version": show_version(plan.engine_version),
            "plan": plan.to_json(),
            "smoke": self.smoke,
            "port": plan.port,
            "served_name": plan.served_name,
            "check_address": plan.check_address,
            "status": status,
            "attempt": attempt,
            "startup_key": self.startup_key(plan),
            "ready_timeout_s": self.ready_timeout_s,  # the playbook's start-up bounds, for restart and heal
            "on_stall": self.on_stall,
            "updated": time.time(),
        }
        if self.gpus is not None:
            rec["gpus"] = list(self.gpus)
        rec["ports"] = planned_ports(plan)
        if self.service is not None:
            rec["service"] = self.service
        if self.group is not None:
            rec["group"] = self.group
        return rec

    def startup_key(self, plan: LaunchPlan) -> str:
        return history_key(plan.model_path, plan.engine, show_version(plan.engine_version), self.gpus)

    def lock_args(self, command: str, *, places: bool = False) -> LockRequest:
        """`places`: this step may launch on the deployment's GPUs (checked against the others there)."""
        run = (self.run_id, self.owner)
        return lock_request(self.host.settings, self.deployment, self.gpus, self.replace, run, command, places)

    def free_args(self, port: int | None) -> FreeRequest:
        return free_request(self.host.settings, self.kill_policy, self.gpus, self.drain_s, port)

    def act(
        self,
        plan: LaunchPlan,
        *,
        op: str,
        attempt: int,
        check: bool,
        state: StateRecord | None,
        release_lock: bool = False,
        command: str | None = None,
        premises: Premises | None = None,
    ) -> ActResult:
        """`op`: `launch`, `stop` (what is fleet's, and the record), or `prepare`: lock, check and sort what
        holds the GPUs, and stop there (the lock kept): a group prepares every host before it stops anything
        on any."""
        launch = op in ("launch", "prepare")
        args: ActRequest = {
            "op": op,
            "lock": {
                **self.lock_args(command or self.command, places=launch),
                "ports": planned_ports(plan),
                # held until the slowest host is prepared and the launch takes it again (or fleet died)
                "hold_s": PREPARED_HOLD_S if op == "prepare" else 0,
            },
            "free": self.free_args(plan.port),
            "state_update": state,
            "release_lock": release_lock,
            "space": [
                ("state_dir", self.host.settings.state_dir, MIN_STATE_DISK_BYTES),
                ("log_dir", self.host.settings.log_dir, MIN_LOG_DISK_BYTES),
            ],
        }
        cont = plan.container
        if check:
            args["check"] = check_args(plan, f"{cont.name if cont else ''}-check-{self.run_id}", premises=premises)
        if launch:
            args["launch"] = launch_args(plan, self.deployment, attempt, self.host.settings.log_dir, self.restart_cache)
        out = self.steps.act(
            deployment_python(self.host, plan),
            args,
            stdin=json.dumps(self.secrets).encode(),
            # a container's step may also wait for its runtime: check, stop -t, rm, run -d, inspect
            timeout_s=self.drain_s + 240 + (2 * self.drain_s + 600 if cont is not None else 0),
            hold_stdin=True,
        )
        if "launched" in out:  # the daemon started again holds this engine's configuration: asked once
            self.restart_cache = None
        return out

    def api_key(self, plan: LaunchPlan) -> str | None:
        """The engine's API key when its plan takes one (api_key_env: --api-key fleet-secret:NAME)."""
        name = api_key_name(plan.argv())
        return self.secrets.get(name) if name else None

    # -- the loop -------------------------------------------------------------------------------------

    def run(
        self,
        plan: LaunchPlan,
        model: ModelSpec,
        gpus: GpuSummary,
        wishes: Wishes,
        *,
        learned_key: str,
        learned_existing: list[dict[str, Any]],
        replan: Callable[[dict[str, str]], LaunchPlan] | None = None,
    ) -> DeployResult:
        """`replan`: the plan made again on the engine's own picks (fleet.plan.picks). Given, the first
        check also asks the engine what it picks itself, and a plan that stood on other picks is made again
        before anything is stopped (fleet.plan.keyed_premises). None (a restart: the recorded plan, as it
        ran): not asked."""
        result = DeployResult(
            self.host.name,
            self.playbook_name,
            False,
            [],
            plan,
            learned_applied=plan.applied_fixes,
            deployment=self.deployment,
        )
        try:
            return self._attempts(plan, model, gpus, wishes, result, learned_key, learned_existing, replan)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the host must not be left locked by a run that ended
            self.abandon()
            raise

    def _attempts(
        self,
        plan: LaunchPlan,
        model: ModelSpec,
        gpus: GpuSummary,
        wishes: Wishes,
        result: DeployResult,
        learned_key: str,
        learned_existing: list[dict[str, Any]],
        replan: Callable[[dict[str, str]], LaunchPlan] | None,
    ) -> DeployResult:
        applied: list[str] = []
        new_learned: list[dict[str, Any]] = []
        started = time.monotonic()
        attempt = 0
        asked = False  # the engine's own picks are asked for once, before the first launch
        shown = 0  # the attempt last announced: one planned again on the engine's picks is not a new one
        while True:
            attempt += 1
            rec = Attempt(attempt, plan.argv())
            result.attempts.append(rec)
            t0 = time.monotonic()
            if attempt > shown:
                self.progress(events.AttemptStarted(attempt, self.max_attempts, plan.argv()))
                shown = attempt
            state = self.record(plan, STARTING, attempt=attempt)
            state["run_id"], state["deployed_by"], state["learned_key"] = self.run_id, self.owner, learned_key
            # asked once, on the plan as fleet made it (no fix applied yet); one made again stands on the answer
            premises = keyed_premises(plan, model, gpus, wishes) if replan is not None and not asked else None
            asked = True
            out = self.act(plan, op="launch", attempt=attempt, check=self.engine_check, state=state, premises=premises)
            self.stop_if_locked_or_unsafe(out)
            learned: WatchRequest = {"learned_key": learned_key, "learned": [*learned_existing, *new_learned]}
            ended = self._ended(plan, out, rec, premises, learned, log_context(plan, model, gpus))
            rec.seconds = time.monotonic() - t0
            action = next_action(ended, applied, attempt, self.max_attempts, group=False)
            if isinstance(action, Replan) and replan is not None:  # nothing was stopped: the same attempt again
                result.attempts.pop()
                result.plan = plan = self._replanned(plan, action, replan, new_learned)
                attempt -= 1
                continue
            if isinstance(action, Ready):
                result.ok, result.plan, result.new_fixes = True, plan, applied
                result.ready_s = time.monotonic() - started
                result.endpoint = base_url(plan.check_address, plan.port)
                result.round_trips = self.steps.commands_run
                return result
            if isinstance(ended, Failed):
                tail = traceback_of(ended.lines) if ended.diagnosis.signature is None else ended.lines[-40:]
                result.log_tail = list(tail)
            if not isinstance(action, Relaunch):
                return self._given_up(result, plan, rec, action.reason if isinstance(action, GiveUp) else "")
            plan = relint(apply_fix(plan, action.fix, action.signature, action.reason), model, gpus, wishes)
            if action.fix.derive == RESTART_WEIGHT_CACHE:  # asked of the next launch (act), not learned
                self.restart_cache, refused = cache_restart(out, action.signature)
                if refused:
                    return self._given_up(result, plan, rec, refused)
            elif learnable(action.fix):
                new_learned.append({"signature": action.signature, "fix": action.fix.to_json(), "learned_at": _now()})
            applied.append(action.signature)
            rec.fix = action.fix.describe()
            self.progress(
                events.Relaunching(
                    attempt=attempt + 1,
                    max=self.max_attempts,
                    signature=action.signature,
                    fix=rec.fix,
                    explanation=action.reason,
                    elapsed_s=rec.seconds,
                    nothing_stopped=rec.outcome == "rejected",
                )
            )

    def _ended(
        self,
        plan: LaunchPlan,
        out: ActResult,
        rec: Attempt,
        premises: Premises | None,
        learned: WatchRequest,
        context: LogContext,
    ) -> Ended:
        """How the attempt act started ended: the engine's check said it picks otherwise (nothing stopped),
        or refused the command line, or the server was watched until proven or gone (its log diagnosed)."""
        check = out.get("check")
        if check:
            self.progress(events.EngineChecked(check["verdict"], engine_resolved(check)))
        differ = out.get("picks_differ")
        if premises and isinstance(differ, dict) and differ:
            told = {k: v for k, v in told_picks((check or {}).get("picks")).items() if k in premises["expect"]}
            return PicksDiffer(told, {k: told[k] for k in differ if k in told})
        if check and check["verdict"] == "rejected":
            lines = log_lines(redact(check["output"], self.secrets))
            rec.outcome = "rejected"
        else:
            lines = self._watched_lines(plan, out, rec, learned)
            if rec.outcome == READY:
                return Proven()
        rec.diagnosis = diagnose(lines, context, self.signatures)
        self.progress(events.Diagnosed(rec.number, rec.outcome, rec.diagnosis.to_json()))
        return Failed(rec.diagnosis, lines)  # redacted already: as they arrived, and the check's output

    def _given_up(self, result: DeployResult, plan: LaunchPlan, rec: Attempt, reason: str) -> DeployResult:
        result.reason = reason
        if any(r.outcome != "rejected" for r in result.attempts):
            result.not_stopped = self._give_up(plan, rec, reason)
        else:  # the engine refused every command line: nothing was stopped, the old server serves on
            self.release()
        result.round_trips = self.steps.commands_run
        return result

    def _replanned(
        self,
        plan: LaunchPlan,
        action: Replan,
        replan: Callable[[dict[str, str]], LaunchPlan],
        new_learned: list[dict[str, Any]],
    ) -> LaunchPlan:
        """The plan made again on what the engine picks itself (only what was asked). Where that changes
        the plan, it is said and remembered with the learned fixes (the same model, engine version and GPU
        model): the next plan stands on these picks, and a server running it is adopted, not relaunched."""
        again = replan(dict(action.picks))
        if action.differ:
            self.progress(events.Replanned(dict(action.differ), plan.engine_args(), again.engine_args()))
            new_learned.append({"signature": ENGINE_PICKS, "picks": dict(action.picks), "learned_at": _now()})
        return again

    def _watched_lines(self, plan: LaunchPlan, out: ActResult, rec: Attempt, learned: WatchRequest) -> list[str]:
        """Watch the launched attempt to its end: `rec.outcome` says how it ended (READY: proven), and the
        log lines it left are returned for a diagnosis, with what fleet itself saw (a kill, a timeout)."""
        success: WatchRequest = {
            "success_state": {"status": READY, "attempts": rec.number, "applied_fixes": list(plan.applied_fixes)},
            **learned,
        }
        watched, lines = self.watch_attempt(plan, out, rec, success)
        last = watched[-1] if watched else {"e": "error", "error": "no events"}
        if last["e"] == "lost_lock":
            raise LockedError(
                f"{self.host.name}: {last.get('why')}; this run stopped watching its server.",
                "See `fleet status`; the other run decides what runs there now.",
            )
        if last["e"] == "done":
            rec.outcome = READY
            smoke_event = next((e for e in reversed(watched) if e["e"] == "smoke"), {"e": "smoke"})
            self.progress(events.Ready(rec.number, dict(smoke_event)))
            return lines
        rec.outcome = {"exit": CRASHED, "smoke": "smoke_failed", "timeout": "timeout"}.get(last["e"], "error")
        synthetic = synthetic_line(last)
        has_traceback = any("Traceback (most recent call last)" in x for x in lines)
        if synthetic and not (synthetic.startswith("[fleet] engine killed") and has_traceback):
            lines.append(synthetic)
        return lines

    def stop_if_locked_or_unsafe(self, out: ActResult) -> None:
        if "lock" in out and (previous := out["lock"].get("taken_over")):
            self.progress(events.LockTakenOver(dict(previous)))
        refusal = act_refusal(self.host.name, self.deployment, out)
        if refusal is not None:
            if isinstance(refusal, UnsafeToKill):  # nothing was stopped: the lock goes now, not when stale
                self.release()
            raise refusal

    def watch_attempt(
        self, plan: LaunchPlan, out: ActResult, rec: Attempt, success: WatchRequest, hold: Hold | None = None
    ) -> tuple[list[WatchEvent], list[str]]:
        """Report what act stopped and launched, then stream the attempt; returns (events, log lines)."""
        self.progress(events.Stopped(list(out.get("ended", [])), list(out.get("left", [])), out.get("memory")))
        launched = out["launched"]
        rec.log = launched["log"]
        if (cache := out.get("weight_cache")) and "launched" in out:
            self.progress(
                events.WeightCache(bool(cache.get("kept")), str(cache.get("why")), cache.get("pid"), cache.get("log"))
            )
        self.progress(events.Launched(launched["pid"], launched["log"]))
        kept = LogTail()

        def on_line(text: str) -> None:
            shown = redact(text, self.secrets)  # everything downstream (diagnosis, evidence, output) is redacted
            kept.append(shown)
            self.progress(events.LogLine(shown))

        watched = watch_attempt(self, plan, launched, success, on_line, hold)
        return watched, kept.kept()

    def release(self) -> None:
        with contextlib.suppress(TransportError, HostStepError):  # an unreleased lock is taken over once stale
            self.steps.act("python3", {"op": "release", "lock": self.lock_args("release")}, timeout_s=300)

    def abandon(self) -> None:
        """The run was interrupted. A step in flight saw its stdin close and finishes on its own; between
        steps (act answered, watch not yet started) nothing on the host knows, so one more round trip
        records a launched server as unverified and frees the lock. Best effort and bounded: the lock also
        goes stale by itself."""
        with contextlib.suppress(TransportError, HostStepError, KeyboardInterrupt):
            request: ActRequest = {"op": "release", "lock": self.lock_args("abandon"), "abandon": {"wait_s": 10.0}}
            self.steps.act("python3", request, timeout_s=20)

    def _give_up(self, plan: LaunchPlan, rec: Attempt, reason: str) -> str:
        """Stop what the failed attempt left running (a server printing garbage must not stay up); returns
        why that could not be done ("" when it was)."""
        # merged on the host into the attempt's record: its pid, learned key and run stay
        state = self.record(plan, FAILED, attempt=rec.number)
        state["reason"] = reason
        state["diagnosis"] = rec.diagnosis.to_json() if rec.diagnosis else None
        if rec.log:
            state["log"] = rec.log
        try:
            out = self.act(
                plan,
                op="stop",
                attempt=rec.number,
                check=False,
                state=state,
                release_lock=True,
                command="give-up",
            )
        except (TransportError, HostStepError) as exc:  # the run's result stands; the host's state is unknown
            return redact(exc.message, self.secrets)
        lock = out["lock"]
        if lock["status"] != "taken":  # the host changed nothing: the lock was not this run's to use
            return f"the host's lock was {lock['status']}"
        if out.get("client_gone"):
            return "the connection closed before the host acted"
        return ""


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")
