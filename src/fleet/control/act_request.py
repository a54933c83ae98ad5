"""Parts of the act step's request: which run asks and for whom, what to check, and which ports a plan's
server opens."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence

from fleet.inventory.mounts import SECRETS_MOUNT
from fleet.plan import LaunchPlan, weight_cache
from fleet.plan.container import CONTAINER_PYTHON
from fleet.protocol import CheckRequest, LaunchRequest, Premises


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


def launch_args(plan: LaunchPlan, deployment: str, attempt: int, log_dir: str) -> LaunchRequest:
    """The act step's `launch`: the plan's command line and environment, in its container when it has one."""
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
