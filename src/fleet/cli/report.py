"""How a deploy's progress and outcome are shown: phases on stderr, the live log line on a terminal,
the result as text or JSON."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from fleet import events
from fleet.cli.base import say
from fleet.protocol import STOPPED, ActResult
from fleet.startup import PHASE_TITLES
from fleet.terminal import duration, safe_line, size

if TYPE_CHECKING:  # rich loads when a deploy shows progress, not for `fleet --help` or a cron run
    from fleet.cli.live import LiveBoard


def describe_stopped(stopped: list[dict[str, Any]]) -> list[str]:
    """One line per process group fleet stopped: its main command and how many processes went with it."""
    from fleet.facts import one_line

    groups: dict[int, list[dict[str, Any]]] = {}
    for p in stopped:
        groups.setdefault(p["pgid"], []).append(p)
    lines = []
    for members in groups.values():
        main = next((p for p in members if "sglang." in p["cmdline"] or "vllm" in p["cmdline"]), members[0])
        how = f"; {main['stop']}" if main.get("stop") else ""
        if main.get("pid") is None:  # a container docker lists without its pid: named by the container alone
            lines.append(f"{main['why']} ({main.get('stop') or STOPPED}): {one_line(main['cmdline'])[:100]}")
            continue
        lines.append(
            f"{main['why']} pid {main['pid']} (+{len(members) - 1} in its group{how}): "
            + one_line(main["cmdline"])[:100]
        )
    return lines


def describe_left(left: list[dict[str, Any]]) -> list[str]:
    """The GPU daemons and tools fleet saw holding the devices and left running."""
    return [f"left running: {p['why']} (pid {p['pid']}, user {p['user']})" for p in left]


# Another user's job is never a hint to force: it is said to be theirs first.
OTHER_USERS = "another user's job: ask them before stopping it with --force"


def describe_stop(out: ActResult) -> list[str]:
    """`fleet stop`'s answer for a host, a line each: what it stopped and left, what was not fleet's to stop
    (said and left: stopping fleet's own server never needs --force), GPU memory that did not come back."""
    lines = [*describe_stopped(out.get("ended", [])), *describe_left(out.get("left", []))]
    lines += [
        f"not stopped: pid {p.get('pid')} (user {p.get('user')}: {str(p.get('cmdline'))[:80]}) — {p['why']}; "
        + (OTHER_USERS if p.get("other_user") else "--force stops it")
        for p in out.get("refused", [])
    ]
    lines += [
        f"GPU memory still in use on GPU {', '.join(map(str, m['gpus']))} after {m['waited_s']:.0f}s "
        f"({m['mib'] / 1024:.1f} GiB{'; deployment ' + m['deployment'] if m.get('deployment') else ''}): "
        "nvidia-smi on the host shows what holds it"
        for m in out.get("memory_held", [])
    ]
    return lines


def describe_host_stop(host: str, out: ActResult) -> str:
    """A host's part of `fleet stop`'s answer: a line, then describe_stop's lines indented."""
    return f"{host}: stopped {len(out.get('ended', []))} process(es)" + "".join(f"\n  {x}" for x in describe_stop(out))


class PullShown:
    """A model pull's progress as lines: its plan, then a line at each tenth of the download or every
    10 s, whichever comes first (a terminal or a log file alike)."""

    def __init__(self) -> None:
        self.shown_tenth = -1
        self.shown_at = 0.0

    def lines(self, ev: events.Event) -> list[str]:
        if isinstance(ev, events.ModelPullPlanned):
            have = f" ({size(ev.have)} there from an earlier pull)" if ev.have else ""
            what = f"pushing from {safe_line(ev.source)}" if ev.source else f"pulling commit {ev.commit[:12]}"
            return [f"{what} to {safe_line(ev.path)}: {ev.files} files, {size(ev.bytes)}{have}; {size(ev.free)} free"]
        if isinstance(ev, events.ModelPullProgress) and ev.total:
            tenth, now = ev.done * 10 // ev.total, time.monotonic()
            if tenth > self.shown_tenth or now - self.shown_at >= 10:
                self.shown_tenth, self.shown_at = tenth, now
                eta = f", {ev.eta_s:.0f}s left" if ev.eta_s is not None and ev.done < ev.total else ""
                return [
                    f"{ev.done * 100 // ev.total}% {size(ev.done)} of {size(ev.total)}, {size(int(ev.rate_bps))}/s{eta}"
                ]
        return []


def may_be_terminal(stream: Any) -> bool:
    """Whether rich could take `stream` for a terminal: one, or told to (FORCE_COLOR, TTY_COMPATIBLE). Asked
    before rich is imported: its console is ~60 ms of a run's start, spent for nothing in cron or a pipe."""
    import os

    forced = any(os.environ.get(name) for name in ("FORCE_COLOR", "TTY_COMPATIBLE"))
    try:
        return forced or stream.isatty()
    except (AttributeError, ValueError):  # replaced by something without one, or closed
        return forced


class Reporter:
    """Progress of a deploy on stderr: what happens, a line each; on a terminal, also its live line (the
    phase, its progress and ETA, the engine's last log line: fleet.cli.live), unless the log is shown."""

    def __init__(self, host: str, quiet: bool = False, show_log: bool = False, board: LiveBoard | None = None) -> None:
        """`board`: where the live line is drawn (default: this process's terminal, when stderr is one)."""
        self.host = host
        self.quiet = quiet
        self.show_log = show_log
        self.started = time.monotonic()
        self.pull = PullShown()
        self.phase = ""  # the start-up phase last said (a new one gets its own line)
        self.board = None if quiet or show_log else board
        if self.board is None and not quiet and not show_log and may_be_terminal(sys.stderr):
            from fleet.cli.live import terminal_board

            self.board = terminal_board()
        self.row = self.board.row(host) if self.board else None

    def say(self, text: str) -> None:
        if not self.quiet and not (self.board and self.board.say(text)):
            say(text, err=True)

    def close(self) -> None:
        """The deploy ended: its live line goes (the board, with the last one)."""
        if self.board and self.row:
            self.board.drop(self.row)

    def __call__(self, event: events.Event) -> None:
        elapsed = time.monotonic() - self.started
        h = self.host
        if isinstance(event, events.Planned):
            self.say(f"{h}: {event.model}")
            if event.placement:
                self.say(f"{h}: deployment {event.deployment} on {event.placement}")
            if event.learned:
                self.say(f"{h}: the plan includes learned fixes: {', '.join(event.learned)}")
        elif isinstance(event, events.AttemptStarted):
            if self.row:
                self.row.attempt, self.row.max, self.row.phase = event.attempt, event.max, None
                self.row.transfer = None
            self.say(f"{h}: attempt {event.attempt}/{event.max} [{elapsed:5.1f}s]")
        elif isinstance(event, events.EngineChecked):
            self.say(f"{h}: engine's own argument check: {event.verdict}")
            if event.resolved:
                self.say(f"{h}: the engine resolved: {describe_resolved(event.resolved)}")
        elif isinstance(event, events.Replanned):
            picks = ", ".join(f"{k} {v}" for k, v in event.picks.items())
            self.say(f"{h}: the engine picks {picks} itself here, not what fleet's table said: planned again on")
            self.say(f"{h}: its picks before stopping anything: {describe_change(event.before, event.after)}")
        elif isinstance(event, events.EngineCheckSkipped):
            self.say(f"{h}: engine's own argument check: not needed (this command line ran with {event.version} here)")
        elif isinstance(event, events.Stopped):
            self._stopped(event)
        elif isinstance(event, events.WeightCache):
            said = "kept" if event.kept else f"started pid {event.pid}, log {event.log}"
            self.say(f"{h}: weight cache daemon {said}: {event.why}")
        elif isinstance(event, events.Launched):
            started = f"launched pid {event.pid}" if event.pid > 0 else "the launch did not start a process"
            self.say(f"{h}: {started}, log {event.log} [{elapsed:5.1f}s]")
            if self.board and self.row:
                self.board.show(self.row)
        elif isinstance(event, events.LogLine):
            self._log_line(event.line, elapsed)
        elif isinstance(event, events.StartupPhase):
            self._phase(event, elapsed)
        elif isinstance(event, events.StartupStalled):
            usual = f"usually {duration(event.usual_s)} here" if event.usual_s is not None else "no history here"
            self.say(
                f"{h}: start-up: {PHASE_TITLES.get(event.phase, event.phase)} quiet for {duration(event.after_s)} "
                f"(stall bound {duration(event.bound_s)}, {usual}); waiting on as the playbook says "
                f"(on_stall: wait), up to ready_timeout_s {duration(event.ready_timeout_s)}"
            )
        elif isinstance(event, events.ModelPullPlanned | events.ModelPullProgress):
            self._pull(event)
        elif isinstance(event, events.Pulling):
            self.say(f"{h}: pull {safe_line(event.image)}: {safe_line(event.line)}")
        elif isinstance(event, events.Diagnosed):
            d = event.diagnosis
            self.say(
                f"{h}: attempt {event.attempt} {event.outcome}: {d['category']}"
                f"{' (' + d['signature'] + ')' if d['signature'] else ''} — {d['explanation']}"
            )
            for line in d["evidence"][:4]:
                self.say(f"    > {line}")
        elif isinstance(event, events.Relaunching):
            where = "re-checking (nothing was stopped)" if event.nothing_stopped else "relaunching"
            self.say(f"{h}: {where} with the fix: {event.fix} (attempt {event.attempt}/{event.max})")
        elif isinstance(event, events.Reconnecting):
            self.say(f"{h}: connection dropped; reconnecting and resuming the log at byte {event.offset}")
        elif isinstance(event, events.LogReset):
            self.say(f"{h}: the engine's log was {event.why} ({safe_line(event.log)}); following it from the start")
        elif isinstance(event, events.LockTakenOver):
            prev = event.previous
            self.say(f"{h}: took over a stale lock of {prev.get('owner')} ({prev.get('command')})")
        elif isinstance(event, events.Ready):
            self.say(f"{h}: ready; smoke answer {event.smoke.get('text', '')!r} [{elapsed:5.1f}s]")
        elif isinstance(event, events.Adopted):
            self.say(f"{h}: pid {event.pid} already runs this plan; checked it instead of restarting it:")
            for line in event.checks:
                self.say(f"    {line}")
        elif isinstance(event, events.ServiceStep):
            self.say(f"{h}: {event.replica + ': ' if event.replica else ''}{event.what}")
        elif isinstance(event, events.NotAdopted):
            self.say(f"{h}: the running server has this plan but fails: {'; '.join(event.problems)}; redeploying")

    def _stopped(self, event: events.Stopped) -> None:
        h = self.host
        for line in describe_stopped(event.stopped):
            self.say(f"{h}: stopped {line}")
        for line in describe_left(event.left):
            self.say(f"{h}: {line}")
        mem = event.memory or {}
        if event.stopped and mem.get("before_mib") is not None:
            freed = sum(mem["before_mib"]) - sum(mem["after_mib"] or [])
            self.say(f"{h}: GPU memory released: {freed / 1024:.1f} GiB in {mem['waited_s']:.1f}s")

    def _pull(self, event: events.ModelPullPlanned | events.ModelPullProgress) -> None:
        """A model's transfer: a bar on the live line, on a terminal; lines for logs and pipes."""
        if self.board and self.row and isinstance(event, events.ModelPullProgress):
            self.row.transfer = event
            return
        for line in self.pull.lines(event):
            self.say(f"{self.host}: {line}")
        if self.board and self.row and isinstance(event, events.ModelPullPlanned):
            self.row.verb = "pushing" if event.source else "pulling"
            self.board.show(self.row)

    def _phase(self, event: events.StartupPhase, elapsed: float) -> None:
        """A new phase is said on a line of its own, with the ETA; its progress only on the live line."""
        if self.row:
            self.row.phase, self.row.phase_seen_at = event, time.monotonic()
        if event.phase != self.phase:
            self.phase = event.phase
            progress = f" {event.done}/{event.of}" if event.of else ""
            self.say(
                f"{self.host}: start-up: {PHASE_TITLES.get(event.phase, event.phase)}{progress} — {eta_text(event)}"
            )

    def _log_line(self, text: str, elapsed: float) -> None:
        if self.show_log:
            self.say(f"  | {safe_line(text)}")
        elif self.board and self.row:
            self.row.line = safe_line(text)[:500]
            self.board.show(self.row)


def eta_text(event: events.StartupPhase) -> str:
    """How long until ready, and what that is based on; no guess on a first start."""
    if event.eta_s is None:
        return "no ETA yet: the first start of this model, engine version and GPUs on this host"
    plural = "s" if event.starts != 1 else ""
    return f"ready in about {duration(event.eta_s)} (from {event.starts} earlier start{plural} here)"


def starting_text(startup: dict[str, Any]) -> str:
    """A starting server's phase for `fleet status` (fleet.startup.phase_now): where, for how long, and
    when it should be ready."""
    progress = f" {startup['done']}/{startup['of']}" if startup.get("of") else ""
    event = events.StartupPhase(phase=startup["phase"], at=0.0, eta_s=startup["eta_s"], starts=startup["starts"])
    return (
        f"start-up: {startup['title']}{progress} for {duration(startup['in_phase_s'])} "
        f"({duration(startup['elapsed_s'])} since launch); {eta_text(event)}"
    )


def describe_change(before: list[str], after: list[str]) -> str:
    """What changed between two engine command lines, flag by flag: `-flag v`, `+flag v`, `flag a -> b`."""
    from fleet.plan import args_dict

    a, b = args_dict(before), args_dict(after)
    words = [f"-{k}" + (f" {v}" if v is not None else "") for k, v in a.items() if k not in b]
    words += [f"+{k}" + (f" {v}" if v is not None else "") for k, v in b.items() if k not in a]
    words += [f"{k} {a[k]} -> {b[k]}" for k in a if k in b and a[k] != b[k]]
    return ", ".join(words) or "no change"


def describe_resolved(resolved: object) -> str:
    """What the engine decided for the settings the plan left to it, as its own check on the host said
    (whatever the host answered: only a mapping's first 16 entries, each cut short, terminal-safe)."""
    items = list(resolved.items())[:16] if isinstance(resolved, dict) else []
    return ", ".join(f"{safe_line(str(k))[:40]} {safe_line(str(v))[:80]}" for k, v in items)


def progress_for(host: str, *, as_json: bool = False, show_log: bool = False) -> events.Sink:
    """Where a deploy's events go: the terminal reporter, or JSON lines on stderr with `--json` (stdout
    keeps the result); always the structured log too (shown with --debug, or in a --log-file)."""
    shown: events.Sink = events.JsonLines(host, sys.stderr) if as_json else Reporter(host, show_log=show_log)
    return events.Detached(events.fanout(shown, events.logged(host)))


def print_result(r: Any) -> None:
    if r.ok and r.adopted:
        say(f"{r.host}: {r.name} is up at {r.endpoint}: {r.reason} (`fleet restart` restarts it).")
        return
    if r.ok:
        fixes = f"; fixed on the way: {', '.join(r.new_fixes)}" if r.new_fixes else ""
        say(f"{r.host}: {r.name} is up at {r.endpoint} after {len(r.attempts)} attempt(s) in {r.ready_s:.1f}s{fixes}.")
        if r.learned_applied:
            say(f"{r.host}: learned fixes used: {', '.join(r.learned_applied)}")
        return
    last = r.attempts[-1]
    d = last.diagnosis
    say(f"{r.host}: {r.name} FAILED after {len(r.attempts)} attempt(s): {r.reason}", err=True)
    if r.refused_before_stopping:
        say("  the engine's own check refused it before anything on the host was stopped", err=True)
    if r.not_stopped:
        say(
            f"  NOT stopped or recorded as failed: {r.not_stopped} — what the last attempt left may still run; "
            f"`fleet stop --host {r.host}/{r.deployment or r.playbook}` once the host is reachable.",
            err=True,
        )
    if d is not None:
        say(f"  diagnosis: {d.category}{' (' + d.signature + ')' if d.signature else ''}: {d.explanation}", err=True)
        for line in d.evidence:
            say(f"  evidence: {line}", err=True)
    if last.log:
        say(f"  log: {last.log}", err=True)
    if r.log_tail:
        say("  last log lines:", err=True)
        for line in r.log_tail[-40:]:
            say(f"    {line}", err=True)


def result_json(r: Any) -> dict[str, Any]:
    return {
        "host": r.host,
        "playbook": r.playbook,
        "deployment": r.deployment or r.playbook,
        "ok": r.ok,
        "reason": r.reason,
        "not_stopped": r.not_stopped,
        "endpoint": r.endpoint,
        "ready_s": round(r.ready_s, 3),
        "adopted": r.adopted,
        "round_trips": r.round_trips,
        "learned_applied": list(r.learned_applied),
        "new_fixes": r.new_fixes,
        "argv": r.plan.argv(),
        "attempts": [attempt_json(a) for a in r.attempts],
    }


def attempt_json(a: Any) -> dict[str, Any]:
    return {
        "n": a.number,
        "outcome": a.outcome,
        "fix": a.fix,
        "log": a.log,
        "seconds": round(a.seconds, 3),
        "diagnosis": a.diagnosis.to_json() if a.diagnosis else None,
    }
