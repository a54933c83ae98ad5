"""Runs ON the host inside the watch step (fleet.hostscripts): the attempt's start-up as it happens, its
phases said as events, a stall called before the blind ready timeout, and its timeline kept in the host's
history (STARTUP_FILE) so the next start on this host has an ETA and bounds of its own.

Host code: standard library only, Python 3.8. The reading of lines and the arithmetic are fleet.startup's.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    STARTUP_FILE  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.records import (
        PHASE_FILE,
        STARTUP_FILE,
        RecordTooNew,
        deployment_dir,
        host_guard,
        read_record,
        write_record,
    )
    from fleet.protocol import WatchRequest
    from fleet.startup import (
        STALL_FLOOR_S,
        StartupTimeline,
        stall_bound,
        startup_eta,
        typical_startup,
        usual_length,
    )

STARTS_KEPT = 10  # per model x engine version x GPUs: enough for a median, small enough to follow change
KEYS_KEPT = 64  # combinations kept on one host; the least recently started are dropped first
PUBLISH_EVERY_S = 1.0  # a progress bar's moves reach PHASE_FILE at most this often (a new phase at once)


def startup_history(state_dir: str, key: str) -> List[Dict[str, Any]]:
    try:
        kept = (read_record(os.path.join(os.path.expanduser(state_dir), STARTUP_FILE)) or {}).get(key)
    except RecordTooNew:  # a newer fleet keeps this host's history: no ETA from it, and it stays as it is
        return []
    return [h for h in kept if isinstance(h, dict)] if isinstance(kept, list) else []


def remember_startup(state_dir: str, key: str, entry: Mapping[str, object]) -> None:
    """Add one start to the host's history, under the host's guard (another deployment's watcher may be
    writing its own start at the same moment)."""
    with host_guard(state_dir):
        path = os.path.join(os.path.expanduser(state_dir), STARTUP_FILE)
        history = read_record(path)
        history = history if isinstance(history, dict) else {}
        old = history.pop(key, None)
        starts = [h for h in old if isinstance(h, dict)] if isinstance(old, list) else []
        history[key] = (starts + [entry])[-STARTS_KEPT:]  # re-inserted last: the most recently started
        for old in list(history)[: max(0, len(history) - KEYS_KEPT)]:
            del history[old]
        write_record(path, history)


class StartupWatch:
    """One attempt's start-up as the watcher sees it: `line` says a phase change or progress as an event,
    `stalled` says when the current phase went quiet past its bound, `record` keeps the timeline."""

    def __init__(self, a: WatchRequest, started: float) -> None:
        self.key = a.get("startup_key")
        self.state_dir = a["state_dir"]
        self.started = started
        self.floor_s = float(a.get("stall_floor_s", STALL_FLOOR_S))
        self.timeline = StartupTimeline()
        self.typical = typical_startup(startup_history(self.state_dir, self.key)) if self.key else None
        self.ready_s: Optional[float] = None
        self.recorded = False
        # where `fleet status` reads the current phase (none for a watch without a deployment: tests)
        name = a.get("deployment")
        self.phase_path = os.path.join(deployment_dir(self.state_dir, name), PHASE_FILE) if name else None
        self.run_id = a.get("run_id")
        self.fixes = a.get("startup_fixes") or []  # the fixes this attempt's plan applies
        self.keep_waiting = a.get("on_stall") == "wait"  # the playbook's on_stall
        self.warned: Optional[Tuple[int, float]] = None  # the quiet spell a stall was said for (wait)
        self.published: Tuple[object, float] = (None, 0.0)  # (phase, when) last written to phase_path

    def line(self, text: str, now: float) -> Optional[Dict[str, Any]]:
        t = self.timeline
        if self.ready_s is not None or not t.feed(text, now - self.started):
            return None
        in_phase = now - self.started - t.spans[-1][1]
        eta = startup_eta(self.typical, t.phase, in_phase, now - self.started, t.done, t.of)
        said = {
            "e": "phase",
            "phase": t.phase,
            "at": round(now - self.started, 2),
            "done": t.done,
            "of": t.of,
            "eta_s": None if eta is None else round(eta, 1),
            "usual_s": usual_length(self.typical, t.phase),
            "starts": (self.typical or {}).get("starts", 0),
        }
        self.publish(said, now)
        return said

    def publish(self, said: Mapping[str, object], now: float) -> None:
        """Leave the phase where `fleet status` (another run, on another machine) can read it, with the
        wall-clock times it needs to count on: when the start and this phase began, when this was said."""
        last_phase, last_at = self.published
        if self.phase_path is None or (said["phase"] == last_phase and now - last_at < PUBLISH_EVERY_S):
            return
        self.published = (said["phase"], now)
        shown = dict((k, v) for k, v in said.items() if k != "e")
        shown.update(run_id=self.run_id, started=self.started, since=self.started + self.timeline.spans[-1][1])
        shown["updated"] = now
        try:
            write_record(self.phase_path, shown)
        except OSError:
            pass  # a full disk: status says less, the start goes on

    def unpublish(self) -> None:
        if self.phase_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.phase_path)

    def stalled(self, now: float) -> Optional[Dict[str, Any]]:
        t = self.timeline
        if self.ready_s is not None or t.phase is None:
            return None
        bound = stall_bound(self.typical, t.phase, self.floor_s)
        quiet = now - self.started - t.moved_at
        if bound is None or quiet <= bound:
            return None
        said = {"phase": t.phase, "after_s": quiet, "bound_s": bound, "usual_s": usual_length(self.typical, t.phase)}
        if not self.keep_waiting:
            return dict(said, e="timeout", what="stall")  # the attempt ends here
        if self.warned == (len(t.spans), t.moved_at):
            return None  # this quiet spell was said once: the watch waits on, up to the ready timeout
        self.warned = (len(t.spans), t.moved_at)
        return dict(said, e="stalled")

    def ready(self, now: float) -> None:
        if self.ready_s is None:
            self.ready_s = now - self.started
            self.timeline.close(self.ready_s)

    def record(self, outcome: str, now: float) -> Optional[Dict[str, Any]]:
        """Keep this start in the host's history, once (only starts that reached ready make an ETA); the
        entry kept, for the deployment's own record."""
        if self.recorded:
            return None
        self.recorded = True
        self.unpublish()  # the start is over: status reads the deployment's record from here on
        if not self.key:
            return None
        end = self.ready_s if self.ready_s is not None else now - self.started
        self.timeline.close(end)
        entry = {
            "outcome": outcome,
            "ready_s": round(end, 2),
            "phases": dict((k, round(v, 2)) for k, v in self.timeline.durations().items()),
            "order": [span[0] for span in self.timeline.spans],
            "at": round(now, 1),
            "fixes": [str(f) for f in self.fixes],
        }
        try:
            remember_startup(self.state_dir, self.key, entry)
        except (OSError, RecordTooNew):
            pass  # a full disk, or a newer fleet's history: the start is not remembered, the deploy goes on
        return entry
