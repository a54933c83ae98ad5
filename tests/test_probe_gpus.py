"""The probe tells "nothing here can read GPUs" (no NVML binding or library, no nvidia-smi) from "the
tools are there and fail" (the driver): `fleet health` warns on the first and calls the second
critical hardware. Decided from the exception's type, not its wording."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.hostscripts import source_for

# nvidia-ml-py's classes: NVMLError_LibraryNotFound is made by its error-class factory from NVMLError.
STUB = """
class NVMLError(Exception):
    pass
class NVMLError_LibraryNotFound(NVMLError):
    pass
def nvmlInit():
    raise {error}
"""


def gpus_seen(tmp_path: Path, pynvml: str | None) -> dict[str, object]:
    site = tmp_path / "site"
    site.mkdir()
    if pynvml is not None:
        (site / "pynvml.py").write_text(STUB.format(error=pynvml))
    code = (
        "import sys\n"
        # the standard library stays importable; the test's directory replaces every site-packages
        + f"sys.path[:] = [{str(site)!r}] + [p for p in sys.path if p and 'site-packages' not in p]\n"
        + "FLEET_PROBE_AS_LIBRARY = True\n"
        + source_for("probe")
        + "\nimport json\nprint(json.dumps(gpu_facts()))\n"
    )
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}  # no nvidia-smi
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


@pytest.mark.parametrize(
    ("pynvml", "missing"),
    [
        (None, True),  # no binding installed
        ("NVMLError_LibraryNotFound('NVML Shared Library Not Found')", True),  # binding, no libnvidia-ml
        ("NVMLError('Driver Not Loaded')", False),  # installed and failing: the driver
        ("NVMLError('Unknown Error')", False),  # a GPU fallen off the bus answers this
    ],
)
def test_missing_tools_are_told_from_a_failing_driver(tmp_path: Path, pynvml: str | None, missing: bool) -> None:
    gpus = gpus_seen(tmp_path, pynvml)
    assert gpus["source"] == "none" and gpus["gpus"] == [] and "no nvidia-smi" in str(gpus["error"])
    assert gpus["tools_missing"] is missing


def test_nvidia_smi_tells_what_nvml_tells_when_nvml_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A binding whose driver fails sends the probe to nvidia-smi's CSV and its banner: the same GPUs,
    names, ids, capability, memory and temperature, driver and CUDA versions (used memory aside: only NVML
    counts what the driver reserves), and why NVML was not used."""
    import importlib.util
    import types

    from fleet.host import probe_gpus
    from fleet_testbed import simhost

    hdir = simhost.build_host(tmp_path, simhost.CT129)
    monkeypatch.setenv("SIM_HOST_DIR", str(hdir))
    monkeypatch.setenv("PATH", f"{hdir / 'bin'}{os.pathsep}{os.environ['PATH']}")
    spec = importlib.util.spec_from_file_location("pynvml", simhost.TESTBED / "simpkgs" / "pynvml.py")
    assert spec is not None and spec.loader is not None
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)
    monkeypatch.setitem(sys.modules, "pynvml", standin)
    nvml = probe_gpus.gpu_facts()

    def driver_not_loaded() -> None:
        raise RuntimeError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=driver_not_loaded))
    smi = probe_gpus.gpu_facts()
    assert (nvml["source"], smi["source"]) == ("nvml", "nvidia-smi")
    assert smi["nvml_error"] == "RuntimeError: Driver Not Loaded"
    same = ("index", "name", "uuid", "compute_capability", "memory_total_mib", "temperature_c", "processes")
    assert [{k: g[k] for k in same} for g in smi["gpus"]] == [{k: g[k] for k in same} for g in nvml["gpus"]]
    assert len(smi["gpus"]) == 2 and smi["gpus"][0]["name"] == "NVIDIA RTX A6000"
    assert (smi["driver_version"], smi["cuda_version"]) == (nvml["driver_version"], nvml["cuda_version"])
