"""How a host runs an engine: `runtime: process` (a Python environment on the host, the default) or
`runtime: {container: docker|podman, image: ...}`, in the inventory (per host or group) or the playbook."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from msgspec import Meta, field

from fleet.inventory.strict import _check_no_shell_meta, _check_remote_path, _Strict

# An image reference: [registry[:port]/]path[:tag][@digest], as docker and podman spell it.
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]{0,254}(@sha256:[0-9a-f]{64})?\Z")
SIZE_RE = re.compile(r"^[1-9][0-9]{0,9}[bkmg]?\Z")

# Where fleet mounts what it owns inside the container (read-only model, the engine's secrets file).
MODEL_MOUNT = "/models"
SECRETS_MOUNT = "/run/fleet-secrets"
HF_CACHE_MOUNT = "/root/.cache/huggingface"

# `run` options fleet writes itself: a copy in run_args would win and run something fleet did not check,
# place, free or record. Value: what to use instead.
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
}
VOLUME_OPTIONS = ("-v", "--volume", "--mount")


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
            try:
                _check_remote_path(path)
            except ValueError as exc:
                raise ValueError(f"item {item!r}: {exc}") from None
        _check_not_fleets_mount(parts[1])


def _check_not_fleets_mount(target: str) -> None:
    for owned in (MODEL_MOUNT, SECRETS_MOUNT, HF_CACHE_MOUNT):
        if target.rstrip("/") == owned or target.startswith(owned + "/"):
            raise ValueError(f"mounts over {owned}, where fleet mounts its own (model:, secrets, the HF cache)")


def _check_run_args(value: list[str]) -> None:
    for arg in value:
        _check_no_shell_meta(arg)
    for i, arg in enumerate(value):
        name, has_value, inline = arg.partition("=")
        if name in FLEET_OWNED_RUN_OPTIONS:
            raise ValueError(f"sets {name}, which fleet sets itself: {FLEET_OWNED_RUN_OPTIONS[name]}")
        following = inline if has_value else (value[i + 1] if i + 1 < len(value) else "")
        if name in ("-l", "--label") and following.startswith("fleet."):
            raise ValueError(f"sets the label {following.split('=')[0]}; fleet.* labels are fleet's own")
        if name == "--device" and "nvidia" in following:
            raise ValueError("maps an NVIDIA device; fleet maps the deployment's GPUs itself (gpus:)")
        if name in VOLUME_OPTIONS:
            target = following.split(":")[1] if ":" in following else following
            if name == "--mount":
                target = next(
                    (p.split("=", 1)[1] for p in following.split(",") if p.startswith(("dst=", "target="))), ""
                )
            if target:
                _check_not_fleets_mount(target)


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
