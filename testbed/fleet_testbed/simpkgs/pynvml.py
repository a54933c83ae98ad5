"""Stand-in for `pynvml` (nvidia-ml-py) on a simulated host: same call names, data from host.json.

Only the calls fleet's probe makes are provided; anything else raises NVMLError like a missing symbol.
"""

import time

from fleet_testbed import gpustate

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
_inited = False
# One snapshot serves a burst of calls. A real NVML query is an ioctl of some microseconds; re-reading
# host.json and every engine's registration per call made the stand-in cost a probe ~20 ms of CPU,
# which, with 50 simulated hosts on one machine's CPUs, distorted every sweep the benchmark times.
# 20 ms is shorter than any poll interval fleet uses, so a poll still sees the state change.
_SNAPSHOT_S = 0.02
_snapshot: tuple[float, list] = (float("-inf"), [])


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - nvidia-ml-py's name
    def __init__(self):
        super().__init__("Not Supported")


class _Mem:
    def __init__(self, total, used):
        self.total, self.used, self.free = total, used, total - used


class _Proc:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


def _table():
    global _snapshot
    if not _inited:
        raise NVMLError("Uninitialized")
    taken, table = _snapshot
    if time.monotonic() - taken > _SNAPSHOT_S:
        table = gpustate.gpu_table()
        _snapshot = (time.monotonic(), table)
    return table


def nvmlInit():
    global _inited
    if gpustate.load_host().get("nvml_broken"):
        raise NVMLError("Driver Not Loaded")
    _inited = True


def nvmlShutdown():
    global _inited, _snapshot
    _inited = False
    _snapshot = (float("-inf"), [])


def nvmlDeviceGetCount():
    return len(_table())


def nvmlDeviceGetHandleByIndex(i):
    if i >= len(_table()):
        raise NVMLError("Invalid Argument")
    return i


NVML_TOPOLOGY_INTERNAL, NVML_TOPOLOGY_SINGLE, NVML_TOPOLOGY_MULTIPLE = 0, 10, 20
NVML_TOPOLOGY_HOSTBRIDGE, NVML_TOPOLOGY_NODE, NVML_TOPOLOGY_SYSTEM = 30, 40, 50


def nvmlDeviceGetTopologyCommonAncestor(h1, h2):
    """The closest link two GPUs share, from host.json's pcie_switch and numa_node per GPU."""
    a, b = _table()[h1], _table()[h2]
    if "pcie_switch" not in a or "pcie_switch" not in b:
        raise NVMLError("Not Supported")
    if h1 == h2:
        return NVML_TOPOLOGY_INTERNAL
    if a["pcie_switch"] == b["pcie_switch"]:
        return NVML_TOPOLOGY_SINGLE
    return NVML_TOPOLOGY_NODE if a.get("numa_node") == b.get("numa_node") else NVML_TOPOLOGY_SYSTEM


def nvmlDeviceGetMinorNumber(h):
    """The N of /dev/nvidiaN; a real box may number them apart from NVML's indices (host.json `minor`)."""
    return int(_table()[h].get("minor", h))


def nvmlDeviceGetName(h):
    return _table()[h]["name"]


def nvmlDeviceGetUUID(h):
    return _table()[h]["uuid"]


def nvmlDeviceGetCudaComputeCapability(h):
    major, minor = _table()[h]["compute_capability"].split(".")
    return int(major), int(minor)


def nvmlDeviceGetMemoryInfo(h):
    """Like NVML's v1 memory info, "used" counts the memory the driver reserves (nvidia-smi's does not)."""
    g = _table()[h]
    return _Mem(g["memory_total_mib"] << 20, (g["memory_used_mib"] + g.get("driver_reserved_mib", 0)) << 20)


def nvmlDeviceGetNvLinkState(h, link):
    if gpustate.load_host().get("interconnect", "pcie") != "nvlink":
        raise NVMLError_NotSupported()  # as on a PCIe-only H200 (docs/real-gpu.md)
    return 1


def nvmlDeviceGetTemperature(h, sensor):
    return _table()[h].get("temperature_c", 35)


def nvmlDeviceGetComputeRunningProcesses(h):
    return [_Proc(p["pid"], p["used_mib"] << 20) for p in _table()[h]["processes"]]


def nvmlDeviceGetTotalEccErrors(h, error_type, counter_type):
    return _table()[h].get("ecc_uncorrected", 0)


def nvmlDeviceGetCurrentClocksThrottleReasons(h):
    return _table()[h].get("throttle_reasons", 0)


def _from_ampere(h):
    return int(_table()[h]["compute_capability"].split(".")[0]) >= 8


def nvmlDeviceGetRetiredPagesPendingStatus(h):
    if _from_ampere(h):  # replaced by row remapping: an H200 answers NotSupported (docs/real-gpu.md)
        raise NVMLError_NotSupported()
    return 1 if _table()[h].get("retired_pages_pending") else 0


def nvmlDeviceGetRemappedRows(h):
    """(corrected rows, uncorrected rows, remap pending, remap failure); (0, 0, 0, 0) on a healthy H200."""
    if not _from_ampere(h):
        raise NVMLError_NotSupported()
    g = _table()[h]
    pending, failure = bool(g.get("row_remap_pending")), bool(g.get("row_remap_failure"))
    return 0, int(pending or failure), int(pending), int(failure)


def nvmlSystemGetDriverVersion():
    return gpustate.load_host().get("driver_version", "580.95.05")


def nvmlSystemGetCudaDriverVersion():
    major, minor = gpustate.load_host().get("cuda_version", "13.0").split(".")
    return int(major) * 1000 + int(minor) * 10
