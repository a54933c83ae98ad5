"""What the probe says about a host's GPUs: NVML (the engine environment's binding), else nvidia-smi, and
which processes hold the GPU device files. Runs ON the host with fleet.host.probe: standard library only,
Python 3.8; prepended before probe.py when the probe step is sent (fleet.hostscripts)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional

try:  # the shared host code is prepended when this script is sent to a host
    gpu_device_files  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import gpu_device_files
    from fleet.host.container import container_of
    from fleet.host.procs import device_holders, holders_by_file, process


def gpu_holders(device_glob: str) -> Dict[str, Any]:
    """Processes holding the GPU device files: `fuser` when present, else a /proc scan."""
    files = gpu_device_files(device_glob)
    pids, method = device_holders(files)
    found = [process(pid) for pid in sorted(pids)]
    holders = [p for p in found if p]
    for p in holders:
        p.pop("argv", None)  # the command line says it once
        p["container"] = container_of(p["pid"])
    per_gpu = [f for f in files if re.match(r"^nvidia\d+$", os.path.basename(f))]
    by_file = dict((os.path.basename(f), h) for f, h in holders_by_file(per_gpu, among=pids).items()) if pids else {}
    return {"device_files": files, "method": method, "holders": holders, "by_file": by_file}


def _nvml() -> Dict[str, Any]:
    import pynvml as n  # the engine environment's binding (nvidia-ml-py)

    n.nvmlInit()
    try:
        gpus = []
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            name = n.nvmlDeviceGetName(h)
            uuid = n.nvmlDeviceGetUUID(h)
            major, minor = n.nvmlDeviceGetCudaComputeCapability(h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            gpu = {
                "index": i,
                "minor": None,
                "name": name.decode() if isinstance(name, bytes) else name,
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "compute_capability": "%d.%d" % (major, minor),
                "memory_total_mib": mem.total // (1 << 20),
                "memory_used_mib": mem.used // (1 << 20),
                "temperature_c": None,
                "processes": [],
                "ecc_uncorrected": None,
                "throttle_reasons": None,
                "retired_pages_pending": None,
                "row_remap_pending": None,
                "row_remap_failure": None,
            }
            try:  # the N of /dev/nvidiaN, which need not be the index
                gpu["minor"] = int(n.nvmlDeviceGetMinorNumber(h))
            except Exception:
                pass
            try:  # PCIe-only cards raise NotSupported; an active link 0 means NVLink
                gpu["nvlink"] = bool(n.nvmlDeviceGetNvLinkState(h, 0))
            except Exception:
                gpu["nvlink"] = False
            try:
                gpu["temperature_c"] = n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
            except Exception:
                pass
            try:
                for p in n.nvmlDeviceGetComputeRunningProcesses(h):
                    used = getattr(p, "usedGpuMemory", None)
                    gpu["processes"].append({"pid": p.pid, "used_mib": (used or 0) // (1 << 20)})
            except Exception:
                pass
            try:
                gpu["ecc_uncorrected"] = n.nvmlDeviceGetTotalEccErrors(
                    h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC
                )
            except Exception:
                pass
            try:
                gpu["throttle_reasons"] = n.nvmlDeviceGetCurrentClocksThrottleReasons(h)
            except Exception:
                pass
            try:  # page retirement: GPUs before Ampere (an H200 answers NotSupported)
                gpu["retired_pages_pending"] = bool(n.nvmlDeviceGetRetiredPagesPendingStatus(h))
            except Exception:
                pass
            try:  # row remapping replaced it from Ampere on: (corrected, uncorrected, pending, failure)
                remap = n.nvmlDeviceGetRemappedRows(h)
                gpu["row_remap_pending"] = bool(remap[2])
                gpu["row_remap_failure"] = bool(remap[3])
            except Exception:
                pass
            gpus.append(gpu)
        driver = n.nvmlSystemGetDriverVersion()
        cuda = n.nvmlSystemGetCudaDriverVersion()
        return {
            "source": "nvml",
            "gpus": gpus,
            "topology": _topology(n, len(gpus)),
            "driver_version": driver.decode() if isinstance(driver, bytes) else driver,
            "cuda_version": "%d.%d" % (cuda // 1000, (cuda % 1000) // 10),
        }
    finally:
        n.nvmlShutdown()


def _topology(n: Any, count: int) -> Optional[List[List[int]]]:
    """[i, j, level] for every pair of GPUs: the closest link they share, as NVML ranks it (10: one PCIe
    switch, 20: several switches, 30: a host bridge, 40: one NUMA node, 50: across sockets). None when
    NVML cannot say (a driver or board that does not report it)."""
    try:
        handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        return [
            [i, j, int(n.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j]))]
            for i in range(count)
            for j in range(i + 1, count)
        ]
    except Exception:
        return None


def _nvidia_smi() -> Optional[Dict[str, Any]]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    q = "index,name,uuid,compute_cap,memory.total,memory.used,temperature.gpu"
    out = subprocess.run(
        [smi, "--query-gpu=" + q, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    if out.returncode != 0:
        return {"source": "nvidia-smi", "gpus": [], "error": out.stderr.decode()[-500:]}
    gpus = []
    by_uuid: Dict[str, Dict[str, Any]] = {}
    for line in out.stdout.decode().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7:
            continue
        gpu: Dict[str, Any] = {
            "index": int(f[0]),
            "name": f[1],
            "uuid": f[2],
            "compute_capability": f[3],
            "memory_total_mib": int(float(f[4])),
            "memory_used_mib": int(float(f[5])),
            "temperature_c": int(float(f[6])) if f[6] not in ("", "[N/A]") else None,
            "processes": [],
            "ecc_uncorrected": None,
            "throttle_reasons": None,
            "retired_pages_pending": None,
        }
        gpus.append(gpu)
        by_uuid[gpu["uuid"]] = gpu
    apps = subprocess.run(
        [smi, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    for line in apps.stdout.decode().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 3 and f[0] in by_uuid:
            by_uuid[f[0]]["processes"].append({"pid": int(f[1]), "used_mib": int(float(f[2]))})
    head = subprocess.run([smi], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode()
    drv = re.search(r"Driver Version:\s*([\d.]+)", head)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", head)
    return {
        "source": "nvidia-smi",
        "gpus": gpus,
        "driver_version": drv.group(1) if drv else None,
        "cuda_version": cuda.group(1) if cuda else None,
    }


def gpu_facts() -> Dict[str, Any]:
    try:
        return _nvml()
    except Exception as exc:  # no pynvml, no driver: fall back to nvidia-smi
        nvml_error = "%s: %s" % (type(exc).__name__, exc)
        # not installed (no binding, or no libnvidia-ml) as opposed to installed and failing (the driver)
        nvml_absent = isinstance(exc, ImportError) or type(exc).__name__ == "NVMLError_LibraryNotFound"
    smi = _nvidia_smi()
    if smi is None:
        return {
            "source": "none",
            "gpus": [],
            "error": "no NVML (%s) and no nvidia-smi" % nvml_error,
            "tools_missing": nvml_absent,
        }
    smi["nvml_error"] = nvml_error
    return smi
