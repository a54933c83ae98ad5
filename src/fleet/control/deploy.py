"""The deploy loop: facts → plan → pre-flight → (lock, engine check, stop, free, launch) → watch →
diagnose → relaunch with the known fix or give up.

Round trips after connect, for a deploy that works the first time: facts (1), act (1), watch (1).
Each relaunch costs act + watch. The policy (`fleet.crashes.decide`) is pure; this module acts on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from fleet import events
from fleet.control.answers import (
    LOCK_GRACE_S,
    act_answer,
    locked,
    overlap_refused,
    rollback_said,
    synthetic_line,
    unwritable_host_dir,
    unwritable_state_dir,
)
from fleet.crashes import Diagnosis, GiveUp, LogContext, Signature, decide, diagnose, traceback_of
from fleet.errors import (
    DeployFailed,
    HostSilent,
    HostStepError,
    HostUnreachable,
    LockedError,
    PreflightError,
    StoppedSince,
    TransportError,
    UnsafeToKill,
)
from fleet.facts import HostFacts
from fleet.host_common import api_key_name, base_url
from fleet.hostscripts import EventLines, run_json, script_for
from fleet.inventory import Host
from fleet.inventory.mounts import SECRETS_MOUNT
from fleet.model import ModelSpec
from fleet.plan import GpuSummary, LaunchPlan, Wishes, apply_fix, keyed_premises, relint, show_version
from fleet.plan.build import ENGINE_PICKS, MIN_LOG_DISK_BYTES, MIN_STATE_DISK_BYTES
from fleet.plan.container import CONTAINER_PYTHON
from fleet.plan.picks import told_picks
from fleet.protocol import CRASHED, FAILED, READY, STARTING, STATE_SCHEMA, ActResult, Launched, StateRecord, WatchEvent
from fleet.secrets import redact
from fleet.startup import STALL_FLOOR_S, history_key
from fleet.transport import Transport

READY_REGEX = {
    "sglang": r"The server is fired up and ready to roll!",
    "vllm": r"Application startup complete\.|Starting vLLM (API )?server on http",
}
NEVER = r"(?!)"  # a group's other ranks print no ready line: their /health says it
TERMINAL_EVENTS = {"done", "exit", "smoke", "timeout", "error", "lost_lock"}
# What fleet holds of an attempt's log while it watches: its last lines (a crash's traceback and what led to
# it), never the whole of a log an engine floods (20 MB/s grew fleet to 6.7 GB). The host cuts each line.
KEPT_LOG_LINES = 20000
KEPT_LOG_BYTES = 8 << 20
# fleet reading nothing from its watcher for this long (stopped with SIGSTOP, swapped out) is frozen: the
# watcher stops the attempt's server, records it failed and frees the host rather than wait for fleet
WATCH_STALLED_S = 30.0
# A watch whose connection was cut resumes from its offset up to five times, after these waits (seconds).
RESUME_WAITS_S = (0.2, 0.4, 0.8, 1.6, 3.2)


class LogTail:
    """The last lines of a log, at most KEPT_LOG_LINES of them and KEPT_LOG_BYTES in all."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque()
        self.chars = 0

    def append(self, line: str) -> None:
        self.lines.append(line)
        self.chars += len(line)
        while len(self.lines) > KEPT_LOG_LINES or self.chars > KEPT_LOG_BYTES:
            self.chars -= len(self.lines.popleft())


@dataclass
class Attempt:
    number: int
    argv: list[str]
    outcome: str = "pending"  # ready | crashed | rejected | smoke_failed | timeout
    diagnosis: Diagnosis | None = None
    fix: str | None = None
    log: str | None = None
    seconds: float = 0.0


@dataclass
class DeployResult:
    host: str
    playbook: str
    ok: bool
    attempts: list[Attempt]
    plan: LaunchPlan
    reason: str = ""
    endpoint: str = ""
    ready_s: float = 0.0
    learned_applied: tuple[str, ...] = ()
    new_fixes: list[str] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    not_stopped: str = ""  # why the step that stops a failed attempt's server and records it did not run
    round_trips: int = 0
    adopted: bool = False  # the server already ran this plan and answered: nothing was restarted
    deployment: str = ""  # its name on the host, when not the playbook's

    @property
    def refused_before_stopping(self) -> bool:
        return refused_before_stopping(self.ok, self.attempts)

    @property
    def name(self) -> str:
        """How a person is told which server this is: the playbook, and the deployment when it differs."""
        return (
            f"{self.playbook} (deployment {self.deployment})"
            if self.deployment not in ("", self.playbook)
            else self.playbook
        )


