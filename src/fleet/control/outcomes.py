"""What a deploy's attempts came to: each attempt, the run's result, and the end of its log fleet keeps."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from fleet.crashes import Diagnosis
from fleet.plan import LaunchPlan

# What fleet holds of an attempt's log while it watches: its last lines (a crash's traceback and what led to
# it), never the whole of a log an engine floods (20 MB/s grew fleet to 6.7 GB). The host cuts each line.
KEPT_LOG_LINES = 20000
KEPT_LOG_BYTES = 8 << 20


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
