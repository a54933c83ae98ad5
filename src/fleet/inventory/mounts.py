"""What a container may mount from its host: data, and programs read-only; never the host's own state,
sockets, devices, credentials, or the places fleet mounts its own. The same rule for the runtime's
`mounts:` and for `-v`/`--mount` in `run_args`, read as docker and podman read them (a `--mount` is CSV
with case-insensitive keys, whose type defaults to a volume)."""

from __future__ import annotations

import csv
import posixpath

# Where fleet mounts what it owns inside the container (read-only model, the engine's secrets file).
MODEL_MOUNT = "/models"
SECRETS_MOUNT = "/run/fleet-secrets"
HF_CACHE_MOUNT = "/root/.cache/huggingface"

# Never mounted, not even read-only: the host's kernel and process views, its configuration (/etc holds
# the shadow file), its runtime state and service sockets (the container runtime's own is a way out of any
# container), the container stores.
SYSTEM_SOURCES = ("/proc", "/sys", "/boot", "/etc", "/run", "/var/run", "/var/lib/docker",
                  "/var/lib/containers")  # fmt: skip
# Never mounted whole: the root, the homes, the shared scratch places (other users' sockets live there).
WHOLE_ONLY = ("/", "/home", "/root", "/tmp", "/var/tmp")
# Read-only only: the host's programs and libraries, and the state under /var (cron's spool, the package
# database). A container writing there runs code on the host. So are the add-on trees mounted whole (/opt,
# /var); a directory of data inside one (/opt/models) is the operator's.
PROGRAM_SOURCES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/var/spool", "/var/lib")
PROGRAM_TREES = ("/opt", "/var", "/usr/local")
# Where tools keep credentials, anywhere in a path; a home's other dot-directories hold what its user runs
# (a Python install, shell start-up) and are mounted read-only only.
CREDENTIAL_DIRS = (".ssh", ".gnupg", ".aws", ".azure", ".docker", ".kube", ".netrc", ".git-credentials", ".config",
                   ".password-store", ".pypirc", ".huggingface", ".vault-token")  # fmt: skip
# -v options that change nothing on the host: access and mount flags, never relabelling (z, Z), chown (U)
# or an overlay (O).
VOLUME_OPTIONS = ("ro", "rw", "nosuid", "nodev", "noexec")
MOUNT_KEYS = ("type", "source", "src", "destination", "dst", "target", "readonly", "ro", "tmpfs-size",
              "tmpfs-mode", "consistency")  # fmt: skip


def normal(path: str) -> str:
    """An absolute path as the kernel resolves its spelling (normpath keeps a leading //)."""
    return "/" + posixpath.normpath(path).lstrip("/") if path.startswith("/") else path


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _home_dot_dir(path: str) -> bool:
    parts = path.split("/")
    if path.startswith("/root/"):
        return len(parts) > 2 and parts[2].startswith(".")
    return path.startswith("/home/") and len(parts) > 3 and parts[3].startswith(".")


def check_mount(source: str, target: str, read_only: bool) -> None:
    """Raise ValueError saying why `source` may not be mounted at `target` (as `read_only` says)."""
    if not source.startswith("/"):
        raise ValueError(
            f"mounts {source or 'nothing'!r}: a mount's source must be an absolute host path (named volumes "
            "and relative paths are not taken; a volume's options can bind any host path)"
        )
    path = normal(source)
    if _under(path, ("/dev",)):
        raise ValueError("mounts device files; fleet maps the deployment's GPUs itself (gpus:)")
    whole_home = path.startswith("/home/") and path.count("/") == 2
    if path in WHOLE_ONLY or whole_home or _under(path, SYSTEM_SOURCES):
        raise ValueError(f"mounts {source}, which is the host's own (the system, its sockets); mount data only")
    if any(part in CREDENTIAL_DIRS for part in path.split("/")):
        raise ValueError(f"mounts {source}, where credentials are kept; mount data only")
    if path.endswith(".sock"):
        raise ValueError(f"mounts the socket {source}: a service's socket reaches beyond the container")
    if not read_only and (_under(path, PROGRAM_SOURCES) or path in PROGRAM_TREES or _home_dot_dir(path)):
        raise ValueError(f"mounts {source} writable: it holds what the host runs; mount it read-only (:ro)")
    check_target(target)


def check_target(target: str) -> None:
    target = normal(target)
    for owned in (MODEL_MOUNT, SECRETS_MOUNT, HF_CACHE_MOUNT):
        if target == owned or target.startswith(owned + "/"):
            raise ValueError(f"mounts over {owned}, where fleet mounts its own (model:, secrets, the HF cache)")
    if target == "/dev" or target.startswith("/dev/"):
        raise ValueError("mounts device files; fleet maps the deployment's GPUs itself (gpus:)")


def check_volume(value: str) -> None:
    """`-v SRC:DST[:OPTIONS]`."""
    parts = value.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"mounts {value!r}; write -v HOST_PATH:CONTAINER_PATH[:ro]")
    options = parts[2].split(",") if len(parts) == 3 else []
    if any(o not in VOLUME_OPTIONS for o in options):
        raise ValueError(f"mounts {value!r} with options other than {', '.join(VOLUME_OPTIONS)}")
    check_mount(parts[0], parts[1], "ro" in options)


def check_mount_option(value: str) -> None:
    """`--mount type=bind,source=...,target=...[,readonly]`, parsed as CSV with keys in any case, as docker
    does; a key fleet does not know (volume-opt, bind-propagation) is refused rather than guessed at."""
    fields = next(csv.reader([value]), [])
    keys: dict[str, str] = {}
    for raw in fields:
        key, _, val = raw.partition("=")
        key = key.strip().lower()
        if key not in MOUNT_KEYS:
            raise ValueError(f"mounts with {key!r}; --mount may have {', '.join(MOUNT_KEYS)}")
        if key in keys:
            raise ValueError(f"gives {key!r} twice in one --mount")
        keys[key] = val
    kind = keys.get("type", "volume").lower()
    target = keys.get("destination") or keys.get("dst") or keys.get("target") or ""
    if kind == "tmpfs":
        check_target(target)
        return
    if kind != "bind":
        raise ValueError(f"mounts a {kind}; run_args may mount host paths (type=bind) and tmpfs only")
    flag = keys.get("readonly", keys.get("ro"))
    read_only = flag is not None and flag.lower() in ("", "true", "1")
    check_mount(keys.get("source") or keys.get("src") or "", target, read_only)
