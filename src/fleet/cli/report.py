"""How a deploy's progress and outcome are shown: phases on stderr, the live log line on a terminal,
the result as text or JSON."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TYPE_CHECKING, Any

from fleet.cli.base import say
from fleet.terminal import safe_line

if TYPE_CHECKING:  # the inventory types and the rest load only when a command needs them: cron starts fleet often
    pass


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
        lines.append(
            f"{main['why']} pid {main['pid']} (+{len(members) - 1} in its group{how}): "
            + one_line(main["cmdline"])[:100]
        )
    return lines


def describe_left(left: list[dict[str, Any]]) -> list[str]:
    """The GPU daemons and tools fleet saw holding the devices and left running."""
    return [f"left running: {p['why']} (pid {p['pid']}, user {p['user']})" for p in left]


class Reporter:
    """Progress of a deploy on stderr: phases always; the live log line on a terminal."""

    def __init__(self, host: str, quiet: bool = False, show_log: bool = False) -> None:
        self.host = host
        self.quiet = quiet
        self.show_log = show_log
        self.started = time.monotonic()
        self.attempt = 1
        self.max = 1
        self.tty = sys.stderr.isatty()
        self.last_line = ""

    def say(self, text: str) -> None:
        if not self.quiet:
            if self.tty and self.last_line:
                sys.stderr.write("\r\x1b[K")
            say(text, err=True)

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        elapsed = time.monotonic() - self.started
        h = self.host
        if event == "planned":
            learned = data["learned"]
            self.say(f"{h}: {data['model']}")
            if learned:
                self.say(f"{h}: the plan includes learned fixes: {', '.join(learned)}")
        elif event == "attempt":
            self.attempt, self.max = data["attempt"], data["max"]
            self.say(f"{h}: attempt {self.attempt}/{self.max} [{elapsed:5.1f}s]")
        elif event == "engine_check":
            self.say(f"{h}: engine's own argument check: {data['verdict']}")
        elif event == "engine_check_skipped":
            self.say(
                f"{h}: engine's own argument check: not needed (this command line ran with {data['version']} here)"
            )
        elif event == "stopped":
            for line in describe_stopped(data["stopped"]):
                self.say(f"{h}: stopped {line}")
            for line in describe_left(data.get("left", [])):
                self.say(f"{h}: {line}")
            mem = data.get("memory") or {}
            if data["stopped"] and mem.get("before_mib") is not None:
                freed = sum(mem["before_mib"]) - sum(mem["after_mib"] or [])
                self.say(f"{h}: GPU memory released: {freed / 1024:.1f} GiB in {mem['waited_s']:.1f}s")
        elif event == "launched":
            self.say(f"{h}: launched pid {data['pid']}, log {data['log']} [{elapsed:5.1f}s]")
        elif event == "log":
            if self.show_log:
                self.say(f"  | {safe_line(data['line'])}")
            elif self.tty and not self.quiet:
                line = safe_line(data["line"])[: max(20, shutil.get_terminal_size().columns - 30)]
                sys.stderr.write(f"\r\x1b[K{h} [{self.attempt}/{self.max} {elapsed:5.1f}s] {line}")
                sys.stderr.flush()
                self.last_line = line
        elif event == "diagnosed":
            d = data["diagnosis"]
            self.say(
                f"{h}: attempt {data['attempt']} {data['outcome']}: {d['category']}"
                f"{' (' + d['signature'] + ')' if d['signature'] else ''} — {d['explanation']}"
            )
            for line in d["evidence"][:4]:
                self.say(f"    > {line}")
        elif event == "relaunching":
            where = "re-checking (nothing was stopped)" if data["nothing_stopped"] else "relaunching"
            self.say(f"{h}: {where} with the fix: {data['fix']} (attempt {data['attempt']}/{data['max']})")
        elif event == "reconnecting":
            self.say(f"{h}: connection dropped; reconnecting and resuming the log at byte {data['offset']}")
        elif event == "log_reset":
            self.say(f"{h}: the engine's log was {data['why']} ({safe_line(data['log'])}); following it from the start")
        elif event == "lock_taken_over":
            prev = data["previous"]
            self.say(f"{h}: took over a stale lock of {prev.get('owner')} ({prev.get('command')})")
        elif event == "ready":
            self.say(f"{h}: ready; smoke answer {data['smoke'].get('text', '')!r} [{elapsed:5.1f}s]")
        elif event == "adopted":
            self.say(f"{h}: pid {data['pid']} already runs this plan; checked it instead of restarting it:")
            for line in data["checks"]:
                self.say(f"    {line}")
        elif event == "not_adopted":
            self.say(f"{h}: the running server has this plan but fails: {'; '.join(data['problems'])}; redeploying")


def print_result(r: Any) -> None:
    if r.ok and r.adopted:
        say(f"{r.host}: {r.playbook} is up at {r.endpoint}: {r.reason} (`fleet restart` restarts it).")
        return
    if r.ok:
        fixes = f"; fixed on the way: {', '.join(r.new_fixes)}" if r.new_fixes else ""
        say(
            f"{r.host}: {r.playbook} is up at {r.endpoint} after {len(r.attempts)} attempt(s) in "
            f"{r.ready_s:.1f}s{fixes}."
        )
        if r.learned_applied:
            say(f"{r.host}: learned fixes used: {', '.join(r.learned_applied)}")
        return
    last = r.attempts[-1]
    d = last.diagnosis
    say(f"{r.host}: {r.playbook} FAILED after {len(r.attempts)} attempt(s): {r.reason}", err=True)
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
        "ok": r.ok,
        "reason": r.reason,
        "endpoint": r.endpoint,
        "ready_s": round(r.ready_s, 3),
        "adopted": r.adopted,
        "round_trips": r.round_trips,
        "learned_applied": list(r.learned_applied),
        "new_fixes": r.new_fixes,
        "argv": r.plan.argv(),
        "attempts": [
            {
                "n": a.number,
                "outcome": a.outcome,
                "fix": a.fix,
                "log": a.log,
                "seconds": round(a.seconds, 3),
                "diagnosis": a.diagnosis.to_json() if a.diagnosis else None,
            }
            for a in r.attempts
        ],
    }
