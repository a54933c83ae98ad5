"""Parts of the act step's request: which run asks and for whom, what to check, and which ports a plan's
server opens."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence

from fleet.control.answers import LOCK_GRACE_S
from fleet.inventory import HostSettings
from fleet.inventory.mounts import SECRETS_MOUNT
from fleet.plan import LaunchPlan, weight_cache
from fleet.plan.container import CONTAINER_PYTHON
from fleet.protocol import ActResult, CheckRequest, FreeRequest, LaunchRequest, LockRequest, Premises


def run_id() -> str:
    return uuid.uuid4().hex[:12]


def owner() -> str:
    return (
        f"{os.environ.get('USER') or os.environ.get('LOGNAME') or 'unknown'}@{socket.gethostname()} pid {os.getpid()}"
    )


def check_args(
    plan: LaunchPlan, check_name: str, run_options: Sequence[str] = (), premises: Premises | None = None
) -> CheckRequest:
    """The act step's `check`: the engine's own check of `plan`, in the image when it runs in a container
    (`check_name`: the container's name, never another deployment's; `run_options` before the plan's).
    `premises` (fleet.plan.keyed_premises): also ask what the engine picks without the keyed rules' flags,
    and stop before anything is changed where the plan did not stand on those picks."""
    args: CheckRequest = {
        "engine": plan.engine,
        "python": plan.python,
        "args": plan.engine_args(),
        "env": {e.name: e.value for e in plan.env},
    }
    if premises:
        args["picks"] = premises
    if plan.need_mib is not None and plan.memory_mib:
        args["budget"] = {"need_mib": plan.need_mib, "gpu_mib": plan.memory_mib}
    cont = plan.container
    if cont is not None:  # run in the image, as the server will be
        args["container"] = {
            "cli": cont.cli,
            "image": cont.image,
            "name": check_name,
            "options": [*run_options, *cont.check_options(plan)],
        }
    return args


def planned_ports(plan: LaunchPlan) -> list[int]:
    """The ports a plan's server opens that fleet chose: HTTP, the internal base of a placed one, and the
    port a group's rank 0 meets the other ranks on."""
    internal = plan.flag("--nccl-port")
    base = (
        int(str(internal.value))
        if internal is not None
        else next((int(e.value) for e in plan.env if e.name == "VLLM_PORT"), None)
    )
    ports = [plan.port] if base is None else [plan.port, base]
    rank, meet = plan.flag("--node-rank"), plan.flag("--dist-init-addr")
    if rank is not None and rank.value == "0" and meet is not None and meet.value:
        ports.append(int(meet.value.rpartition(":")[2]))
    return ports


def launch_args(
    plan: LaunchPlan, deployment: str, attempt: int, log_dir: str, restart_cache: str | None = None
) -> LaunchRequest:
    """The act step's `launch`: the plan's command line and environment, in its container when it has one.
    `restart_cache`: why its weight cache daemon is started again whatever it was started with."""
    launch: LaunchRequest = {
        "name": deployment,
        "attempt": attempt,
        "argv": plan.argv(),
        "env": {e.name: e.value for e in plan.env},
        "log_dir": log_dir,
    }
    cache = plan.flag("--weight-cache-mode")
    if cache is not None and cache.value == "client" and cache.rule == weight_cache.RULE:
        launch["weight_cache"] = {
            "argv": weight_cache.daemon_argv(plan),
            "key": weight_cache.daemon_key(plan),
            "ranks": weight_cache.ranks(plan),
        }
        if restart_cache:
            launch["weight_cache"]["restart"] = restart_cache
    cont = plan.container
    if cont is not None:
        launch["container"] = {
            "cli": cont.cli,
            "image": cont.image,
            "name": cont.name,
            "options": [word for option in cont.options_for(plan) for word in option.words],
            "python": CONTAINER_PYTHON,
            "secrets_dir": cont.secrets_dir,
            "secrets_mount": SECRETS_MOUNT,
        }
    return launch


def free_request(
    settings: HostSettings, kill_policy: str, gpus: Sequence[int] | None, drain_s: float, port: int | None
) -> FreeRequest:
    """The act step's `free`: what may be stopped for a deployment on `gpus` (None: all) and `port`."""
    return {
        "port": port,
        "bind_address": settings.bind_address,
        "gpu_devices": settings.gpu_devices,
        "kill_policy": kill_policy,
        "gpus": list(gpus) if gpus is not None else None,
        "drain_s": drain_s,
        "memory_wait_s": 30.0,
        "idle_mib": 1024,
    }


def cache_restart(failed: ActResult, signature: str) -> tuple[str | None, str | None]:
    """After the weight cache daemon refused an engine (`signature`; `failed`: the act answer of that
    attempt): (why the next launch starts the daemon again, or why fleet gives up instead). A daemon kept
    from before may hold another torch or driver than the engine now has; one started for this very engine
    that refuses it would refuse a second engine too."""
    if (failed.get("weight_cache") or {}).get("kept"):
        return f"it refused the last engine's configuration ({signature})", None
    return None, (
        "the weight cache daemon started for this engine refused its configuration (a setting the daemon "
        "checks is missing from what fleet starts it with); deploy without weight_cache: and report it"
    )


def lock_request(
    settings: HostSettings,
    deployment: str,
    gpus: Sequence[int] | None,
    replace: Sequence[str],
    run: tuple[str, str],
    command: str,
    places: bool,
) -> LockRequest:
    """The act step's `lock` for a deployment on `gpus` (None: all) replacing `replace`, taken by the run
    `run` (its id, its owner) doing `command`; `places`: it may launch on those GPUs."""
    return {
        "state_dir": settings.state_dir,
        "deployment": deployment,
        "places": places,
        "gpus": list(gpus) if gpus is not None else None,
        "replace": list(replace),
        "run_id": run[0],
        "owner": run[1],
        "grace_s": LOCK_GRACE_S,
        "command": command,
    }
