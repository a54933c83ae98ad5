"""What a real GPU shows of memory shared over CUDA IPC, the way SGLang's weight cache daemon shares a
model's weights with the engines it serves (docs/real-gpu.md, issue 41). Runs on a GPU machine with
PyTorch and nvidia-ml-py, standard library otherwise:

    python3 testbed/device_ipc.py OUTDIR [PROBE_SCRIPT]

A "daemon" process allocates 4 GiB and hands it to an "engine" process over CUDA IPC (torch.multiprocessing);
the engine allocates 1 GiB of its own. At each step (idle, daemon alone, both, daemon killed while the
engine holds its import, engine ended) it records what NVML says per process and in all, what
`nvidia-smi --query-compute-apps` says, and which processes hold the GPU's device files. With both
running it also runs fleet's own host probe (PROBE_SCRIPT: `script_for("probe", ...)` written to a file),
whose JSON fleet parses here. The orchestrating process never touches CUDA, so it holds nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30


def daemon(handoff: Any, told: Any) -> None:
    import torch

    weights = torch.ones(4 * GIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    handoff.put(weights)  # the engine maps this allocation; the daemon must keep it alive meanwhile
    told.put(("daemon", os.getpid()))
    time.sleep(3600)  # until killed


def engine(handoff: Any, told: Any, orders: Any) -> None:
    import torch

    weights = handoff.get(timeout=120)
    own = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    own.fill_(2)
    torch.cuda.synchronize()
    told.put(("engine", os.getpid(), int(weights[: 1 << 20].sum().item())))
    while True:
        order = orders.get(timeout=300)
        if order == "read":  # after the daemon died: is the imported memory still readable?
            try:
                total = int(weights[: 1 << 20].sum().item())
                torch.cuda.synchronize()
                told.put(("read", "ok", total))
            except Exception as exc:  # a CUDA error is the finding, not a failure of the check
                told.put(("read", "error", f"{type(exc).__name__}: {exc}"[:500]))
        elif order == "exit":
            return


def holders() -> list[dict[str, Any]]:
    """Processes with a /dev/nvidia* file open (the /proc scan fleet falls back to without fuser)."""
    out = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            held = sorted({os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds} & set(_device_files()))
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            continue
        if held:
            out.append({"pid": pid, "files": held, "argv": argv})
    return out


def _device_files() -> list[str]:
    return [os.path.join("/dev", f) for f in os.listdir("/dev") if f.startswith("nvidia")]


def snapshot(label: str) -> dict[str, Any]:
    import pynvml as n

    n.nvmlInit()
    try:
        h = n.nvmlDeviceGetHandleByIndex(0)
        mem = n.nvmlDeviceGetMemoryInfo(h)
        procs = [
            {"pid": p.pid, "used_mib": None if p.usedGpuMemory is None else p.usedGpuMemory // (1 << 20)}
            for p in n.nvmlDeviceGetComputeRunningProcesses(h)
        ]
    finally:
        n.nvmlShutdown()
    smi = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return {
        "label": label,
        "time": time.time(),
        "nvml_used_mib": mem.used // (1 << 20),
        "nvml_processes": procs,
        "smi_compute_apps": smi.stdout.strip().splitlines(),
        "device_file_holders": holders(),
    }


def main() -> int:
    out_dir = sys.argv[1]
    probe = sys.argv[2] if len(sys.argv) > 2 else None
    os.makedirs(out_dir, exist_ok=True)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    handoff, told, orders = ctx.Queue(), ctx.Queue(), ctx.Queue()
    record: dict[str, Any] = {"snapshots": []}
    record["snapshots"].append(snapshot("idle"))
    d = ctx.Process(target=daemon, args=(handoff, told), name="weight-daemon")
    d.start()
    record["daemon"] = told.get(timeout=120)
    record["snapshots"].append(snapshot("daemon alone, 4 GiB"))
    e = ctx.Process(target=engine, args=(handoff, told, orders), name="engine")
    e.start()
    record["engine"] = told.get(timeout=120)
    time.sleep(0.5)
    record["snapshots"].append(snapshot("daemon and engine (4 GiB imported, 1 GiB its own)"))
    if probe:
        ran = subprocess.run(["sh", probe], capture_output=True, text=True, timeout=60)
        with open(os.path.join(out_dir, "probe-both.json"), "w") as f:
            f.write(ran.stdout)
    assert d.pid is not None
    os.kill(d.pid, signal.SIGKILL)
    d.join(30)
    time.sleep(2.0)
    record["snapshots"].append(snapshot("daemon killed, engine alive"))
    orders.put("read")
    try:
        record["read_after_daemon_died"] = told.get(timeout=60)
    except Exception as exc:  # noqa: BLE001 - the engine may have died with the daemon: that is the finding
        record["read_after_daemon_died"] = ["no answer", repr(exc), e.is_alive(), e.exitcode]
    time.sleep(0.5)
    record["snapshots"].append(snapshot("after the engine read"))
    orders.put("exit")
    e.join(60)
    if e.is_alive():
        e.kill()
        e.join(10)
    record["engine_exitcode"] = e.exitcode
    time.sleep(1.0)
    record["snapshots"].append(snapshot("engine ended"))
    with open(os.path.join(out_dir, "ipc.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(json.dumps(record, indent=1)[:6000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
