"""What a deploy's attempts came to: each attempt, the run's result, and the end of its log fleet keeps;
and what a service's command came to, replica by replica."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fleet.crashes import Diagnosis, LogContext
from fleet.crashes.classify import ANSWERED_HEALTH
from fleet.errors import FleetError
from fleet.inventory.services import PlacedReplica
from fleet.model import ModelSpec
from fleet.plan import GpuSummary, LaunchPlan

# What fleet holds of an attempt's log while it watches: its last lines (a crash's traceback and what led to
# it), never the whole of a log an engine floods (20 MB/s grew fleet to 6.7 GB). The host cuts each line.
KEPT_LOG_LINES = 20000
KEPT_LOG_BYTES = 8 << 20


class LogTail:
    """The last lines of a log, at most KEPT_LOG_LINES of them and KEPT_LOG_BYTES in all. Once the line
    that says the server answered /health (ANSWERED_HEALTH) is dropped, `kept` begins with it again: a
    start's fix is never taken from what a client could write after it, however long the log grew since
    (found by a hostile pass)."""

    def __init__(self) -> None:
        self.lines: deque[str] = deque()
        self.chars = 0
        self.took_requests = False  # the /health line was among those dropped

    def append(self, line: str) -> None:
        self.lines.append(line)
        self.chars += len(line)
        while len(self.lines) > KEPT_LOG_LINES or self.chars > KEPT_LOG_BYTES:
            dropped = self.lines.popleft()
            self.chars -= len(dropped)
            self.took_requests = self.took_requests or dropped == ANSWERED_HEALTH

    def kept(self) -> list[str]:
        return [ANSWERED_HEALTH, *self.lines] if self.took_requests else list(self.lines)


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


@dataclass
class ReplicaOutcome:
    replica: PlacedReplica
    result: DeployResult | None = None
    error: FleetError | None = None
    url: str | None = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

    @property
    def name(self) -> str:
        return f"{self.replica.host}/{self.replica.deployment}"

    @property
    def refused(self) -> bool:
        """Refused before anything on its host was changed: pre-flight, or the engine's own check of every
        command line (a deploy's exit 4)."""
        if self.result is not None:
            return self.result.refused_before_stopping
        return self.error is not None and self.error.exit_code == 4


@dataclass
class ServiceResult:
    service: str
    ok: bool
    reason: str
    endpoint: str
    replicas: list[ReplicaOutcome] = field(default_factory=list)
    answer: dict[str, Any] | None = None

    @property
    def refused(self) -> bool:
        """Every replica was refused before anything was changed (exit 4, as a refused deploy)."""
        return not self.ok and bool(self.replicas) and all(o.refused for o in self.replicas)


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
