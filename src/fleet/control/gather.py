"""Gather a host's facts in one round trip."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypedDict

from fleet.control.host_steps import HostLink, give_up_ahead, start_act_ahead, steps_of
from fleet.hostscripts import step_python
from fleet.inventory import Host, NamedPlaybook
from fleet.inventory.runtime import Container, chosen_runtime
from fleet.protocol import ProbeRequest

if TYPE_CHECKING:
    from fleet.facts import HostFacts


def model_path(host: Host, model: str) -> str:
    """A playbook's model, as a path on the host (relative paths live under the host's models_dir)."""
    if model.startswith(("/", "~/")):
        return model
    return f"{host.settings.models_dir.rstrip('/')}/{model}"


def probe_request(
    host: Host,
    *,
    model: str | None = None,
    engine: str | None = None,
    runtime: Container | None = None,
    reach: tuple[str, int] | None = None,
) -> tuple[ProbeRequest, list[str]]:
    """What the probe is asked, and the Pythons it may run under (the engine's first)."""
    s = host.settings
    pythons = [s.engines[engine]] if engine and engine in s.engines else []
    pythons += [p for e, p in sorted(s.engines.items()) if e != engine]
    args: ProbeRequest = {
        "gpu_devices": s.gpu_devices,
        "engines": {str(k): v for k, v in s.engines.items()},
        "model_path": model_path(host, model) if model else None,
        "state_dir": s.state_dir,
        "log_dir": s.log_dir,
        "disk_paths": [s.models_dir, s.log_dir, s.state_dir],
    }
    if reach is not None:
        args["reach"] = {"address": reach[0], "port": reach[1], "timeout_s": 3}
    if runtime is not None and engine is not None:
        args["container"] = {
            "cli": runtime.container,
            "image": runtime.image,
            "engine": engine,
            "state_dir": s.state_dir,
            "mounts": list(runtime.mounts),
        }
    return args, pythons


def read_facts(
    transport: HostLink,
    host: Host,
    *,
    model: str | None = None,
    engine: str | None = None,
    runtime: Container | None = None,
    reach: tuple[str, int] | None = None,
) -> HostFacts:
    """`runtime`: the container a deployment runs in (its image's engine version replaces the host's);
    `reach`: an address and port this host must reach (a group's rank 0), tried in the same round trip."""
    asked = probe_request(host, model=model, engine=engine, runtime=runtime, reach=reach)
    ahead = _AHEAD.pop(id(transport), None)  # the entry holds its transport: an id is never reused under it
    if ahead is not None and ahead.asked == asked:
        facts = ahead.result()
        assert facts is not None
        return facts
    if ahead is not None:
        ahead.result(raise_error=False)  # one command at a time on a host, as the round-trip count says
    return steps_of(transport).facts(*asked)


class _Ahead(threading.Thread):
    """A read of a host's facts started before the caller needs them."""

    def __init__(self, transport: HostLink, asked: tuple[ProbeRequest, list[str]]) -> None:
        super().__init__(name=f"facts-{transport.host_name}", daemon=True)  # never keeps a failed run alive
        self.transport, self.asked = transport, asked
        self.facts: HostFacts | None = None
        self.error: BaseException | None = None
        self.switch_s = sys.getswitchinterval()

    def run(self) -> None:
        try:
            self.facts = steps_of(self.transport).facts(*self.asked)
        except BaseException as exc:  # handed to the caller, which raises it as its own read would have
            self.error = exc

    def result(self, raise_error: bool = True) -> HostFacts | None:
        self.join()
        sys.setswitchinterval(self.switch_s)
        if self.error is not None and raise_error:
            raise self.error
        return self.facts


_AHEAD: dict[int, _Ahead] = {}


class PlaybookProbe(TypedDict):
    model: str
    engine: str
    runtime: Container | None


def asked_for(host: Host, playbook: NamedPlaybook) -> PlaybookProbe:
    """What a deploy of `playbook` asks the host's probe about (read_facts' arguments)."""
    spec = playbook.spec
    return {
        "model": model_path(host, spec.model),
        "engine": spec.engine,
        "runtime": chosen_runtime(spec.runtime, host.settings.runtime),
    }


def read_facts_ahead(transport: HostLink, host: Host, playbook: NamedPlaybook) -> None:
    """Start reading the facts a deploy of `playbook` asks for, in a thread: the host's ~0.1 s of probing
    then overlaps the caller's imports of the deploy loop. The `read_facts` that asks the same of
    `transport` takes its answer (or its error); one that asks anything else waits for it first.

    While it runs, threads switch every 0.5 ms instead of 5: the SSH handshake is a dozen packets, each of
    which waited up to a whole switch interval for the importing thread."""
    ahead = _Ahead(transport, probe_request(host, **asked_for(host, playbook)))
    _AHEAD[id(transport)] = ahead
    sys.setswitchinterval(0.0005)
    ahead.start()


@contextmanager
def started_ahead(transport: HostLink, host: Host, playbook: NamedPlaybook) -> Iterator[None]:
    """A deploy's first steps started before the deploy loop is imported: the probe (read_facts_ahead)
    and, for a container deployment, the act step (control.host_steps.start_act_ahead), whose Python is
    then the host's step Python whatever the plan says (fleet.hostscripts.deployment_python); a process's
    act runs under the plan's engine environment, known only once the deploy has planned. An act never
    asked (a refusal, a server kept as it runs) ends having done nothing."""
    read_facts_ahead(transport, host, playbook)
    if chosen_runtime(playbook.spec.runtime, host.settings.runtime) is not None:  # a container deployment
        start_act_ahead(transport, step_python(host))
    try:
        yield
    finally:
        give_up_ahead(transport)
