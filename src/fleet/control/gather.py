"""Gather a host's facts in one round trip."""

from __future__ import annotations

from fleet.control.host_steps import HostSteps, steps_of
from fleet.facts import HostFacts
from fleet.inventory import Host
from fleet.inventory.runtime import Container
from fleet.protocol import ProbeRequest
from fleet.transport import Transport


def model_path(host: Host, model: str) -> str:
    """A playbook's model, as a path on the host (relative paths live under the host's models_dir)."""
    if model.startswith(("/", "~/")):
        return model
    return f"{host.settings.models_dir.rstrip('/')}/{model}"


def read_facts(
    transport: Transport | HostSteps,
    host: Host,
    *,
    model: str | None = None,
    engine: str | None = None,
    runtime: Container | None = None,
    reach: tuple[str, int] | None = None,
) -> HostFacts:
    """`runtime`: the container a deployment runs in (its image's engine version replaces the host's);
    `reach`: an address and port this host must reach (a group's rank 0), tried in the same round trip."""
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
    return steps_of(transport).facts(args, pythons)