def refused_before_stopping(ok: bool, attempts: list[Attempt]) -> bool:
    """The engine's own check refused every command line: nothing on the host(s) was stopped or changed,
    so a deploy's or a group's failure is a pre-flight refusal (exit 4), not a failed deploy (exit 7)."""
    return not ok and bool(attempts) and all(a.outcome == "rejected" for a in attempts)


def check_args(
    plan: LaunchPlan, check_name: str, run_options: Sequence[str] = (), premises: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The act step's `check`: the engine's own check of `plan`, in the image when it runs in a container
    (`check_name`: the container's name, never another deployment's; `run_options` before the plan's).
    `premises` (fleet.plan.keyed_premises): also ask what the engine picks without the keyed rules' flags,
    and stop before anything is changed where the plan did not stand on those picks."""
    args: dict[str, Any] = {
        "engine": plan.engine,
        "python": plan.python,
        "args": plan.engine_args(),
        "env": {e.name: e.value for e in plan.env},
    }
    if premises:
        args["picks"] = dict(premises)
    cont = plan.container
    if cont is not None:  # run in the image, as the server will be
        args["container"] = {
            "cli": cont.cli,
            "image": cont.image,
            "name": check_name,
            "options": [*run_options, *cont.check_options(plan)],
        }
    return args


def engine_resolved(check: Mapping[str, Any]) -> dict[str, Any]:
    """What the engine resolved, as the act step's check answered it (a host's odd answer: nothing)."""
    said = check.get("resolved")
    return dict(said) if isinstance(said, dict) else {}


PREPARED_HOLD_S = 120.0  # a group's prepared host keeps its lock this long without a process holding it


class Hold:
    """A group's rank, proven, holding its lock until the whole group is: `on_done` says it is proven,
    `released` lets it go."""

    def __init__(self, on_done: Callable[[], None]) -> None:
        self._on_done = on_done
        self.proven = False
        self.released = threading.Event()
        self.smoke: WatchEvent | None = None  # rank 0's proof: the smoke answer the group is up with

    def on_done(self) -> None:
        """Once: a resumed watch (its connection was cut) proves the rank again and says done again."""
        if not self.proven:
            self.proven = True
            self._on_done()


DRAIN_S = 15.0  # how long a stopped server may finish its requests after SIGTERM


def run_id() -> str:
    return uuid.uuid4().hex[:12]


def owner() -> str:
    return (
        f"{os.environ.get('USER') or os.environ.get('LOGNAME') or 'unknown'}@{socket.gethostname()} pid {os.getpid()}"
    )


def log_context(plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary) -> LogContext:
    return LogContext(
        engine=plan.engine,
        version=plan.engine_version,
        hybrid=model.hybrid,
        nvfp4=model.nvfp4,
        moe=model.moe,
        sm=gpus.sm,
        argv=tuple(plan.engine_args()),
    )


class Deployer:
    """One deploy (or restart) of one host; holds the transport, the plan and what happened so far."""

    def __init__(
        self,
        transport: Transport,
        host: Host,
        *,
        playbook_name: str,
        smoke: dict[str, Any],
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
    ) -> None:
        """`deployment`: its name on the host (the playbook's by default); `gpus`: its placement (None:
        all of the host's GPUs); `replace`: other deployments on those GPUs to stop first; `group`: this
        host's rank of a group (hosts, rank, dist_port), kept in its record; a rank other than 0 has no
        smoke prompt (`smoke` empty): it is ready when its /health answers. `command`: what the lock says
        this run is ("heal": the host refuses it once an operator stopped the deployment)."""
        self.t = transport
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
        self.max_attempts = max_attempts
        self.ready_timeout_s = ready_timeout_s
        self.on_stall = on_stall
        self.progress_timeout_s = progress_timeout_s
        self.drain_s = drain_s
        self.signatures = signatures
        self.group = group
        self.command = command
        self.run_id = run_id()
        self.owner = owner()
        self.stall_floor_s = STALL_FLOOR_S  # a phase is never called stalled sooner (tests lower it)

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
        if self.group is not None:
            rec["group"] = self.group
        return rec

    def startup_key(self, plan: LaunchPlan) -> str:
        return history_key(plan.model_path, plan.engine, show_version(plan.engine_version), self.gpus)

    def _lock_args(self, command: str, *, places: bool = False) -> dict[str, Any]:
        """`places`: this step may launch on the deployment's GPUs (checked against the others there)."""
        return {
            "state_dir": self.host.settings.state_dir,
            "deployment": self.deployment,
            "places": places,
            "gpus": list(self.gpus) if self.gpus is not None else None,
            "replace": list(self.replace),
            "run_id": self.run_id,
            "owner": self.owner,
            "grace_s": LOCK_GRACE_S,
            "command": command,
        }

    def _free_args(self, port: int | None) -> dict[str, Any]:
        return {
            "port": port,
            "bind_address": self.host.settings.bind_address,
            "gpu_devices": self.host.settings.gpu_devices,
            "kill_policy": self.kill_policy,
            "gpus": list(self.gpus) if self.gpus is not None else None,
            "drain_s": self.drain_s,
            "memory_wait_s": 30.0,
            "idle_mib": 1024,
        }

    def act(
        self,
        plan: LaunchPlan,
        *,
        attempt: int,
        launch: bool,
        check: bool,
        state: StateRecord | None,
        release_lock: bool = False,
        command: str | None = None,
        prepare_only: bool = False,
        premises: Mapping[str, Any] | None = None,
    ) -> ActResult:
        """`prepare_only`: lock, check and sort what holds the GPUs, and stop there (the lock kept): a group
        prepares every host before it stops anything on any."""
        args: dict[str, Any] = {
            "prepare_only": prepare_only,
            "lock": {
                **self._lock_args(command or self.command, places=launch),
                "ports": planned_ports(plan),
                # held until the slowest host is prepared and the launch takes it again (or fleet died)
                "hold_s": PREPARED_HOLD_S if prepare_only else 0,
            },
            "free": self._free_args(plan.port),
            "state_update": state,
            "release_lock": release_lock,
            "space": [
                ("state_dir", self.host.settings.state_dir, MIN_STATE_DISK_BYTES),
                ("log_dir", self.host.settings.log_dir, MIN_LOG_DISK_BYTES),
            ],
        }
        env = {e.name: e.value for e in plan.env}
        cont = plan.container
        if check:
            args["check"] = check_args(plan, f"{cont.name if cont else ''}-check-{self.run_id}", premises=premises)
        if launch:
            args["launch"] = {
                "name": self.deployment,
                "attempt": attempt,
                "argv": plan.argv(),
                "env": env,
                "log_dir": self.host.settings.log_dir,
            }
            if cont is not None:
                args["launch"]["container"] = {
                    "cli": cont.cli,
                    "image": cont.image,
                    "name": cont.name,
                    "options": [word for option in cont.options_for(plan) for word in option.words],
                    "python": CONTAINER_PYTHON,
                    "secrets_dir": cont.secrets_dir,
                    "secrets_mount": SECRETS_MOUNT,
                }
        return act_answer(
            run_json(
                self.t,
                plan.python,
                "act",
                args,
                stdin=json.dumps(self.secrets).encode(),
                # a container's step may also wait for its runtime: check, stop -t, rm, run -d, inspect
                timeout_s=self.drain_s + 240 + (2 * self.drain_s + 600 if cont is not None else 0),
                hold_stdin=True,
            )
        )

    def watch(
        self,
        plan: LaunchPlan,
        launched: Launched,
        success: dict[str, Any],
        on_line: Callable[[str], None],
        hold: Hold | None = None,
    ) -> list[WatchEvent]:
        """Stream the attempt; reconnect and resume from the last byte offset if the connection drops.
        `hold`: a group's rank keeps its lock once proven, until `hold.released` (see remote_watch.hold)."""
        offset = 0
        watched: list[WatchEvent] = []
        reader = EventLines(self.host.name, "watch")

        def on_chunk(chunk: bytes) -> bool:
            nonlocal offset
            for raw in reader.feed(chunk):
                ev = cast(WatchEvent, raw)
                if ev["e"] == "held" and hold is not None:
                    if hold.released.is_set():
                        return False
                    continue
                if ev["e"] == "smoke" and hold is not None:
                    hold.smoke = ev
                if ev["e"] == "done" and hold is not None:
                    hold.on_done()
                if ev["e"] == "line":  # kept by on_line, bounded; not among the events
                    offset = ev["o"]
                    on_line(ev["t"])
                    continue
                if ev["e"] == "skipped":  # the host dropped lines fleet did not read in time
                    on_line(f"[fleet] {ev.get('lines')} log lines skipped: written faster than fleet read them")
                    continue
                if ev["e"] == "phase":  # the start-up's phase or progress: said, not among the events
                    self.progress(events.StartupPhase.of_event(ev))
                    continue
                if ev["e"] == "stalled":  # a stall the playbook waits through: said, the watch goes on
                    self.progress(events.StartupStalled.of_event(ev, self.ready_timeout_s))
                    continue
                if ev["e"] == "log_reset":
                    offset = 0
                    self.progress(events.LogReset(str(ev.get("why")), launched["log"]))
                watched.append(ev)
            return True

        def once() -> int:
            nonlocal reader
            reader = EventLines(self.host.name, "watch")  # a resumed stream starts at a line's start
            args = {
                **success,
                "log": launched["log"],
                "exit_file": launched["exit_file"],
                "pgid": launched["pgid"],
                "container": launched.get("container"),
                "offset": offset,
                "ready_seen": any(e["e"] in ("ready_line", "ready_http") for e in watched),
                "client_on_stdin": True,
                "ready_regex": READY_REGEX[plan.engine] if self.smoke else NEVER,
                "address": plan.check_address,
                "port": plan.port,
                "served_name": plan.served_name,
                "smoke": self.smoke,
                "ready_timeout_s": self.ready_timeout_s,
                "progress_timeout_s": self.progress_timeout_s,
                "startup_key": self.startup_key(plan),
                "startup_fixes": list(plan.applied_fixes),  # kept with the start: what changed since the last
                "stall_floor_s": self.stall_floor_s,
                "on_stall": self.on_stall,
                "health_timeout_s": 120.0,
                "state_dir": self.host.settings.state_dir,
                "deployment": self.deployment,
                "run_id": self.run_id,
                "owner": self.owner,
                "hold": hold is not None,
                "stalled_s": WATCH_STALLED_S,
                "key_on_stdin": True,
            }
            script = script_for("watch", args, [plan.python])
            key = self._api_key(plan)  # for the smoke request; on stdin, never the step's command line
            hidden = json.dumps({"api_key": key}).encode() + b"\n"
            code = self.t.stream(script, on_chunk, stdin=hidden, timeout_s=self.ready_timeout_s + 300)
            if not watched or watched[-1]["e"] not in TERMINAL_EVENTS:
                # the watcher never said how it ended: its session was cut; resume from the last offset
                raise HostUnreachable(f"{self.host.name}: the log stream ended early (exit {code}).", "")
            return code

        # a cut connection is resumed, waiting longer each time; a host that answers nothing is not waited
        # for again. (A loop, not tenacity: importing it cost every deploy 16 ms before it connected.)
        for attempt, wait_s in enumerate((*RESUME_WAITS_S, None), start=1):
            if attempt > 1:
                self.progress(events.Reconnecting(offset))
            try:
                once()
                break
            except HostSilent:
                raise
            except HostUnreachable:
                if wait_s is None:
                    raise
                time.sleep(wait_s)
        return watched

    def _api_key(self, plan: LaunchPlan) -> str | None:
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
            self._abandon()
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
            out = self.act(
                plan,
                attempt=attempt,
                launch=True,
                check=self.engine_check,
                state=state,
                premises=premises,
            )
            self._stop_if_locked_or_unsafe(out)
            check = out.get("check")
            if check:
                self.progress(events.EngineChecked(check["verdict"], engine_resolved(check)))
            differ = out.get("picks_differ")
            if premises and isinstance(differ, dict) and differ and replan is not None:
                # nothing was stopped: plan again on what the engine picks itself, only for what was asked
                told = {k: v for k, v in told_picks((check or {}).get("picks")).items() if k in premises["expect"]}
                before = plan.engine_args()
                plan = replan(told)
                said = {k: told[k] for k in differ if k in told}
                if said:
                    self.progress(events.Replanned(said, before, plan.engine_args()))
                    # remembered with the learned fixes (the same model, engine version and GPU model): the
                    # next plan stands on these picks, and a server running it is adopted, not relaunched
                    new_learned.append(
                        {"signature": ENGINE_PICKS, "picks": told, "learned_at": time.strftime("%Y-%m-%d %H:%M:%S")}
                    )
                result.attempts.pop()
                result.plan = plan
                attempt -= 1
                continue
            if check and check["verdict"] == "rejected":
                lines = redact(check["output"], self.secrets).splitlines()
                rec.outcome = "rejected"
            else:
                success = {
                    "success_state": {
                        "status": READY,
                        "attempts": attempt,
                        "applied_fixes": list(plan.applied_fixes),
                    },
                    "learned_key": learned_key,
                    "learned": [*learned_existing, *new_learned],
                }
                watched, lines = self._watch_attempt(plan, out, rec, success)
                last = watched[-1] if watched else {"e": "error", "error": "no events"}
                if last["e"] == "lost_lock":
                    raise LockedError(
                        f"{self.host.name}: {last.get('why')}; this run stopped watching its server.",
                        "See `fleet status`; the other run decides what runs there now.",
                    )
                if last["e"] == "done":
                    rec.outcome = READY
                    result.ok, result.plan, result.new_fixes = True, plan, applied
                    result.ready_s = time.monotonic() - started
                    result.endpoint = base_url(plan.check_address, plan.port)
                    result.round_trips = self.t.commands_run
                    smoke_event = next((e for e in reversed(watched) if e["e"] == "smoke"), {"e": "smoke"})
                    self.progress(events.Ready(attempt, dict(smoke_event)))
                    return result
                rec.outcome = {"exit": CRASHED, "smoke": "smoke_failed", "timeout": "timeout"}.get(last["e"], "error")
                synthetic = synthetic_line(last)
                has_traceback = any("Traceback (most recent call last)" in x for x in lines)
                if synthetic and not (synthetic.startswith("[fleet] engine killed") and has_traceback):
                    lines.append(synthetic)
            rec.seconds = time.monotonic() - t0
            rec.diagnosis = diagnose(lines, log_context(plan, model, gpus), self.signatures)
            tail = traceback_of(lines) if rec.diagnosis.signature is None else lines[-40:]
            result.log_tail = [redact(x, self.secrets) for x in tail]
            assert rec.diagnosis is not None
            self.progress(events.Diagnosed(attempt, rec.outcome, rec.diagnosis.to_json()))
            decision = decide(rec.diagnosis, applied, attempt, self.max_attempts)
            if isinstance(decision, GiveUp):
                result.reason = decision.reason
                if any(r.outcome != "rejected" for r in result.attempts):
                    result.not_stopped = self._give_up(plan, rec, decision.reason)
                else:  # the engine refused every command line: nothing was stopped, the old server serves on
                    self._release()
                result.round_trips = self.t.commands_run
                return result
            plan = relint(apply_fix(plan, decision.fix, decision.signature, decision.reason), model, gpus, wishes)
            applied.append(decision.signature)
            rec.fix = decision.fix.describe()
            new_learned.append(
                {
                    "signature": decision.signature,
                    "fix": decision.fix.to_json(),
                    "learned_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
            self.progress(
                events.Relaunching(
                    attempt=attempt + 1,
                    max=self.max_attempts,
                    signature=decision.signature,
                    fix=rec.fix,
                    explanation=decision.reason,
                    elapsed_s=rec.seconds,
                    nothing_stopped=rec.outcome == "rejected",
                )
            )

    def _stop_if_locked_or_unsafe(self, out: ActResult) -> None:
        if out.get("stopped_since"):
            raise StoppedSince(
                f"{self.host.name}: deployment {self.deployment} was stopped after the check found it down; "
                "not restarted (a stop is never undone by a heal).",
                f"Start it again yourself: fleet restart --host {self.host.name}/{self.deployment}.",
            )
        lock = out["lock"]
        if lock["status"] == "unwritable":
            raise unwritable_state_dir(self.host.name, lock)
        if lock["status"] == "held":
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lock.get("since") or 0))
            raise locked(self.host.name, lock, since)
        if lock["status"] == "overlap":
            raise overlap_refused(self.host.name, self.deployment, lock)
        if previous := lock.get("taken_over"):
            self.progress(events.LockTakenOver(dict(previous)))
        if unwritable := out.get("log_dir_unwritable"):
            raise unwritable_host_dir(self.host.name, "the log directory", "log_dir", unwritable)
        if short := out.get("short_of_space"):
            raise PreflightError(
                f"{self.host.name}: {short['short']} in {short['path']} ({short['setting']}); fleet needs "
                f"{short['need'] >> 20} MiB and some free inodes there before it stops anything. Nothing on the "
                "host was changed.",
                "Free disk space there first.",
            )
        if failed := out.get("write_failed"):
            raise DeployFailed(
                f"{self.host.name}: writing {failed['path']} failed after the old server was stopped "
                f"({failed['error']}); {rollback_said(out)}",
                "Free disk space on the host, then run again.",
            )
        if out.get("refused"):
            self._release()
            who = "; ".join(
                f"pid {p.get('pid')} ({p.get('user')}: {str(p.get('cmdline'))[:80]}) — {p['why']}"
                for p in out["refused"]
            )
            raise UnsafeToKill(
                f"{self.host.name}: GPU/port holders fleet will not kill: {who}.",
                "Stop them yourself, or set kill_policy: force for this host (or pass --force).",
            )

    def _watch_attempt(
        self, plan: LaunchPlan, out: ActResult, rec: Attempt, success: dict[str, Any], hold: Hold | None = None
    ) -> tuple[list[WatchEvent], list[str]]:
        """Report what act stopped and launched, then stream the attempt; returns (events, log lines)."""
        self.progress(events.Stopped(list(out.get("ended", [])), list(out.get("left", [])), out.get("memory")))
        launched = out["launched"]
        rec.log = launched["log"]
        self.progress(events.Launched(launched["pid"], launched["log"]))
        kept = LogTail()

        def on_line(text: str) -> None:
            shown = redact(text, self.secrets)  # everything downstream (diagnosis, evidence, output) is redacted
            kept.append(shown)
            self.progress(events.LogLine(shown))

        watched = self.watch(plan, launched, success, on_line, hold)
        return watched, list(kept.lines)

    def _release(self) -> None:
        with contextlib.suppress(TransportError, HostStepError):  # an unreleased lock is taken over once stale
            run_json(
                self.t,
                "python3",
                "act",
                {"lock": self._lock_args("release"), "release_lock_only": True},
            )

    def _abandon(self) -> None:
        """The run was interrupted. A step in flight saw its stdin close and finishes on its own; between
        steps (act answered, watch not yet started) nothing on the host knows, so one more round trip
        records a launched server as unverified and frees the lock. Best effort and bounded: the lock also
        goes stale by itself."""
        with contextlib.suppress(TransportError, HostStepError, KeyboardInterrupt):
            run_json(
                self.t,
                "python3",
                "act",
                {"lock": self._lock_args("abandon"), "release_lock_only": True, "abandon": {"wait_s": 10.0}},
                timeout_s=20,
            )

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
                attempt=rec.number,
                launch=False,
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


def planned_ports(plan: LaunchPlan) -> list[int]:
    """The ports a plan's server opens that fleet chose: HTTP, the internal base of a placed one, and the
    port a group's rank 0 meets the other ranks on."""
    internal = plan.flag("--nccl-port")
    base = (
        int(str(internal.value))
        if internal is not None
        else next((int(e.value) for e in plan.env if e.name == "VLLM_PORT"), None)
    )
    ports = [plan.port] if base is None else [plan.port, base]
    rank, meet = plan.flag("--node-rank"), plan.flag("--dist-init-addr")
    if rank is not None and rank.value == "0" and meet is not None and meet.value:
        ports.append(int(meet.value.rpartition(":")[2]))
    return ports


def recorded(facts: HostFacts, deployment: str) -> dict[str, Any]:
    """The host's record of `deployment` (empty when there is none)."""
    return dict(facts.remote.deployment(deployment).state)
