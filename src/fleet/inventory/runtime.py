"""How a host runs an engine: `runtime: process` (a Python environment on the host, the default) or
`runtime: {container: docker|podman, image: ...}`, in the inventory (per host or group) or the playbook."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from msgspec import Meta, field

from fleet.inventory.mounts import check_mount, check_mount_option, check_target, check_volume
from fleet.inventory.strict import _check_no_shell_meta, _check_remote_path, _Strict

# An image reference: [registry[:port]/]path[:tag][@digest], as docker and podman spell it.
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]{0,254}(@sha256:[0-9a-f]{64})?\Z")
SIZE_RE = re.compile(r"^[1-9][0-9]{0,9}[bkmg]?\Z")

# `run` options fleet writes itself, or that would undo what it checked (the GPUs it placed, the image
# and pull policy it read, the process tree it watches): a copy in run_args would win. Value: why.
FLEET_OWNED_RUN_OPTIONS = {
    "--name": "fleet names the container fleet-<deployment>",
    "--gpus": "place the deployment with gpus:",
    "--network": "fleet runs engines on the host's network (the planned port)",
    "--net": "fleet runs engines on the host's network (the planned port)",
    "--ipc": "use shm_size: instead",
    "--shm-size": "use shm_size: instead",
    "--entrypoint": "fleet starts the engine through its launcher",
    "-d": "fleet runs the container detached",
    "--detach": "fleet runs the container detached",
    "--rm": "fleet removes its containers itself, after reading how they ended",
    "--restart": "fleet restarts a crashed server itself, with the fix for its crash",
    "--env-file": "use env: and secret_env: in the playbook",
    "-i": "fleet's containers take no input",
    "--interactive": "fleet's containers take no input",
    "-t": "fleet's containers have no terminal",
    "--tty": "fleet's containers have no terminal",
    "--privileged": "it gives the container every GPU of the host, not the deployment's",
    "--device-cgroup-rule": "it lets the container open GPUs that are not the deployment's",
    "--label-file": "labels go one by one (--label=KEY=VALUE); fleet.* labels are fleet's",
    "--replace": "fleet replaces its own container, and only its own",
    "--pull": "use pull: in the runtime",
    "--cgroup-parent": "fleet finds a container's processes by their cgroup",
}
# What else run_args may set: options that shape the container within what the deployment has (its GPUs,
# its port on the host's network, its mounts), never what it can reach beyond them. Anything not listed
# (--pid, --cap-add, --security-opt, --runtime, --userns, --device, --sysctl, -p ...) is refused by name:
# a list of known-bad spellings is always one spelling short.
ALLOWED_RUN_OPTIONS = frozenset(
    {
        "-e", "--env", "-v", "--volume", "--mount", "-l", "--label",
        "-u", "--user", "-w", "--workdir", "-m", "--memory", "--memory-swap", "--memory-reservation",
        "-c", "--cpu-shares", "--cpus", "--cpuset-cpus", "--cpuset-mems", "--pids-limit", "--ulimit",
        "--init", "--read-only", "--tmpfs", "--no-healthcheck",
        "--stop-timeout", "--stop-signal", "--hostname", "--add-host", "--tz", "--quiet", "--oom-kill-disable",
    }
)  # fmt: skip
# Environment a container must not set itself: the GPU placement fleet made (the runtime's NVIDIA_* hooks,
# *_VISIBLE_DEVICES), and what changes which program or library runs (set it in the playbook's env:).
PLACEMENT_ENV = re.compile(r"^(?:NVIDIA_\w+|\w*_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL)$")
SHORT_WITH_VALUE = ("-v", "-e", "-l", "-u", "-w", "-m", "-c", "-p")  # docker/podman's short options taking one
# Long options that take no value; any other long option is written --option=VALUE, as one word, so that a
# value is never taken from the words fleet adds after run_args.
LONG_WITHOUT_VALUE = ("--init", "--read-only", "--oom-kill-disable", "--no-healthcheck", "--quiet")


def _check_image(value: str) -> None:
    if not IMAGE_RE.match(value):
        raise ValueError("must be an image reference such as lmsysorg/sglang:v0.5.11-cu129 (lower case, no spaces)")


def _check_size(value: str) -> None:
    if not SIZE_RE.match(value):
        raise ValueError("must be a size such as 32g, 512m or 1073741824")


def _check_mounts(value: list[str]) -> None:
    for item in value:
        parts = item.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise ValueError(f"item {item!r} must be HOST_PATH:CONTAINER_PATH or HOST_PATH:CONTAINER_PATH:ro")
        for path in parts[:2]:
            if not path.startswith("/"):
                raise ValueError(f"item {item!r}: paths must be absolute (~ is not expanded in a mount)")
            try:
                _check_remote_path(path)
            except ValueError as exc:
                raise ValueError(f"item {item!r}: {exc}") from None
        check_mount(parts[0], parts[1], len(parts) == 3 and parts[2] == "ro")


def _run_arg_pairs(value: list[str]) -> list[tuple[str, str]]:
    """run_args as (option, value) pairs, read as docker's and podman's parser reads them. What that parser
    would read otherwise than fleet checks it (a bare word becomes the image, -dit is three options, a long
    option's value taken from the next word) is refused."""
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(value):
        word = value[i]
        if word.startswith("--"):
            name, has_value, inline = word.partition("=")
            if not has_value and name not in LONG_WITHOUT_VALUE and name not in FLEET_OWNED_RUN_OPTIONS:
                raise ValueError(f"gives {name} without =VALUE; write {name}=VALUE as one word")
            pairs.append((name, inline))
            i += 1
        elif word.startswith("-") and len(word) >= 2:
            name = word[:2]
            if name in SHORT_WITH_VALUE and len(word) > 2:
                pairs.append((name, word[2:]))
                i += 1
            elif name in SHORT_WITH_VALUE:
                if i + 1 >= len(value):
                    raise ValueError(f"ends with {name}, which needs a value")
                pairs.append((name, value[i + 1]))
                i += 2
            elif len(word) > 2:
                raise ValueError(f"combines short options ({word}); give each on its own")
            else:
                pairs.append((name, ""))
                i += 1
        else:
            raise ValueError(f"has {word!r}, which is not an option or its value (it would be taken as the image)")
    return pairs


def _check_run_args(value: list[str]) -> None:
    for arg in value:
        _check_no_shell_meta(arg)
    for name, following in _run_arg_pairs(value):
        if name in FLEET_OWNED_RUN_OPTIONS:
            raise ValueError(f"sets {name}, which fleet does not take from run_args: {FLEET_OWNED_RUN_OPTIONS[name]}")
        if name == "--device" and ("nvidia" in following or following.startswith("/dev/char")):
            raise ValueError("maps an NVIDIA device; fleet maps the deployment's GPUs itself (gpus:)")
        if name not in ALLOWED_RUN_OPTIONS:
            raise ValueError(
                f"sets {name}, which run_args may not: it changes what the container may reach beyond the "
                f"deployment's GPUs, port and mounts (run_args may set {', '.join(sorted(ALLOWED_RUN_OPTIONS))})"
            )
        if name in ("-e", "--env"):
            _check_run_env(following)
        if name in ("-l", "--label") and following.startswith("fleet."):
            raise ValueError(f"sets the label {following.split('=')[0]}; fleet.* labels are fleet's own")
        if name in ("-v", "--volume"):
            check_volume(following)
        if name == "--mount":
            check_mount_option(following)
        if name == "--tmpfs":
            check_target(following.split(":")[0])


def _check_run_env(assignment: str) -> None:
    from fleet.inventory.playbooks import changes_what_runs  # the playbook's own rule for env:

    name = assignment.split("=", 1)[0]
    if PLACEMENT_ENV.match(name):
        raise ValueError(f"sets {name}; fleet sets the GPUs a deployment sees itself (gpus:)")
    if changes_what_runs(name):
        raise ValueError(
            f"sets {name}, which changes what program or library runs; set it in the playbook's env: "
            "with allow_runtime_env"
        )


class Container(_Strict, frozen=True, kw_only=True):
    """An engine run from an image: what the operator chooses; fleet writes the rest of `run`."""

    container: Literal["docker", "podman"]
    image: str
    pull: Literal["never", "missing", "always"] = "missing"
    shm_size: str | None = None  # left out: --ipc host (both engines' documented default)
    mounts: list[str] = field(default_factory=list)  # HOST:CONTAINER[:ro], beside fleet's own
    run_args: Annotated[list[str], Meta(max_length=64)] = field(default_factory=list)

    checks = {"image": _check_image, "shm_size": _check_size, "mounts": _check_mounts, "run_args": _check_run_args}


Runtime = Literal["process"] | Container


def chosen_runtime(playbook_runtime: Runtime | None, host_runtime: Runtime | None) -> Container | None:
    """The container a deployment runs in, or None for a process: the playbook's choice wins (it names the
    image, and the engine version with it), then the host's (inventory, per host or group)."""
    runtime = playbook_runtime if playbook_runtime is not None else host_runtime
    return runtime if isinstance(runtime, Container) else None
