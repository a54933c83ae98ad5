"""A stand-in for the host's GPU, so that SGLang's own argument resolution runs where there is none: on
the operator's machine, in a local Python that has the SGLang version an upgrade would install (`fleet
engine audit`). Run as the first part of fleet's engine check (host/check_sglang.py), in its process.

FLEET_STANDIN_GPU says the GPU: {"major", "minor", "name", "memory_mib", "count"}. What SGLang reads of the
machine while it resolves arguments (engines.md §7.2, §7.3):
- 0.5.23 asks one place, `sglang.srt.runtime_context`: `override_platform(...)` is SGLang's own hook for
  saying what kind of machine this is. The GPU's memory and name are read through `sglang.srt.utils`.
- 0.5.11 imports its device probes by name (`is_sm90_supported`, `get_device_memory_capacity`, ...)
  into the modules that read them; each such name is replaced where it was imported. `sglang.srt.utils`
  itself keeps its answers, so modules imported later do not import CUDA-only kernels.
- Both ask torch.cuda for the device's capability, name and memory: it answers for the stand-in too,
  after the modules that import CUDA-only code lazily were loaded while torch still said "no CUDA".
Resolution also needs `--device cuda` and a local directory with the model's config.json (fleet.control.
audit writes both). What the stand-in cannot show (kernels, NCCL, memory at load) the deploy finds out.
"""

import importlib.machinery
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any


class _Absent:
    """Any attribute of a module that stands in for an absent one: a class that accepts anything."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> "_Absent":
        return self

    def __getattr__(self, name: str) -> "_Absent":
        return self


class _StandinModules:
    """Makes `import torchvision[.x]` work when it cannot load here: SGLang imports it at module level
    (0.5.11 srt/utils/common.py `from torchvision.io import decode_jpeg`) and never calls it while it
    resolves arguments, and PyPI's torchvision is built for CUDA, so it does not load beside a CPU torch."""

    def __init__(self, roots: dict[str, str]) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)  # type: ignore[arg-type]
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__file__ = f"<fleet stand-in for {spec.name}>"
        module.__path__ = []
        if spec.name in self.roots:
            module.__version__ = self.roots[spec.name]  # type: ignore[attr-defined]
        module.__getattr__ = lambda name: _Absent() if not name.startswith("__") else _raise(name)  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _raise(name: str) -> Any:
    raise AttributeError(name)


def _standin_modules() -> None:
    try:
        import torchvision  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except Exception:  # noqa: BLE001  (absent, or built for another torch: either way it cannot load)
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        sys.meta_path.insert(0, _StandinModules({"torchvision": "0.0.0+fleet-standin"}))


def _standin_gpu() -> None:
    _standin_modules()
    gpu = json.loads(os.environ["FLEET_STANDIN_GPU"])
    major, minor, name = int(gpu["major"]), int(gpu["minor"]), str(gpu["name"])
    memory_mib, count = int(gpu["memory_mib"]), int(gpu["count"])

    def answer(value: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: value

    probes: dict[str, Any] = {
        "is_cuda": True,
        "is_cuda_alike": True,
        "is_hip": False,
        "is_npu": False,
        "is_xpu": False,
        "is_musa": False,
        "is_cpu": False,
        "is_sm90_supported": major == 9,
        "is_sm100_supported": major == 10,
        "is_sm120_supported": major == 12,
        "is_blackwell_supported": major >= 10,
        "is_hopper_with_cuda_12_3": major == 9,
        "get_device_memory_capacity": memory_mib,
        "get_device_name": name,
        "get_device_sm": major * 10 + minor,
        "get_device_capability": (major, minor),
        "is_flashinfer_available": True,
    }
    # the modules resolution reads, loaded so that the names they imported can be replaced
    import sglang.srt.server_args  # type: ignore[import-not-found,unused-ignore]  # noqa: F401

    try:
        from sglang.srt import runtime_context  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        runtime_context = None
    platform = getattr(runtime_context, "override_platform", None)
    utils = ("sglang.srt.utils", "sglang.srt.utils.common")
    if platform is not None:
        known = set(getattr(runtime_context, "_PLATFORM_PROBES", {})) | set(
            getattr(runtime_context, "_PLATFORM_VALUES", {})
        )
        facts = {
            "is_cuda": True,
            "is_hip": False,
            "is_npu": False,
            "is_xpu": False,
            "is_musa": False,
            "is_mps": False,
            "is_sm90": major == 9,
            "is_sm100": major == 10,
            "is_sm100_or_sm110": major in (10, 11),
            "is_sm110": major == 11,
            "is_sm120": major == 12,
            "is_blackwell": major >= 10,
            "is_hopper_with_cuda_12_3": major == 9,
            "has_amx": False,
            "has_flashinfer": True,
            "device_sm": major * 10 + minor,
            "device_capability": (major, minor),
        }
        platform(**{k: v for k, v in facts.items() if not known or k in known}).install()
        _replace({k: probes[k] for k in ("get_device_memory_capacity", "get_device_name")}, answer, utils, True)
    else:
        _replace(probes, answer, utils, False)
    import contextlib
    import importlib

    for module in ("sglang.srt.configs.model_config", "sglang.srt.layers.quantization"):
        with contextlib.suppress(Exception):  # resolution says what it lacks, in its own words
            importlib.import_module(module)
    _standin_torch(major, minor, name, memory_mib, count)


def _replace(
    probes: dict[str, Any], answer: Callable[[Any], Callable[..., Any]], utils: Sequence[str], in_utils: bool
) -> None:
    """Each probe, wherever a loaded sglang module imported it by name (and in the utils modules
    themselves when `in_utils`, so that modules imported later see the stand-in too)."""
    originals: dict[str, Any] = {}
    for mod_name in utils:
        mod = sys.modules.get(mod_name)
        for probe in probes:
            if mod is not None and hasattr(mod, probe):
                originals.setdefault(probe, getattr(mod, probe))
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("sglang") or mod is None or (mod_name in utils and not in_utils):
            continue
        names = getattr(mod, "__dict__", None) or {}
        for probe, value in probes.items():
            current = names.get(probe)
            if current is not None and (current is originals.get(probe) or mod_name in utils):
                names[probe] = answer(value)


def _standin_torch(major: int, minor: int, name: str, memory_mib: int, count: int) -> None:
    import torch  # type: ignore[import-not-found,unused-ignore]

    total = memory_mib << 20
    props = types.SimpleNamespace(
        name=name,
        major=major,
        minor=minor,
        total_memory=total,
        multi_processor_count=132,
        is_integrated=False,
        L2_cache_size=64 << 20,
        gcnArchName="",
    )
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: count
    cuda.get_device_capability = lambda device=None: (major, minor)
    cuda.get_device_name = lambda device=None: name
    cuda.get_device_properties = lambda device=None: props
    cuda.mem_get_info = lambda device=None: (total - (1 << 30), total)
    cuda.current_device = lambda: 0


_standin_gpu()
