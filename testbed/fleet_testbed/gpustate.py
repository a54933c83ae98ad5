"""The simulated host's GPU state: static data from `host.json`, live usage from running engines.

Read by the stand-in `pynvml`, the stand-in `nvidia-smi` and the engine simulator, so all three agree.
A running simulated engine process registers what it holds in `run/gpu/<pid namespace>-<pid>.json`; entries of dead
processes are ignored (and pruned), like NVML forgetting a process that exited.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def host_dir() -> Path:
    value = os.environ.get("SIM_HOST_DIR")
    if not value:
        raise RuntimeError("SIM_HOST_DIR is not set: not running on a simulated host")
    return Path(value)


def load_host(root: Path | None = None) -> dict[str, Any]:
    root = root or host_dir()
    data: dict[str, Any] = json.loads((root / "host.json").read_text())
    return data


def sglang_version(host: dict[str, Any] | None = None) -> str:
    """The stand-in SGLang's version: its installed metadata (a host's environment, or an image's), else
    host.json's. Read as importlib.metadata finds it (the first `sglang-*.dist-info` on sys.path), without
    importing it: ~30 ms of every simulated engine's start."""
    for entry in sys.path:
        for meta in sorted(Path(entry or ".").glob("sglang-*.dist-info/METADATA")):
            for line in meta.read_text().splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return str((host or load_host())["sglang_version"])


def _alive(pid: int) -> bool:
    """A live process (a zombie holds no GPU memory, as NVML would say)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pid_namespace(pid: int | str = "self") -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


# Inside an engine's container (the testbed's images set this) the host's processes are not visible: their
# entries are not ours to prune, as NVML in a container still counts other processes' memory. (Not
# /.dockerenv: the machine running the testbed may itself be a container.)
IN_CONTAINER = os.environ.get("SIM_IN_CONTAINER") == "1"


def _host_pid(namespace: int, inner: int) -> int | None:
    """The pid, as seen here, of process `inner` of pid namespace `namespace` (a container's engine), as
    NVML reports a container's processes by their host pids; None when no such process is visible."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if _pid_namespace(name) != namespace:
                continue
            with open(f"/proc/{name}/status") as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
        except OSError:
            continue
        if nspid and int(nspid[-1]) == inner:
            return int(name)
    return None


def usage(root: Path | None = None) -> list[dict[str, int]]:
    """[{pid, gpu, used_mib}] for live processes, pids as seen from here."""
    root = root or host_dir()
    out: list[dict[str, int]] = []
    run = root / "run" / "gpu"
    if not run.is_dir():
        return out
    here = _pid_namespace()
    for entry in run.glob("*.json"):
        try:
            rec = json.loads(entry.read_text())
        except (OSError, ValueError):
            continue
        namespace = rec.pop("pidns", here)
        if namespace != here:
            pid = _host_pid(namespace, int(rec["pid"]))
            if pid is None and IN_CONTAINER:  # the host's (or another container's): not ours to judge
                out.append(rec)
                continue
            rec["pid"] = pid if pid is not None else -1
        if _alive(int(rec["pid"])) or _still_releasing(entry, rec, root):
            out.append(rec)
        else:
            entry.unlink(missing_ok=True)
    return out


def _taken(gpu: int, who: dict[str, Any], root: Path) -> None:
    """Test hook (host.json's `taken_when_freed`): a job waiting for a GPU takes `used_mib` of it the moment
    a process there exits -- `who["pid"]`, a process of the host's, or without a pid, one process started
    at the first such exit, in a session of its own, its pid in run/taken.pid."""
    pid = who.get("pid")
    if pid is None:
        taken = root / "run" / "taken.pid"
        pid = int(taken.read_text()) if taken.exists() else None
        if pid is None or not _alive(pid):
            quiet = subprocess.DEVNULL
            pid = subprocess.Popen(
                ["sleep", "600"], start_new_session=True, stdin=quiet, stdout=quiet, stderr=quiet
            ).pid
            taken.write_text(str(pid))
    register(gpu, int(who["used_mib"]), root, int(pid))


def _still_releasing(entry: Path, rec: dict[str, Any], root: Path) -> bool:
    """A real GPU frees an exited process's memory a moment later; host.json's `memory_release_s` sets
    how long here (0 by default: at once)."""
    host = load_host(root)
    release_s = float(host.get("memory_release_s", 0))
    if release_s <= 0:
        return False
    if "dead_since" not in rec:
        rec["dead_since"] = time.time()
        entry.write_text(json.dumps(rec))
        if host.get("taken_when_freed"):
            _taken(rec["gpu"], host["taken_when_freed"], root)
    return bool(time.time() - rec["dead_since"] < release_s)


def register(gpu: int, used_mib: int, root: Path | None = None, pid: int | None = None) -> None:
    """Record that process `pid` (this one by default; in this pid namespace) holds `used_mib` on `gpu`."""
    root = root or host_dir()
    pid = os.getpid() if pid is None else pid
    run = root / "run" / "gpu"
    run.mkdir(parents=True, exist_ok=True)
    namespace = _pid_namespace()  # a container's pids are its own: the namespace says whose
    name = f"{namespace}-{pid}"
    tmp = run / f".{name}.tmp"
    tmp.write_text(json.dumps({"pid": pid, "pidns": namespace, "gpu": gpu, "used_mib": used_mib}))
    tmp.replace(run / f"{name}.json")


def gpu_table(root: Path | None = None) -> list[dict[str, Any]]:
    """Per GPU: static facts plus used memory and processes right now."""
    host = load_host(root)
    live = usage(root)
    table = []
    for i, g in enumerate(host["gpus"]):
        procs = [{"pid": u["pid"], "used_mib": u["used_mib"]} for u in live if u["gpu"] == i]
        for f in g.get("foreign_processes", []):
            if _alive(int(f["pid"])):
                procs.append({"pid": int(f["pid"]), "used_mib": int(f["used_mib"])})
        used = g.get("baseline_used_mib", 0) + sum(p["used_mib"] for p in procs)
        table.append({**g, "index": i, "memory_used_mib": min(used, g["memory_total_mib"]), "processes": procs})
    return table


def visible_gpus(env: dict[str, str] | None = None, root: Path | None = None) -> list[dict[str, Any]]:
    """The GPUs a CUDA program sees, in its own order (its device 0 first): `CUDA_VISIBLE_DEVICES` as the
    CUDA runtime reads it -- indices or UUIDs, up to the first entry that names no GPU; empty means none.
    NVML and nvidia-smi ignore the variable (they always list every GPU); each entry keeps its physical
    `index`, which is what the process registers and which device file it holds."""
    table = gpu_table(root)
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return table
    out: list[dict[str, Any]] = []
    for item in (x.strip() for x in value.split(",")):
        match = next(
            (g for g in table if (item.isdigit() and int(item) == g["index"]) or (item and g["uuid"].startswith(item))),
            None,
        )
        if match is None or match in out:
            break
        out.append(match)
    return out
