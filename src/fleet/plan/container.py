"""A deployment in a container: the `docker|podman run` fleet runs, each option with its reason. Pure.

The engine's command line is the plan's (planned with the image's engine version); this module wraps it:
the container is named after the deployment and labelled as fleet's, runs on the host's network (the
engine binds the planned port) with the host's IPC namespace (or shm_size), sees only the deployment's
GPUs, the model read-only at a fixed path and fleet's log directory at its own path, so the engine's log
is a file on the host as for a process. Secrets are not options: the launcher inside reads them from a
0600 file that it deletes (`inspect` shows options and environment, not that file's contents).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleet.inventory.mounts import HF_CACHE_MOUNT, MODEL_MOUNT, SECRETS_MOUNT
from fleet.inventory.runtime import Container

if TYPE_CHECKING:
    from fleet.plan.types import LaunchPlan

# GPUs as the host's runtime wants them (`gpu_access`, found by the probe):
#   toolkit: docker with the NVIDIA Container Toolkit (--gpus '"device=0,1"');
#   cdi: a CDI spec for nvidia.com/gpu (podman, recent docker);
#   devices: the device files themselves (--device), on a testbed host whose GPUs are simulated.
GPU_ACCESS = ("toolkit", "cdi", "devices")
# Inside a toolkit or CDI container the deployment's GPUs are numbered from 0: the host's indices in
# CUDA_VISIBLE_DEVICES would name GPUs the container does not have.
PLACEMENT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
CONTAINER_PYTHON = "python3"  # the engines' images run their Python as python3


@dataclass(frozen=True)
class RunOption:
    words: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class ContainerPlan:
    cli: str  # docker | podman
    image: str
    name: str
    pull: str
    options: tuple[RunOption, ...]  # what does not depend on the engine's flags; run_args last
    secrets_dir: str  # on the host; mounted at SECRETS_MOUNT
    gpu_access: str
    run_args: tuple[str, ...] = ()
    model_host_path: str = ""  # where the model mounted at /models/NAME is on the host
    image_id: str = ""  # the image as the host has it now (a new pull of the same tag is a new plan)
    log_dir: str = ""  # fleet's own mounts: not for the engine check, which runs before they exist

    def options_for(self, plan: LaunchPlan) -> list[RunOption]:
        """Every `run` option for `plan` (its environment, its hash as a label; a fix changes both)."""
        drop = PLACEMENT_ENV if self.gpu_access in ("toolkit", "cdi") else ()
        out = list(self.options)
        out.insert(3, RunOption(("--label", f"fleet.plan={plan_hash(plan)}"), "which plan it runs (argv, environment)"))
        if not any(e.name == "PYTHONUNBUFFERED" for e in plan.env):
            out.append(RunOption(("-e", "PYTHONUNBUFFERED=1"), "the log shows each line as the engine writes it"))
        out += [RunOption(("-e", f"{e.name}={e.value}"), e.reason) for e in plan.env if e.name not in drop]
        if self.run_args:
            out.append(RunOption(self.run_args, "run_args in the runtime"))
        return out

    def run_argv(self, plan: LaunchPlan, launcher: Sequence[str] = ("<fleet's launcher>",)) -> list[str]:
        """`cli run -d OPTIONS --entrypoint python3 IMAGE <launcher> <the plan's engine argv>`."""
        words = [self.cli, "run", "-d"]
        for option in self.options_for(plan):
            words += option.words
        return [*words, "--entrypoint", CONTAINER_PYTHON, self.image, *launcher, *plan.argv()]

    def check_options(self, plan: LaunchPlan) -> list[str]:
        """What the engine's argument check needs of the launch's options: mounts, environment, the
        operator's run_args; not the name, labels or GPUs (the check starts no server)."""
        fleets = {f"{self.log_dir}:{self.log_dir}", f"{self.secrets_dir}:{SECRETS_MOUNT}"}
        out: list[str] = []
        for option in self.options_for(plan):
            if option.words == self.run_args or (option.words[0] in ("-v", "-e") and option.words[1] not in fleets):
                out += option.words
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "cli": self.cli,
            "image": self.image,
            "name": self.name,
            "pull": self.pull,
            "gpu_access": self.gpu_access,
            "secrets_dir": self.secrets_dir,
            "options": [{"words": list(o.words), "reason": o.reason} for o in self.options],
            "run_args": list(self.run_args),
            "model_host_path": self.model_host_path,
            "image_id": self.image_id,
            "log_dir": self.log_dir,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> ContainerPlan:
        """The container a deployment's record says it ran in (what `restart` runs again). The record is a
        file on the host: anything that is not what fleet writes is a ValueError."""
        options, run_args = d.get("options"), d.get("run_args") or []
        if d.get("cli") not in ("docker", "podman") or not isinstance(options, list) or not isinstance(run_args, list):
            raise ValueError("the recorded container is not one fleet started")
        parsed = []
        for o in options:
            if not isinstance(o, dict) or not isinstance(o.get("words"), list) or not o["words"]:
                raise ValueError("a recorded container option is damaged")
            parsed.append(RunOption(tuple(str(w) for w in o["words"]), str(o.get("reason", ""))))
        return cls(
            cli=str(d["cli"]),
            image=str(d["image"]),
            name=str(d["name"]),
            pull=str(d.get("pull", "missing")),
            options=tuple(parsed),
            secrets_dir=str(d["secrets_dir"]),
            gpu_access=str(d["gpu_access"]),
            run_args=tuple(str(a) for a in run_args),
            model_host_path=str(d.get("model_host_path", "")),
            image_id=str(d.get("image_id", "")),
            log_dir=str(d.get("log_dir", "")),
        )


