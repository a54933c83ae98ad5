"""A scripted host for the deploy, group and service loops' branches (fleet.control.host_steps.HostSteps),
in memory: each act answers as the real step does for the case scripted (the lock taken or held, the
engine's check accepting, rejecting or picking otherwise, a launch), and each watch plays the next
attempt's log and ending as the real watch step's events. The host keeps its deployments' records and
servers as the real steps leave them (a launch records and starts one, a proven attempt is recorded
ready, a crash ends its server, a stop ends it), so a later probe reads them; a health sweep asks each
recorded server (alive, and answering right unless scripted to answer wrong); a service's router step is
answered by a scripted router (fleet_testbed.fakerouter). What fleet does on a host is proven elsewhere,
over real sshd and in simulated hosts; this proves what the loops do with each answer, in milliseconds."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.control.sweep import HealthOptions
from fleet.facts import DeploymentRecord, HostFacts
from fleet.facts.parse import Proc
from fleet.health import CRITICAL, OK, Check, HostHealth, worst
from fleet.host.check import budget_short
from fleet.hostscripts import StepEvent
from fleet.inventory import Host
from fleet.protocol import (
    ActRequest,
    ActResult,
    CheckResult,
    ProbeRequest,
    RouterRequest,
    StateRecord,
    WatchRequest,
)
from fleet.step_answers import RouterAnswer
from fleet_testbed.fakerouter import ScriptedRouter

HELD_FOR_AT_MOST_S = 30.0  # a group's proven rank says "held" until fleet lets go; a test never waits longer

SGLANG_READY = "The server is fired up and ready to roll!"


@dataclass
class Watch:
    """One attempt as its watcher sees it: the log lines the engine printed, then the events it ended with."""

    lines: Sequence[str]
    end: Sequence[dict[str, Any]]


def ready(*lines: str) -> Watch:
    """The engine starts, prints its ready line, and answers the smoke prompt."""
    return Watch(
        [*lines, SGLANG_READY], [{"e": "ready_line"}, {"e": "smoke", "ok": True, "status": 200}, {"e": "done"}]
    )


def crashes(*lines: str, code: int = 1) -> Watch:
    return Watch(lines, [{"e": "exit", "code": code}])


def cut(*lines: str) -> Watch:
    """The connection drops mid-watch: lines, then no ending (fleet resumes from the last offset)."""
    return Watch(lines, [])


SERVER = "python3 -m sglang.launch_server # %s"  # a scripted server's command line, by its deployment


@dataclass
class ScriptedHost:
    """`facts`: what the probe finds (factsdata builds them); `watches`: each watch step in turn (a resumed
    watch takes the next one); `checks`: the engine's verdict on each launch's command line in turn
    (accepted when none is left); `picks_differ`: the engine picks otherwise than the plan stood on, once,
    when asked; `lock`: the lock step's answer; `router_step`: the router a service runs here;
    `answers_wrong`: deployments whose server answers the smoke prompt wrongly; `stop_finds`: the rest of a
    stop's answer (what it refused, the GPU memory it read). `records` and `servers` are
    what the host keeps now: each deployment's record, and which deployment each running server (by pid)
    is."""

    facts_found: HostFacts | None = None
    watches: list[Watch] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    picks_differ: dict[str, str] | None = None
    lock: str = "taken"
    host_name: str = "scripted"
    acts: list[ActRequest] = field(default_factory=list)  # every act request fleet sent, in order
    watched: list[WatchRequest] = field(default_factory=list)  # every watch request
    records: dict[str, StateRecord] = field(default_factory=dict)
    servers: dict[int, str] = field(default_factory=dict)
    router_step: ScriptedRouter = field(default_factory=ScriptedRouter)
    answers_wrong: set[str] = field(default_factory=set)
    sweeps: int = 0  # health sweeps run
    stop_finds: ActResult = field(default_factory=dict)  # more of a stop's answer: what it refused, its memory

    @property
    def commands_run(self) -> int:
        return len(self.acts) + len(self.watched) + self.sweeps

    def facts(self, request: ProbeRequest, pythons: Sequence[str]) -> HostFacts:
        assert self.facts_found is not None, "a scripted host probed without facts to answer with"
        found = self.facts_found
        kept = {n: DeploymentRecord(n, dict(r)) for n, r in self.records.items()}
        running = tuple(
            Proc(pid, 1, pid, 1000, "ops", "python3", SERVER % name, 1) for pid, name in self.servers.items()
        )
        remote = replace(found.remote, deployments={**found.remote.deployments, **kept})
        return replace(found, host=self.host_name, remote=remote, servers=found.servers + running)

    @property
    def launches(self) -> list[list[str]]:
        """The command line of each launch, in order (a group's prepare step launches nothing)."""
        return [list(a["launch"]["argv"]) for a in self.acts if a.get("op") == "launch"]

    def act(
        self, python: str, request: ActRequest, *, stdin: bytes = b"", timeout_s: float, hold_stdin: bool = False
    ) -> ActResult:
        self.acts.append(request)
        out: ActResult = {"host": self.host_name, "lock": {"status": self.lock}}
        if self.lock != "taken":
            out["lock"].update(owner="op@elsewhere pid 7", command="deploy", age_s=1.0)
            return out
        if request.get("check"):
            out["check"] = self.checks.pop(0) if self.checks else {"verdict": "accepted", "output": ""}
            asked = request["check"].get("picks")
            if asked and self.picks_differ:
                out["check"]["picks"] = dict(self.picks_differ)
                out["picks_differ"], self.picks_differ = dict(self.picks_differ), None
                return out  # nothing stopped, nothing launched: fleet plans again
            if out["check"]["verdict"] == "rejected":
                return out
            short = budget_short(out["check"], request["check"].get("budget"))
            if short:  # as the real step: the engine's own budget is smaller than the plan counted
                out["budget_short"] = short
                return out
        out["ended"], out["left"], out["memory"] = [], [], {}
        name = request["lock"]["deployment"]
        if request.get("op") in ("launch", "stop"):  # what is fleet's of this deployment is stopped first
            out["ended"] = [
                {"pid": pid, "pgid": pid, "user": "ops", "cmdline": SERVER % name, "why": "fleet's server"}
                for pid in self._end(name)
            ]
        if request.get("op") == "stop":
            out.update(self.stop_finds)
        if request.get("op") == "launch":
            n = len(self.launches) - 1
            out["launched"] = {
                "pid": 1000 + n,
                "pgid": 1000 + n,
                "log": f"/logs/attempt-{n}.log",
                "exit_file": f"/logs/attempt-{n}.exit",
                "started": 0.0,
                "start_ticks": 1,
                "container": None,
            }
            self.servers[1000 + n] = name
        update = request.get("state_update")
        if update:  # as the real step: a launch's record carries its process; a stop's says STOPPED
            launched = out.get("launched") or {}
            self.records[name] = {**update, **{k: launched[k] for k in ("pid", "pgid") if k in launched}}
        return out

    def _end(self, name: str) -> list[int]:
        ended = [pid for pid, of in self.servers.items() if of == name]
        for pid in ended:
            del self.servers[pid]
        return ended

    def router(self, python: str, request: RouterRequest, *, timeout_s: float) -> RouterAnswer:
        return self.router_step.answer(request)

    def health(self, host: Host, options: HealthOptions) -> HostHealth:
        """Each recorded deployment's server checks, as the real sweep names them: its process, /health,
        /v1/models and the smoke prompt (asked only of a live server)."""
        self.sweeps += 1
        checks: list[Check] = []
        up = {}
        for name in sorted(self.records):
            pid = next((p for p, of in self.servers.items() if of == name), None)
            up[name] = pid is not None
            if pid is None:
                checks.append(Check("server", CRITICAL, "recorded server is not running", deployment=name))
                continue
            checks += [
                Check("server", OK, f"pid {pid} alive", deployment=name),
                Check("http_health", OK, "/health 200", deployment=name),
                Check("models", OK, "/v1/models lists the served model", deployment=name),
            ]
            if name in self.answers_wrong:
                checks.append(Check("generation", CRITICAL, "answered 'five', expected /4/", deployment=name))
            else:
                checks.append(Check("generation", OK, "answered '4'", deployment=name))
        status = worst([c.status for c in checks]) if checks else OK
        return HostHealth(self.host_name, status, tuple(checks), server_up=all(up.values()), up=up)

    def watch(
        self,
        python: str,
        request: WatchRequest,
        *,
        stdin: bytes,
        on_event: Callable[[StepEvent], bool],
        timeout_s: float,
    ) -> int:
        self.watched.append(request)
        attempt = self.watches.pop(0)
        offset = request["offset"]
        said: list[dict[str, Any]] = [{"e": "line", "t": t, "o": offset + i + 1} for i, t in enumerate(attempt.lines)]
        self._ended_as(request, attempt)
        for event in [*said, *attempt.end]:
            if not on_event(event):  # type: ignore[arg-type]
                return 0
        if request.get("hold") and attempt.end and attempt.end[-1]["e"] == "done":
            # a group's proven rank keeps its lock, saying so, until fleet has proven every rank
            deadline = time.monotonic() + HELD_FOR_AT_MOST_S
            while on_event({"e": "held"}) and time.monotonic() < deadline:
                time.sleep(0.005)
        return 0

    def _ended_as(self, request: WatchRequest, attempt: Watch) -> None:
        """What the attempt leaves on the host: a proven one its success recorded, one that ended its server gone."""
        name, last = request.get("deployment", ""), (attempt.end[-1]["e"] if attempt.end else "")
        if last == "done" and name in self.records and request.get("success_state"):
            self.records[name] = {**self.records[name], **request["success_state"]}  # type: ignore[typeddict-item]
        elif last == "exit":
            self.servers.pop(request.get("pgid", -1), None)
