"""Watching one attempt: the host's watch step follows the engine's log and proves the server, and fleet
reads its events here, resuming from the last byte offset when the connection is cut. A group's rank is
held (`Hold`) once proven, until the whole group is."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from fleet import events
from fleet.crashes.classify import ANSWERED_HEALTH
from fleet.errors import HostSilent, HostStepError, HostUnreachable
from fleet.hostscripts import StepEvent, deployment_python
from fleet.plan import LaunchPlan
from fleet.protocol import Launched, WatchEvent, WatchRequest

if TYPE_CHECKING:
    from fleet.control.deploy import Deployer

READY_REGEX = {
    "sglang": r"The server is fired up and ready to roll!",
    "vllm": r"Application startup complete\.|Starting vLLM (API )?server on http",
}
NEVER = r"(?!)"  # a group's other ranks print no ready line: their /health says it
TERMINAL_EVENTS = {"done", "exit", "smoke", "timeout", "error", "lost_lock"}
# fleet reading nothing from its watcher for this long (stopped with SIGSTOP, swapped out) is frozen: the
# watcher stops the attempt's server, records it failed and frees the host rather than wait for fleet
WATCH_STALLED_S = 30.0
# A watch whose connection was cut resumes from its offset up to five times, after these waits (seconds).
RESUME_WAITS_S = (0.2, 0.4, 0.8, 1.6, 3.2)


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


WATCHED_EVENTS = 10_000


def watch_attempt(
    d: Deployer,
    plan: LaunchPlan,
    launched: Launched,
    success: WatchRequest,
    on_line: Callable[[str], None],
    hold: Hold | None = None,
) -> list[WatchEvent]:
    """Stream the attempt; reconnect and resume from the last byte offset if the connection drops.
    `hold`: a group's rank keeps its lock once proven, until `hold.released` (see fleet.host.watch.hold)."""
    offset = 0
    watched: list[WatchEvent] = []

    def on_event(raw: StepEvent) -> bool:
        nonlocal offset
        ev = cast(WatchEvent, raw)
        if ev["e"] == "held" and hold is not None:
            return not hold.released.is_set()
        if ev["e"] == "smoke" and hold is not None:
            hold.smoke = ev
        if ev["e"] == "done" and hold is not None:
            hold.on_done()
        if ev["e"] == "line":  # kept by on_line, bounded; not among the events
            offset = ev["o"]
            on_line(ev["t"])
        elif ev["e"] == "skipped":  # the host dropped lines fleet did not read in time
            on_line(f"[fleet] {ev.get('lines')} log lines skipped: written faster than fleet read them")
        elif ev["e"] == "phase":  # the start-up's phase or progress: said, not among the events
            d.progress(events.StartupPhase.of_event(ev))
        elif ev["e"] == "stalled":  # a stall the playbook waits through: said, the watch goes on
            d.progress(events.StartupStalled.of_event(ev, d.ready_timeout_s))
        else:
            if ev["e"] == "ready_http":  # in the log's order: a start's fix is not taken from what follows
                on_line(ANSWERED_HEALTH)
            if ev["e"] == "log_reset":
                offset = 0
                d.progress(events.LogReset(str(ev.get("why")), launched["log"]))
            if len(watched) >= WATCHED_EVENTS:  # a real watch says a dozen (a log reset per rotation, ...)
                raise HostStepError(
                    f"{d.host.name}: the watch step said more than {WATCHED_EVENTS} events; it is not fleet's.",
                    "Check what runs as fleet's Python on the host (--debug).",
                )
            watched.append(ev)
        return True

    def once() -> int:
        args = _watch_request(d, plan, launched, success, offset, watched, hold)
        key = d.api_key(plan)  # for the smoke request; on stdin, never the step's command line
        hidden = json.dumps({"api_key": key}).encode() + b"\n"
        code = d.steps.watch(
            deployment_python(d.host, plan), args, stdin=hidden, on_event=on_event, timeout_s=d.ready_timeout_s + 300
        )
        if not watched or watched[-1]["e"] not in TERMINAL_EVENTS:
            # the watcher never said how it ended: its session was cut; resume from the last offset
            raise HostUnreachable(f"{d.host.name}: the log stream ended early (exit {code}).", "")
        return code

    # a cut connection is resumed, waiting longer each time; a host that answers nothing is not waited
    # for again. (A loop, not tenacity: importing it cost every deploy 16 ms before it connected.)
    for attempt, wait_s in enumerate((*RESUME_WAITS_S, None), start=1):
        if attempt > 1:
            d.progress(events.Reconnecting(offset))
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


def _watch_request(
    d: Deployer,
    plan: LaunchPlan,
    launched: Launched,
    success: WatchRequest,
    offset: int,
    watched: list[WatchEvent],
    hold: Hold | None,
) -> WatchRequest:
    """The watch step's request: follow the attempt's log from `offset`, prove the server, and record
    `success` on the host once it is proven."""
    return {
        **success,
        "log": launched["log"],
        "exit_file": launched["exit_file"],
        "pgid": launched["pgid"],
        "start_ticks": launched.get("start_ticks"),  # the group's leader as launched: its id is reused later
        "container": launched.get("container"),
        "offset": offset,
        "ready_seen": any(e["e"] in ("ready_line", "ready_http") for e in watched),
        "client_on_stdin": True,
        "ready_regex": READY_REGEX[plan.engine] if d.smoke else NEVER,
        "address": plan.check_address,
        "port": plan.port,
        "served_name": plan.served_name,
        "smoke": d.smoke,
        "ready_timeout_s": d.ready_timeout_s,
        "progress_timeout_s": d.progress_timeout_s,
        "startup_key": d.startup_key(plan),
        "startup_fixes": list(plan.applied_fixes),  # kept with the start: what changed since the last
        "stall_floor_s": d.stall_floor_s,
        "on_stall": d.on_stall,
        "health_timeout_s": 120.0,
        "state_dir": d.host.settings.state_dir,
        "deployment": d.deployment,
        "run_id": d.run_id,
        "owner": d.owner,
        "hold": hold is not None,
        "stalled_s": WATCH_STALLED_S,
        "key_on_stdin": True,
    }
