"""Lay out simulated GPU hosts and serve each with a real OpenSSH sshd on its own loopback address.

A simulated host is a directory: `host.json` (GPUs, driver, SGLang version), device files standing in
for /dev/nvidia*, an engine Python environment whose `sglang` and `pynvml` are the stand-ins, a
`nvidia-smi`, and real-shaped model directories. Its sshd runs in a PID namespace of its own
(`unshare --pid --mount-proc`, when root) so `ps`, `pgrep`, `fuser` and `kill` on that host see only
that host's processes, as on separate machines, and /proc/loadavg is the host's own (`set_load`).
Teardown is by pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTBED = Path(__file__).resolve().parent
MODELS = TESTBED / "models"

RTX_PRO_6000 = {
    "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "compute_capability": "12.0",
    "memory_total_mib": 97887,
}
RTX_A6000 = {"name": "NVIDIA RTX A6000", "compute_capability": "8.6", "memory_total_mib": 49140}


@dataclass(frozen=True)
class HostSpec:
    name: str
    address: str
    gpu: dict[str, Any]
    gpu_count: int
    sglang_version: str
    interconnect: str = "pcie"
    driver_version: str = "580.95.05"
    cuda_version: str = "13.0"


BLACKWELL = HostSpec("blackwell", "127.0.0.2", RTX_PRO_6000, 8, "0.5.11")
CT129 = HostSpec("ct129", "127.0.0.3", RTX_A6000, 2, "0.5.11")


def extra_host(i: int) -> HostSpec:
    """Scale-test hosts: 127.0.1.i, 2x A6000 each."""
    return HostSpec(f"sim{i:03d}", f"127.0.1.{i}", RTX_A6000, 2, "0.5.11")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def build_host(root: Path, spec: HostSpec, python: str = sys.executable) -> Path:
    """Create (or refresh) the directory of one simulated host; returns it."""
    hdir = root / spec.name
    gpus = [
        {
            **spec.gpu,
            "uuid": f"GPU-{abs(hash((spec.name, i))) % 10**8:08d}-sim0-0000-0000-{i:012d}",
            "temperature_c": 34 + i,
            "ecc_uncorrected": 0,
            "throttle_reasons": 0,
            "retired_pages_pending": False,
            "row_remap_pending": False,
            "row_remap_failure": False,
            # What an idle real H200 (driver 580) reported used through NVML while nvidia-smi said 0 MiB:
            # memory the driver reserves (docs/real-gpu.md). Only the stand-in pynvml adds it.
            "driver_reserved_mib": 615,
            # a workstation board's layout: two GPUs behind each PCIe switch, half the GPUs per CPU socket
            "pcie_switch": i // 2,
            "numa_node": i // max(1, spec.gpu_count // 2),
        }
        for i in range(spec.gpu_count)
    ]
    host = {
        "name": spec.name,
        "gpus": gpus,
        "interconnect": spec.interconnect,
        "driver_version": spec.driver_version,
        "cuda_version": spec.cuda_version,
        "sglang_version": spec.sglang_version,
        "startup_scale": float(os.environ.get("SIM_SPEED", "1.0")),
    }
    _write(hdir / "host.json", json.dumps(host, indent=1))
    for i in range(spec.gpu_count):
        _write(hdir / "dev" / f"nvidia{i}", "")
    _write(hdir / "dev" / "nvidiactl", "")
    _write(hdir / "dev" / "nvidia-uvm", "")
    _write(hdir / "dev" / ".fleet-simulated-gpus", "these nvidia* files stand for GPUs (fleet's testbed)\n")
    env = f'export SIM_HOST_DIR="{hdir}" PYTHONPATH="{hdir}/env/site:{TESTBED.parent}"\n'
    _write(hdir / "env" / "bin" / "python", f'#!/bin/sh\n{env}exec "{python}" "$@"\n', 0o755)
    console = (  # like pip's console script: `/path/python /path/bin/sglang serve ...` in ps
        f"#!{python}\nimport os, sys\n"
        f"os.environ['SIM_HOST_DIR'] = {str(hdir)!r}\n"
        f"os.environ['PYTHONPATH'] = {f'{hdir}/env/site:{TESTBED.parent}'!r}\n"
        f"sys.path[:0] = os.environ['PYTHONPATH'].split(':')\n"
        "from sglang.cli.main import main\nmain()\n"
    )
    _write(hdir / "env" / "bin" / "sglang", console, 0o755)
    _write(hdir / "bin" / "nvidia-smi", f'#!/bin/sh\n{env}exec "{python}" -m fleet_testbed.nvidia_smi "$@"\n', 0o755)
    site = hdir / "env" / "site"
    site.mkdir(parents=True, exist_ok=True)
    for name in ("sglang", "pynvml.py"):
        link = site / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(TESTBED / "simpkgs" / name)
    for old in site.glob("sglang-*.dist-info"):
        shutil.rmtree(old)
    _write(
        site / f"sglang-{spec.sglang_version}.dist-info" / "METADATA",
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {spec.sglang_version}\n",
    )
    for model in MODELS.iterdir():
        dest = hdir / "models" / model.name
        if not dest.exists():
            shutil.copytree(model, dest)
        write_weights(dest)
    for sub in ("state", "logs", "run/gpu"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    return hdir


def engine_env(hdir: Path, version: str, python: str = sys.executable) -> Path:
    """An environment of the simulated SGLang at `version` where `fleet engine install` puts one
    (state/engines/sglang-VERSION, with fleet's marker), its parser held to that version's flags."""
    env = hdir / "state" / "engines" / f"sglang-{version}"
    site = env / "site"
    _write(
        site / f"sglang-{version}.dist-info" / "METADATA", f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"
    )
    for name in ("sglang", "pynvml.py"):
        if not (site / name).is_symlink():
            (site / name).symlink_to(TESTBED / "simpkgs" / name)
    paths = f"{site}:{TESTBED.parent}"
    _write(
        env / "bin" / "python",
        f'#!/bin/sh\nexport SIM_HOST_DIR="{hdir}" PYTHONPATH="{paths}"\nexec "{python}" "$@"\n',
        0o755,
    )
    _write(env / ".fleet-engine.json", json.dumps({"engine": "sglang", "version": version}))
    return env


def write_weights(model_dir: Path) -> None:
    """The weight files the model's index names, as sparse safetensors files: a real header, then the
    size it declares (no disk used), so fleet's integrity check sees whole files."""
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    names = sorted(set(index.get("weight_map", {}).values()))
    each = int(index.get("metadata", {}).get("total_size", 0)) // max(1, len(names))
    for name in names:
        if (model_dir / name).exists():
            continue
        header = json.dumps({"weight": {"dtype": "BF16", "shape": [each // 2], "data_offsets": [0, each]}}).encode()
        with open(model_dir / name, "wb") as f:
            f.write(len(header).to_bytes(8, "little") + header)
            f.truncate(8 + len(header) + each)


def build_vllm_host(root: Path, spec: HostSpec, vllm_python: str) -> Path:
    """A host whose engine is a REAL vLLM on CPU (its NVML view stays simulated: one GPU's worth of facts
    for the planner); models are the tiny local ones made by tinymodels.py."""
    hdir = build_host(root, spec)
    env = f'export SIM_HOST_DIR="{hdir}" PYTHONPATH="{hdir}/env/site:{TESTBED.parent}"\n'
    _write(hdir / "env" / "bin" / "python", f'#!/bin/sh\n{env}exec "{vllm_python}" "$@"\n', 0o755)
    (hdir / "env" / "site" / "sglang").unlink(missing_ok=True)
    for old in (hdir / "env" / "site").glob("sglang-*.dist-info"):
        shutil.rmtree(old)
    subprocess.run([vllm_python, str(TESTBED / "tinymodels.py"), str(hdir / "models")], check=True, capture_output=True)
    return hdir


def record(hdir: Path, file: str = "state.json", deployment: str = "qwen36-27b") -> Path:
    """One of fleet's records for a deployment on a simulated host (state_dir/deployments/NAME/FILE)."""
    return hdir / "state" / "deployments" / deployment / file


def write_record(hdir: Path, data: Any, file: str = "state.json", deployment: str = "qwen36-27b") -> Path:
    """Write one of fleet's records for a deployment on a simulated host, as a test's side door."""
    path = record(hdir, file, deployment)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def newest_record(hdir: Path) -> Path:
    """The state.json of the deployment written last on a simulated host (tests with one deployment)."""
    found = sorted((hdir / "state" / "deployments").glob("*/state.json"), key=lambda p: p.stat().st_mtime_ns)
    if not found:
        raise FileNotFoundError(f"no deployment recorded on {hdir}")
    return found[-1]


def set_host(hdir: Path, **changes: Any) -> None:
    """Change host.json (e.g. sglang_version, an injected ECC error) of a simulated host."""
    host = json.loads((hdir / "host.json").read_text())
    host.update(changes)
    (hdir / "host.json").write_text(json.dumps(host, indent=1))
    if "sglang_version" in changes:
        site = hdir / "env" / "site"
        for old in site.glob("sglang-*.dist-info"):
            shutil.rmtree(old)
        _write(
            site / f"sglang-{changes['sglang_version']}.dist-info" / "METADATA",
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {changes['sglang_version']}\n",
        )


# --- sshd ------------------------------------------------------------------------------------------------


def ensure_keys(root: Path) -> tuple[Path, Path]:
    """Throwaway host key and client key for the whole sandbox."""
    keys = root / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    os.chmod(keys, 0o700)
    for name in ("host_ed25519", "id_ed25519"):
        if not (keys / name).exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    auth = keys / "authorized_keys"
    auth.write_text((keys / "id_ed25519.pub").read_text())
    auth.chmod(0o600)
    return keys / "host_ed25519", keys / "id_ed25519"


def sshd_binary() -> str:
    for candidate in ("/usr/sbin/sshd", shutil.which("sshd") or ""):
        if candidate and os.path.exists(candidate):
            return candidate
    raise RuntimeError("OpenSSH sshd not found: install openssh-server (make test does it on Debian)")


def _wait_port(address: str, port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((address, port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"sshd on {address}:{port} did not come up within {timeout_s} s")


_DAEMONS: dict[int, subprocess.Popen[bytes]] = {}


IDLE_LOADAVG = "0.08 0.06 0.05 1/96 4242\n"


def _own_files(hdir: Path) -> list[str]:
    """Inside the host's mount namespace, bind its own files over this machine's:
    - a stock Debian ~/.bashrc (returns at once when not interactive): sshd runs every command through
      the login shell, and a development box's ~/.bashrc (pyenv init here: ~0.17 s of CPU per command)
      would be paid by 50 "hosts" on the same 2 CPUs, which real hosts do not share;
    - /proc/loadavg from `loadavg` in the host's directory (idle unless `set_load` says otherwise):
      this machine's load, raised by whatever ran before, is not the simulated host's, and fleet
      health warns on load."""
    mounts = []
    bashrc = Path.home() / ".bashrc"
    if bashrc.is_file():
        skel = Path("/etc/skel/.bashrc")
        stock = hdir / "home.bashrc"
        stock.write_bytes(skel.read_bytes() if skel.is_file() else b"case $- in *i*) ;; *) return;; esac\n")
        mounts.append((stock, bashrc))
    loadavg = hdir / "loadavg"
    if not loadavg.exists():
        loadavg.write_text(IDLE_LOADAVG)
    mounts.append((loadavg, Path("/proc/loadavg")))
    binds = " && ".join(f"mount --bind {shlex.quote(str(a))} {shlex.quote(str(b))}" for a, b in mounts)
    return ["sh", "-c", f'{binds} && exec "$@"', "sh"]


def start_sshd(root: Path, hdir: Path, address: str, port: int) -> int:
    host_key, _ = ensure_keys(root)
    cfg = hdir / "sshd_config"
    path_env = f"{hdir}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    _write(
        cfg,
        "\n".join(
            [
                f"ListenAddress {address}:{port}",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {root}/keys/authorized_keys",
                f"PidFile {hdir}/sshd.pid",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "MaxSessions 200",
                "MaxStartups 500",
                "LogLevel ERROR",
                f"SetEnv SIM_HOST_DIR={hdir} PATH={path_env}",
                "",
            ]
        ),
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation directory
    cmd = [sshd_binary(), "-D", "-e", "-f", str(cfg)]
    if os.geteuid() == 0 and shutil.which("unshare"):
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *_own_files(hdir), *cmd]
    with open(hdir / "sshd.log", "ab") as log:  # the daemon keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    _DAEMONS[proc.pid] = proc  # keep the handle: a collected Popen of a live process warns
    (hdir / "sshd.outer.pid").write_text(str(proc.pid))
    _wait_port(address, port)
    return proc.pid


def stop_sshd(hdir: Path) -> None:
    pid_file = hdir / "sshd.outer.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text())
    with contextlib.suppress(ProcessLookupError):  # --kill-child takes the namespace's processes with it
        os.killpg(pid, signal.SIGKILL)
    if pid in _DAEMONS:
        _DAEMONS.pop(pid).wait(timeout=10)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.02)
    pid_file.unlink(missing_ok=True)


def host_key_line(root: Path, address: str, port: int) -> str:
    pub = (root / "keys" / "host_ed25519.pub").read_text().split()
    return f"[{address}]:{port} {pub[0]} {pub[1]}\n"


def inventory_yaml(root: Path, specs: list[HostSpec], port: int, engine: str = "sglang") -> str:
    """An inventory for these simulated hosts (what inventory/sandbox.yaml holds for the default root)."""
    lines = [
        "# Simulated fleet on loopback (made by `python -m fleet_testbed up`).",
        "defaults:",
        f"  port: {port}",
        f"  identity_file: {root}/keys/id_ed25519",
        "  connect_timeout_s: 5",
        "hosts:",
    ]
    for s in specs:
        h = root / s.name
        lines += [
            f"  {s.name}:",
            f"    address: {s.address}",
            f"    bind_address: {s.address}",
            f"    engines: {{{engine}: {h}/env/bin/python}}",
            f"    models_dir: {h}/models",
            f"    state_dir: {h}/state",
            f"    log_dir: {h}/logs",
            f"    gpu_devices: {h}/dev/nvidia*",
            f"    kernel_log: {h}/kern.log",
        ]
    groups = {"sim": [s.name for s in specs]}
    lines.append("groups:")
    for g, members in groups.items():
        lines += [f"  {g}:", f"    hosts: [{', '.join(members)}]"]
    return "\n".join(lines) + "\n"


@dataclass
class Sandbox:
    root: Path
    specs: list[HostSpec]
    port: int

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yaml"

    def host_dir(self, name: str) -> Path:
        return self.root / name

    def env(self) -> dict[str, str]:
        return {"FLEET_KNOWN_HOSTS": str(self.known_hosts), "FLEET_SSH_CONFIG": str(self.root / "ssh_config")}


def up(root: Path, specs: list[HostSpec], port: int = 2222, python: str = sys.executable) -> Sandbox:
    root.mkdir(parents=True, exist_ok=True)
    ensure_keys(root)
    for spec in specs:  # a host coming up has no GPU memory in use: forget records of an earlier life
        shutil.rmtree(root / spec.name / "run", ignore_errors=True)
    (root / "ssh_config").write_text("# fleet sandbox: nothing from ~/.ssh/config\n")
    known = []
    for spec in specs:
        hdir = build_host(root, spec, python)
        stop_sshd(hdir)
        start_sshd(root, hdir, spec.address, port)
        known.append(host_key_line(root, spec.address, port))
    (root / "known_hosts").write_text("".join(known))
    (root / "inventory.yaml").write_text(inventory_yaml(root, specs, port))
    (root / "sandbox.json").write_text(json.dumps({"hosts": [s.name for s in specs], "port": port}))
    return Sandbox(root, specs, port)


RESET_SCRIPT = r"""
import os, signal
me = os.getpid()
keep = {1, me, os.getppid()}
for name in os.listdir("/proc"):
    if not name.isdigit() or int(name) in keep:
        continue
    try:
        comm = open("/proc/%s/comm" % name).read().strip()
    except OSError:
        continue
    if comm == "sshd" or comm.startswith("sshd"):
        continue
    try:
        os.kill(int(name), signal.SIGKILL)
    except OSError:
        pass
"""


def set_load(sb: Sandbox, spec: HostSpec, loadavg: str) -> None:
    """What /proc/loadavg says on the host. Written in place (the host sees this file's inode through a
    bind mount: a file renamed over it would not be seen)."""
    (sb.host_dir(spec.name) / "loadavg").write_text(loadavg)


def reset_host(sb: Sandbox, spec: HostSpec) -> None:
    """Kill every process on a simulated host (but its sshd) and wipe its state, logs and GPU usage."""
    hdir = sb.host_dir(spec.name)
    import shlex

    subprocess.run(
        [*ssh_argv(sb, spec), f"python3 -c {shlex.quote(RESET_SCRIPT)}"], check=False, capture_output=True, timeout=30
    )
    for sub in ("state", "logs", "run"):
        shutil.rmtree(hdir / sub, ignore_errors=True)
    (hdir / "kern.log").unlink(missing_ok=True)
    set_load(sb, spec, IDLE_LOADAVG)
    for sub in ("state", "logs", "run/gpu"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    build_host(sb.root, spec)


DROP_SCRIPT = r"""
import os, signal
me = os.getpid()
ancestors = set()
pid = me
while pid > 1:
    ancestors.add(pid)
    pid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
for name in os.listdir("/proc"):
    if name.isdigit() and int(name) not in ancestors and int(name) != 1:
        try:
            if open("/proc/%s/comm" % name).read().strip().startswith("sshd"):
                os.kill(int(name), signal.SIGKILL)
        except OSError:
            pass
"""


def drop_connections(sb: Sandbox, spec: HostSpec) -> None:
    """Cut every SSH connection to a simulated host (its sshd listener stays up)."""
    import shlex

    subprocess.run(
        [*ssh_argv(sb, spec), f"python3 -c {shlex.quote(DROP_SCRIPT)}"], check=False, capture_output=True, timeout=30
    )


def drop_connections_outside(sb: Sandbox, spec: HostSpec) -> None:
    """Cut the host's SSH connections from outside its namespace (for when its listener is frozen)."""
    outer = int((sb.host_dir(spec.name) / "sshd.outer.pid").read_text())
    listener = subprocess.run(["pgrep", "-P", str(outer)], capture_output=True, text=True).stdout.split()
    for pid in listener:
        sessions = subprocess.run(["pgrep", "-P", pid], capture_output=True, text=True).stdout.split()
        for session in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(session), signal.SIGKILL)


def freeze_sshd(sb: Sandbox, spec: HostSpec, frozen: bool) -> None:
    """SIGSTOP/SIGCONT the host's sshd listener: new connections hang, as with a host that stopped answering."""
    outer = int((sb.host_dir(spec.name) / "sshd.outer.pid").read_text())
    listener = subprocess.run(["pgrep", "-P", str(outer)], capture_output=True, text=True).stdout.split()
    for pid in listener or [str(outer)]:
        os.kill(int(pid), signal.SIGSTOP if frozen else signal.SIGCONT)


def freeze_host(sb: Sandbox, spec: HostSpec, frozen: bool) -> None:
    """SIGSTOP/SIGCONT every sshd of the host, its open sessions' too: connections stay up and nothing
    answers on them, as with a host that froze (the processes inside keep running)."""
    outer = int((sb.host_dir(spec.name) / "sshd.outer.pid").read_text())
    todo, seen = [outer], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        todo += [int(c) for c in children]
    for pid in seen:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("sshd"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP if frozen else signal.SIGCONT)


def ssh_argv(sb: Sandbox, spec: HostSpec) -> list[str]:
    """A plain OpenSSH command line to a simulated host (the benchmark's floor, tests' side door)."""
    return [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={sb.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-i",
        str(sb.root / "keys" / "id_ed25519"),
        "-p",
        str(sb.port),
        spec.address,
    ]


def down(root: Path) -> None:
    for pid_file in root.glob("*/sshd.outer.pid"):
        stop_sshd(pid_file.parent)
