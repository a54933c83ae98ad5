"""Host facts as the probe reports them, built from the same data the simulated hosts use (for pure tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleet.facts import HostFacts, parse_facts

MODELS = Path(__file__).resolve().parents[1] / "testbed" / "fleet_testbed" / "models"
CONFIGS = Path(__file__).resolve().parent / "data" / "configs"
RTX_PRO_6000 = ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", 97887)
RTX_A6000 = ("NVIDIA RTX A6000", "8.6", 49140)
B200 = ("NVIDIA B200", "10.0", 183359)


def model_files(name: str | Path) -> dict[str, Any]:
    """A model's files as the probe reads them: a testbed model by name, or any directory."""
    d = name if isinstance(name, Path) else MODELS / name
    quant = d / "hf_quant_config.json"
    index = json.loads((d / "model.safetensors.index.json").read_text())
    return {
        "config": json.loads((d / "config.json").read_text()),
        "quant_config": json.loads(quant.read_text()) if quant.exists() else None,
        "weights_bytes": index["metadata"]["total_size"],
        "sentence_transformers": (d / "modules.json").exists(),
    }


def facts(
    host: str,
    gpu: tuple[str, str, int],
    count: int,
    *,
    engine: str = "sglang",
    version: str = "0.5.11",
    model: str | Path | None = None,
    model_path: str | None = None,
    nvlink: bool = False,
    listeners: list[dict[str, Any]] | None = None,
    servers: list[dict[str, Any]] | None = None,
    learned: dict[str, Any] | None = None,
    deployments: dict[str, dict[str, Any]] | None = None,
    gpu_processes: dict[int, list[dict[str, int]]] | None = None,
    topology: list[list[int]] | None = None,
) -> HostFacts:
    """`deployments`: name -> its records on the host ({"state": ..., "lock": ...}); `gpu_processes`:
    GPU index -> [{pid, used_mib}] as NVML lists them; `topology`: [[i, j, level]] as the probe reports it."""
    name, cc, mem = gpu
    raw: dict[str, Any] = {
        "hostname": host,
        "user": "ops",
        "uid": 1000,
        "time": 1.0e9,
        "boot_time": 0,
        "clock_ticks": 100,
        "gpu": {
            "source": "nvml",
            "driver_version": "580.95.05",
            "cuda_version": "13.0",
            "topology": topology,
            "gpus": [
                {
                    "index": i,
                    "name": name,
                    "uuid": f"GPU-{i}",
                    "compute_capability": cc,
                    "memory_total_mib": mem,
                    "memory_used_mib": 0,
                    "temperature_c": 30,
                    "processes": (gpu_processes or {}).get(i, []),
                    "nvlink": nvlink,
                }
                for i in range(count)
            ],
        },
        "devices": {"device_files": [], "holders": []},
        "servers": servers or [],
        "listeners": listeners or [],
        "engines": {engine: {"python": f"/opt/{engine}/.venv/bin/python", "version": version, "packages": {}}},
        "disk": [{"path": "/models", "free_bytes": 10**12}, {"path": "/home/ops/.fleet/logs", "free_bytes": 10**11}],
        "state": {"learned": learned, "deployments": deployments or {}},
    }
    if model:
        files = model_files(model)
        raw["model"] = {"path": model_path or f"/models/{model}", "exists": True, "config_error": None, **files}
    return parse_facts(host, json.dumps(raw))
