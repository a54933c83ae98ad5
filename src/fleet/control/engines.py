"""`fleet engine install/use`: fleet's own engine environments on a host, one per version (the host side is
control/remote_engine.py). The inventory's `engines: {sglang: fleet}` then runs the current one, and
`fleet==0.5.23` a version of its own."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.errors import ConfigError, DeployFailed, HostStepError, PreflightError
from fleet.hostscripts import json_lines, script_for
from fleet.inventory.hosts import VERSION_RE, canonical_version

if TYPE_CHECKING:
    from fleet.inventory import Host
    from fleet.transport import Transport

SPEC_RE = re.compile(rf"^(?P<engine>sglang|vllm)=={VERSION_RE}\Z")


def parse_spec(spec: str) -> tuple[str, str]:
    """`sglang==0.5.23` → ("sglang", "0.5.23"): a pinned version, so what gets installed is what was asked,
    in its one canonical spelling (0.5.23.0 is 0.5.23: one environment, not two)."""
    m = SPEC_RE.match(spec)
    if not m:
        raise ConfigError(
            f'"{spec}" is not an engine and an exact released version.',
            "Write it as sglang==0.5.23 or vllm==0.11.0 (a pinned version, no +build: an upgrade must be undoable).",
        )
    return m["engine"], canonical_version(m)


def engine_step(
    t: Transport,
    host: Host,
    action: str,
    spec: str,
    *,
    python: str | None = None,
    pip_args: tuple[str, ...] = (),
    on_line: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Run `install` or `use` on the host; the answer's event (installed, present, current) or an error."""
    engine, version = parse_spec(spec)
    args = {
        "action": action,
        "engine": engine,
        "version": version,
        "state_dir": host.settings.state_dir,
        "python": python,
        "pip_args": list(pip_args),
    }
    answers: list[dict[str, Any]] = []

    def on_event(ev: dict[str, Any]) -> None:
        if ev.get("e") == "line":
            on_line(str(ev["t"]))
        else:
            answers.append(ev)

    code = t.stream(script_for("engine", args, ["python3"]), json_lines(on_event), timeout_s=4 * 3600.0)
    last = answers[-1] if answers else {"e": "error", "error": f"no answer (exit {code})"}
    if last["e"] == "error":
        raise HostStepError(f"{host.name}: fleet's engine step failed on the host ({last['error']}).", "")
    if last["e"] == "refused":
        error = DeployFailed if action == "install" else PreflightError
        raise error(f"{host.name}: {spec}: {last['why']}", "Nothing that was in use was changed.")
    return last
