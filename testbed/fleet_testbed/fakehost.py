"""A scripted host for the deploy loop's branches (fleet.control.host_steps.HostSteps), in memory: each
act answers as the real step does for the case scripted (the lock taken or held, the engine's check
accepting, rejecting or picking otherwise, a launch), and each watch plays the next attempt's log and
ending as the real watch step's events. What fleet does on a host is proven elsewhere, over real sshd
and in simulated hosts; this proves what the loop does with each answer, in milliseconds."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleet.facts import HostFacts
from fleet.host.check import budget_short
from fleet.hostscripts import StepEvent
from fleet.protocol import ActRequest, ActResult, CheckResult, ProbeRequest, WatchRequest

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


@dataclass
class ScriptedHost:
    """`facts`: what the probe finds (factsdata builds them); `watches`: each watch step in turn (a resumed
    watch takes the next one); `checks`: the engine's verdict on each launch's command line in turn
    (accepted when none is left); `picks_differ`: the engine picks otherwise than the plan stood on, once,
    when asked; `lock`: the lock step's answer."""

    facts_found: HostFacts | None = None
    watches: list[Watch] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    picks_differ: dict[str, str] | None = None
    lock: str = "taken"
    host_name: str = "scripted"
    acts: list[ActRequest] = field(default_factory=list)  # every act request fleet sent, in order
    watched: list[WatchRequest] = field(default_factory=list)  # every watch request

    @property
    def commands_run(self) -> int:
        return len(self.acts) + len(self.watched)

    def facts(self, request: ProbeRequest, pythons: Sequence[str]) -> HostFacts:
        assert self.facts_found is not None, "a scripted host probed without facts to answer with"
        return replace(self.facts_found, host=self.host_name)

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
        return out

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
        for event in [*said, *attempt.end]:
            if not on_event(event):  # type: ignore[arg-type]
                return 0
        if request.get("hold") and attempt.end and attempt.end[-1]["e"] == "done":
            # a group's proven rank keeps its lock, saying so, until fleet has proven every rank
            deadline = time.monotonic() + HELD_FOR_AT_MOST_S
            while on_event({"e": "held"}) and time.monotonic() < deadline:
                time.sleep(0.005)
        return 0
