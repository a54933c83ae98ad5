"""What a deploy reports while it runs, as typed events sent to one sink.

The deploy loop (fleet.control.deploy, fleet.control.ops) says what happened by calling its sink with one
of these; it never formats text. Listeners decide how it is shown: the terminal reporter
(fleet.cli.report), JSON lines (`fleet deploy --json`, one object per event on stderr) and the structured
log (`--debug`, `fleet health --log-file`). Tests assert on the captured events.

Every field is JSON-ready (str, int, float, bool, lists and dicts of those): `to_json` is `asdict` plus the
event's kind. Values that came from the host (log lines, command lines) are already redacted of secrets.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import time
from collections.abc import Callable
from typing import IO, Any, ClassVar

import msgspec


class Planned(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "planned"
    model: str
    argv: list[str]
    learned: list[str]  # learned fixes the plan already includes
    deployment: str = ""
    placement: str = ""  # which GPUs, and why: "GPUs 6,7 as asked", "all 8 GPUs"


class Adopted(msgspec.Struct, frozen=True):
    """The server already running this plan passed its checks; nothing was restarted."""

    kind: ClassVar[str] = "adopted"
    pid: int | None
    checks: list[str]


class NotAdopted(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "not_adopted"
    problems: list[str]


class EngineCheckSkipped(msgspec.Struct, frozen=True):
    """This command line already ran with this engine version on the host."""

    kind: ClassVar[str] = "engine_check_skipped"
    version: str


class AttemptStarted(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "attempt"
    attempt: int
    max: int
    argv: list[str]


class LockTakenOver(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "lock_taken_over"
    previous: dict[str, Any]


class EngineChecked(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "engine_check"
    verdict: str  # "accepted", "rejected" or "unavailable"
    resolved: dict[str, str] = msgspec.field(default_factory=dict)  # what the engine decided for settings left to it


class Replanned(msgspec.Struct, frozen=True):
    """The engine's check picked differently from what the plan stood on (fleet.plan.picks): planned again
    on the engine's own picks before anything was stopped."""

    kind: ClassVar[str] = "replanned"
    picks: dict[str, str]  # setting -> what the engine picks itself, where the plan assumed otherwise
    before: list[str]
    after: list[str]


class Stopped(msgspec.Struct, frozen=True):
    """What the act step stopped (process records), what it saw and left running, GPU memory released."""

    kind: ClassVar[str] = "stopped"
    stopped: list[dict[str, Any]]
    left: list[dict[str, Any]] = msgspec.field(default_factory=list)
    memory: dict[str, Any] | None = None


class WeightCache(msgspec.Struct, frozen=True):
    """What became of the deployment's weight cache daemon before the engine launched (fleet.plan.weight_cache):
    kept for this engine (its weights are reused), or started (pid, log), and why."""

    kind: ClassVar[str] = "weight_cache"
    kept: bool
    why: str
    pid: int | None = None
    log: str | None = None