def container_name(deployment: str) -> str:
    return f"fleet-{deployment}"


def model_mount_path(model_host_path: str) -> str:
    """Where the model is inside the container: /models/<its directory's name>."""
    return posixpath.join(MODEL_MOUNT, posixpath.basename(model_host_path.rstrip("/")) or "model")


def plan_hash(plan: LaunchPlan) -> str:
    text = json.dumps({"argv": plan.argv(), "env": [(e.name, e.value) for e in plan.env]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gpu_options(access: str, indices: Sequence[int] | None, device_files: Sequence[str]) -> list[RunOption]:
    """The deployment's GPUs (`indices`; None: all of the host's) as `access` maps them in."""
    if access == "toolkit":
        value = "all" if indices is None else '"device={}"'.format(",".join(map(str, indices)))
        return [RunOption(("--gpus", value), "the NVIDIA Container Toolkit maps the deployment's GPUs")]
    if access == "cdi":
        names = ["all"] if indices is None else [str(i) for i in indices]
        return [RunOption(("--device", f"nvidia.com/gpu={n}"), "CDI maps the deployment's GPU") for n in names]
    chosen = []
    for path in device_files:
        base = posixpath.basename(path)
        gpu = base[6:]
        if indices is None or not gpu.isdigit() or int(gpu) in indices:
            chosen.append(RunOption(("--device", f"{path}:/dev/{base}"), "the deployment's GPU device file"))
    return chosen


def container_plan(
    spec: Container,
    *,
    deployment: str,
    playbook: str,
    model_host_path: str,
    gpu_access: str,
    gpu_indices: Sequence[int] | None,
    device_files: Sequence[str],
    log_dir: str,
    secrets_dir: str,
    hf_cache: str | None,
    fleet_version: str,
    owner: str,
    image_id: str = "",
) -> ContainerPlan:
    """The `run` for a deployment in `spec`'s image (the plan's part: ContainerPlan.options_for).
    `log_dir`, `secrets_dir` and `hf_cache` are host paths, already expanded (the probe reports them);
    `gpu_access` one of GPU_ACCESS."""
    o: list[RunOption] = [
        RunOption(("--name", container_name(deployment)), "one container per deployment, named after it"),
        RunOption(("--label", f"fleet.deployment={deployment}"), "marks the container as fleet's deployment"),
        RunOption(("--label", f"fleet.playbook={playbook}"), "the playbook it runs"),
        RunOption(("--label", f"fleet.version={fleet_version}"), "the fleet that started it"),
        RunOption(("--label", f"fleet.owner={owner}"), "whose fleet (user and state directory): no other's is touched"),
        RunOption(("--network", "host"), "the engine binds the planned port on the host, as a process would"),
    ]
    if spec.shm_size:
        o.append(RunOption(("--shm-size", spec.shm_size), "shm_size in the runtime: NCCL's shared memory"))
    else:
        o.append(RunOption(("--ipc", "host"), "NCCL and the engine's workers share memory through /dev/shm"))
    o += gpu_options(gpu_access, gpu_indices, device_files)
    o.append(RunOption(("-v", f"{model_host_path}:{model_mount_path(model_host_path)}:ro"), "the model, read-only"))
    if hf_cache:  # its hub/ only: the cache directory also keeps the user's token
        o.append(
            RunOption(("-v", f"{hf_cache}:{HF_CACHE_MOUNT}/hub:ro"), "the host's Hugging Face downloads, read-only")
        )
    o.append(RunOption(("-v", f"{log_dir}:{log_dir}"), "the engine's log is a file in fleet's log directory"))
    o.append(RunOption(("-v", f"{secrets_dir}:{SECRETS_MOUNT}"), "the launcher reads the secrets, then deletes them"))
    for mount in spec.mounts:
        o.append(RunOption(("-v", mount), "mounts in the runtime"))
    return ContainerPlan(
        spec.container,
        spec.image,
        container_name(deployment),
        spec.pull,
        tuple(o),
        secrets_dir,
        gpu_access,
        tuple(spec.run_args),
        model_host_path,
        image_id,
        log_dir,
    )
