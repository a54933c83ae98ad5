"""Facts recorded on a real GPU machine (one H200, driver 580.159.04; testbed/device-check.sh, docs/real-gpu.md):
what fleet's probe read there through NVML and through nvidia-smi, and what fleet makes of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import ROOT
from factsdata import model_files
from fleet.facts import HostFacts, gpu_mismatches, parse_facts
from fleet.inventory import ExpectedGpus, Host, HostSettings, load_playbook
from fleet.plan.build import build_plan

RECORDED = Path(__file__).resolve().parent / "data" / "real-h200"


def recorded(name: str, **extra: Any) -> HostFacts:
    raw = json.loads((RECORDED / f"facts-{name}.json").read_text())
    return parse_facts("gpu", json.dumps(raw | extra))


def test_nvml_and_nvidia_smi_agree_on_what_the_planner_uses() -> None:
    [nvml] = recorded("idle").gpus
    [smi] = recorded("nvidia-smi").gpus
    assert recorded("nvidia-smi").gpu_source == "nvidia-smi"
    assert (nvml.name, nvml.compute_capability, nvml.sm, nvml.memory_total_mib) == ("NVIDIA H200", "9.0", 90, 143771)
    assert (smi.name, smi.uuid, smi.compute_capability, smi.memory_total_mib) == (
        nvml.name,
        nvml.uuid,
        nvml.compute_capability,
        nvml.memory_total_mib,
    )
    # NVML's "used" counts the ~0.6 GiB the driver reserves; nvidia-smi's does not: idle, it says 0.
    assert smi.memory_used_mib == 0 and 0 < nvml.memory_used_mib < 1024


def test_an_h200_reports_row_remapping_not_page_retirement_and_no_nvlink_here() -> None:
    [gpu] = recorded("idle").gpus
    assert gpu.retired_pages_pending is None  # NotSupported from Ampere on
    assert (gpu.row_remap_pending, gpu.row_remap_failure) == (False, False)
    assert gpu.nvlink is False  # one GPU in a VM: link 0 answers NotSupported
    assert gpu.ecc_uncorrected == 0


def test_a_process_holding_the_gpu_is_seen_by_fuser_and_by_nvml_as_the_same_pid() -> None:
    busy = recorded("busy")
    [holder] = busy.holders
    [gpu] = busy.gpus
    assert [p.pid for p in gpu.processes] == [holder.pid]
    assert holder.engine is None and "torch" in holder.cmdline  # not an inference server: foreign
    assert gpu.processes[0].used_mib == 2566  # 2 GiB of tensors + the CUDA context


def test_the_inventory_expectation_is_checked_against_the_real_gpu() -> None:
    gpus = recorded("idle").gpus
    assert gpu_mismatches(ExpectedGpus(count=1, name_contains="H200", compute_capability="9.0"), gpus) == []
    wrong = gpu_mismatches(ExpectedGpus(count=8, name_contains="RTX PRO 6000", compute_capability="12.0"), gpus)
    assert [m.missing for m in wrong] == [True, False, False]


def test_qwen36_27b_plans_on_one_h200_with_its_mtp_head_and_no_error() -> None:
    path = "/models/Qwen3.6-27B"
    facts = recorded("idle", model={"path": path, "exists": True, "config_error": None, **model_files("Qwen3.6-27B")})
    host = Host("gpu", HostSettings(connection="local", engines={"sglang": "/opt/venv/bin/python"}), (), "x:1")
    result = build_plan(host, load_playbook("qwen36-27b", ROOT / "playbooks"), facts, path)
    assert result.errors == [] and result.plan is not None
    argv = result.plan.argv()
    assert argv[argv.index("--tp-size") + 1] == "1"
    assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN"
    assert result.gpus is not None and (result.gpus.count, result.gpus.sm, result.gpus.nvlink) == (1, 90, False)


def test_memory_shared_over_cuda_ipc_is_counted_once_under_the_process_that_allocated_it() -> None:
    """SGLang's weight cache daemon hands its weights to engines over CUDA IPC (issue 41). On the H200
    (testbed/device_ipc.py): a "daemon" allocated 4 GiB, an "engine" imported them and allocated 1 GiB.
    NVML counts the shared 4 GiB under the daemon only, so fleet's sum over processes is the GPU's use."""
    [gpu] = recorded("ipc").gpus
    [idle] = recorded("idle").gpus
    daemon, engine = sorted(gpu.processes, key=lambda p: -(p.used_mib or 0))
    assert (daemon.used_mib, engine.used_mib) == (4706, 1656)  # 4096 + its CUDA context; 1024 + its own
    assert abs(gpu.memory_used_mib - idle.memory_used_mib - (daemon.used_mib + engine.used_mib)) < 32
    assert sorted(h.pid for h in recorded("ipc").holders) == sorted([daemon.pid, engine.pid])