class Launched(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "launched"
    pid: int
    log: str


class LogLine(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "log"
    line: str


class Pulling(msgspec.Struct, frozen=True):
    """A line of the container runtime's output while it pulls the deployment's image."""

    kind: ClassVar[str] = "pulling"
    image: str
    line: str


class ModelPullPlanned(msgspec.Struct, frozen=True):
    """What `fleet pull` is about to download: the Hub's commit, and the disk it checked first."""

    kind: ClassVar[str] = "model_pull_planned"
    path: str
    commit: str
    files: int
    bytes: int
    have: int  # already on the host from an earlier, cut pull
    free: int
    source: str | None = None  # a push (`fleet pull --from`): the host or directory the files come from


class ModelPullProgress(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "model_pull_progress"
    done: int
    total: int
    rate_bps: float  # since the pull started
    eta_s: float | None


class StartupStalled(msgspec.Struct, frozen=True):
    """A start-up phase went quiet past its bound (`bound_s`, from `usual_s` on this host when it has
    one) and the playbook says to keep waiting (on_stall: wait) until `ready_timeout_s`."""

    kind: ClassVar[str] = "stalled"
    phase: str
    after_s: float
    bound_s: float
    usual_s: float | None
    ready_timeout_s: float

    @classmethod
    def of_event(cls, ev: Any, ready_timeout_s: float) -> StartupStalled:
        def number(key: str) -> float | None:
            value = ev.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        after, bound = number("after_s") or 0.0, number("bound_s") or 0.0
        return cls(str(ev.get("phase")), after, bound, number("usual_s"), ready_timeout_s)


class LogReset(msgspec.Struct, frozen=True):
    """The engine's log was truncated or replaced; it is followed from its start."""

    kind: ClassVar[str] = "log_reset"
    why: str
    log: str


class StartupPhase(msgspec.Struct, frozen=True):
    """The engine entered a start-up phase (fleet.startup.PHASES) or moved along in it: `at` seconds after
    launch, `done` of `of` where it prints a progress bar, `eta_s` until ready judging by the `starts`
    earlier starts of this model, engine version and GPUs on this host (None: none yet)."""

    kind: ClassVar[str] = "phase"
    phase: str
    at: float
    done: int | None = None
    of: int | None = None
    eta_s: float | None = None
    usual_s: float | None = None  # how long this phase usually takes here
    starts: int = 0

    @classmethod
    def of_event(cls, ev: Any) -> StartupPhase:
        def number(key: str) -> Any:
            value = ev.get(key)
            return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(
            phase=str(ev.get("phase")),
            at=float(number("at") or 0.0),
            done=number("done"),
            of=number("of"),
            eta_s=number("eta_s"),
            usual_s=number("usual_s"),
            starts=int(number("starts") or 0),
        )


class Reconnecting(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "reconnecting"
    offset: int  # the byte of the log the resumed stream starts at


class Diagnosed(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "diagnosed"
    attempt: int
    outcome: str  # "crashed", "rejected", "timeout", "smoke_failed", "error"
    diagnosis: dict[str, Any]  # Diagnosis.to_json()


class Relaunching(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "relaunching"
    attempt: int  # the attempt about to start
    max: int
    signature: str
    fix: str
    explanation: str
    elapsed_s: float  # how long the failed attempt took
    nothing_stopped: bool  # the engine refused the command line: the old server still serves


class Ready(msgspec.Struct, frozen=True):
    kind: ClassVar[str] = "ready"
    attempt: int
    smoke: dict[str, Any]  # the smoke event: the answer's text and latency


class ServiceStep(msgspec.Struct, frozen=True):
    """A step of bringing up or rolling a service: the router, or one replica in it."""

    kind: ClassVar[str] = "service"
    service: str
    what: str  # "router started", "deregistered", "registered", "refused: ...", "proved"
    replica: str = ""  # host/deployment, when the step is one replica's


Event = (
    Planned
    | Adopted
    | NotAdopted
    | EngineCheckSkipped
    | AttemptStarted
    | LockTakenOver
    | EngineChecked
    | Replanned
    | Stopped
    | WeightCache
    | Launched
    | LogLine
    | Pulling
    | ModelPullPlanned
    | ModelPullProgress
    | LogReset
    | StartupPhase
    | StartupStalled
    | Reconnecting
    | Diagnosed
    | Relaunching
    | Ready
    | ServiceStep
)
Sink = Callable[[Event], None]


def to_json(event: Event) -> dict[str, Any]:
    return {"event": event.kind, **msgspec.structs.asdict(event)}


def ignore(event: Event) -> None:
    """The sink of a deploy nobody watches (a heal from cron logs through `logged` instead)."""


class fanout:  # noqa: N801 - used as a function: fanout(a, b) is a sink
    """A sink that sends each event to every one of `sinks`, in order; `close` closes those that close."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks

    def __call__(self, event: Event) -> None:
        for sink in self.sinks:
            sink(event)

    def close(self) -> None:
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if close is not None:
                close()


class Detached:
    """A sink that never blocks its caller: events are handed to a thread that delivers them to `sink`. A
    terminal nobody reads (`| less` left open, Ctrl-S) blocks that thread only: the deploy reading the host's
    watcher goes on (it stopped reading, and the host took fleet for frozen and stopped a healthy server).
    While `limit` log lines wait, newer ones are dropped and counted (said once delivery resumes); other
    events, a few per attempt, always wait their turn. `close()` delivers the rest and ends the thread;
    events after it are delivered at once."""

    def __init__(self, sink: Sink, limit: int = 2000) -> None:
        import queue
        import threading

        self.sink, self.limit = sink, limit
        self.queue: queue.Queue[tuple[Event, bool] | None] = queue.Queue()  # (event, a log line counted)
        self.lines_waiting = self.dropped = 0
        self.closed = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._deliver, name="progress", daemon=True)
        self.thread.start()
        _DETACHED.append(self)

    def __call__(self, event: Event) -> None:
        with self.lock:
            if self.closed:
                self.sink(event)
                return
            line = isinstance(event, LogLine | StartupPhase)  # a phase's progress is a log line, read
            if line:
                if self.lines_waiting >= self.limit:
                    self.dropped += 1
                    return
                self.lines_waiting += 1
            self._say_dropped()
            self.queue.put((event, line))

    def _say_dropped(self) -> None:
        """Where the dropped lines were, in order: before what comes after them (the lock is held)."""
        if self.dropped:
            self.queue.put(
                (LogLine(f"[fleet] {self.dropped} log lines not shown: the terminal was not reading"), False)
            )
            self.dropped = 0

    def _deliver(self) -> None:
        while (item := self.queue.get()) is not None:
            event, counted = item
            with self.lock:
                self.lines_waiting -= counted
            with contextlib.suppress(Exception):  # a sink's failure (a closed terminal) must not stop delivery
                self.sink(event)
        close = getattr(self.sink, "close", None)  # here, not in close(): a terminal that blocks, blocks this thread
        if close is not None:
            with contextlib.suppress(Exception):
                close()

    def close(self, timeout_s: float | None = None) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._say_dropped()
            self.queue.put(None)
        self.thread.join(timeout_s)
        if self in _DETACHED:
            _DETACHED.remove(self)


_DETACHED: list[Detached] = []
# at exit (Ctrl-C included) what was given is shown, unless the terminal stays paused for long
atexit.register(lambda: flush_progress(5.0))


def flush_progress(timeout_s: float | None = None) -> None:
    """Deliver what every detached sink was given (before a result is printed after it), and end them."""
    for sink in list(_DETACHED):
        sink.close(timeout_s)


class JsonLines:
    """One JSON object per event on a stream: {"host", "elapsed_s", "event", ...the event's fields}."""

    def __init__(self, host: str, stream: IO[str]) -> None:
        self.host, self.started = host, time.monotonic()
        self.stream: IO[str] | None = stream

    def __call__(self, event: Event) -> None:
        if self.stream is None:
            return
        elapsed = round(time.monotonic() - self.started, 3)
        from fleet.secrets import hidden  # a line's text may quote what a host said

        try:
            self.stream.write(json.dumps(hidden({"host": self.host, "elapsed_s": elapsed, **to_json(event)})) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a broken pipe: nobody reads the progress (`| head`): the deploy goes on
            self.stream = None


def logged(host: str) -> Sink:
    """Events to the structured log (fleet.log): engine log lines at debug, the rest at info."""
    from fleet import log
    from fleet.terminal import safe_line

    logger = log.get(host=host)

    def send(event: Event) -> None:
        # on a terminal (--debug) structlog prints strings as they are: text from the host is made safe
        # first; nested values are printed as their repr, which escapes control characters
        data = {k: safe_line(v) if isinstance(v, str) else v for k, v in msgspec.structs.asdict(event).items()}
        (logger.debug if isinstance(event, LogLine) else logger.info)(event.kind, **data)

    return send
