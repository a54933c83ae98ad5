"""What the GPUs' own reports turn into: the inventory's expected_gpus against the host, and memory faults
(page retirement before Ampere, row remapping from Ampere on) as hardware problems a restart cannot heal."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factsdata import RTX_A6000, RTX_PRO_6000, facts
from fleet.facts import HostFacts, gpu_mismatches
from fleet.health import CRITICAL, OK, WARNING, evaluate
from fleet.inventory import ExpectedGpus

BLACKWELL_BOX = ExpectedGpus(count=8, name_contains="RTX PRO 6000", compute_capability="12.0")


def test_a_host_that_matches_its_expectation_has_no_mismatch() -> None:
    assert gpu_mismatches(BLACKWELL_BOX, facts("blackwell", RTX_PRO_6000, 8).gpus) == []
    assert gpu_mismatches(None, facts("blackwell", RTX_A6000, 1).gpus) == []
    lower_case = ExpectedGpus(count=8, name_contains="rtx pro 6000")
    assert gpu_mismatches(lower_case, facts("blackwell", RTX_PRO_6000, 8).gpus) == []


def test_fewer_gpus_than_expected_is_flagged_missing_more_is_not() -> None:
    [fewer] = gpu_mismatches(BLACKWELL_BOX, facts("blackwell", RTX_PRO_6000, 7).gpus)
    assert fewer.missing and fewer.message.startswith("inventory expects 8 GPUs, the host reports 7 (")
    [more] = gpu_mismatches(ExpectedGpus(count=2), facts("ct129", RTX_A6000, 4).gpus)
    assert not more.missing and more.message == "inventory expects 2 GPUs, the host reports 4"


def test_every_gpu_is_compared_not_only_the_first() -> None:
    f = facts("mixed", RTX_PRO_6000, 2)
    mixed = replace(f, gpus=(f.gpus[0], replace(f.gpus[1], name="NVIDIA RTX A6000", compute_capability="8.6")))
    messages = [
        m.message
        for m in gpu_mismatches(ExpectedGpus(count=2, name_contains="RTX PRO", compute_capability="12.0"), mixed.gpus)
    ]
    assert messages == [
        'inventory expects GPUs named "*RTX PRO*", the host reports NVIDIA RTX A6000',
        "inventory expects compute capability 12.0, the host reports 8.6",
    ]


def _with_gpu0(f: HostFacts, **fault: object) -> HostFacts:
    return replace(f, gpus=(replace(f.gpus[0], **fault), *f.gpus[1:]))


@pytest.mark.parametrize(
    ("fault", "check", "detail"),
    [
        ({"retired_pages_pending": True}, "gpu0 retired_pages", "page retirement pending (reset the GPU)"),
        ({"row_remap_pending": True}, "gpu0 row_remap", "row remapping pending (reset the GPU)"),
        (
            {"row_remap_failure": True},
            "gpu0 row_remap",
            "row remapping failed: no spare rows left (the GPU needs service)",
        ),
    ],
)
def test_memory_faults_are_critical_hardware_problems(fault: dict[str, object], check: str, detail: str) -> None:
    healthy = evaluate("ct129", {}, facts("ct129", RTX_A6000, 2), None)
    assert healthy.status == OK and not healthy.hardware_fault
    sick = evaluate("ct129", {}, _with_gpu0(facts("ct129", RTX_A6000, 2), **fault), None)
    found = {c.name: c for c in sick.checks}[check]
    assert (found.status, found.detail, found.hardware) == (CRITICAL, detail, True)
    assert sick.status == CRITICAL and sick.hardware_fault and not sick.healable


def test_health_reports_a_missing_gpu_as_hardware_and_other_mismatches_as_warnings() -> None:
    missing = evaluate("blackwell", {}, facts("blackwell", RTX_PRO_6000, 7), None, expected_gpus=BLACKWELL_BOX)
    gpus = {c.name: c for c in missing.checks}["gpus"]
    assert (gpus.status, gpus.hardware) == (CRITICAL, True) and missing.hardware_fault
    wrong_model = evaluate("blackwell", {}, facts("blackwell", RTX_A6000, 8), None, expected_gpus=BLACKWELL_BOX)
    assert [(c.status, c.hardware) for c in wrong_model.checks if c.name == "gpus"] == [(WARNING, False)] * 2
    assert wrong_model.status == WARNING


def test_gpus_that_cannot_be_read_are_never_an_ok_host() -> None:
    """No GPU data means no GPU check ran: a driver that does not answer is critical hardware (not healed);
    a host without NVML or nvidia-smi installed is a warning; neither reads as "expects 8, reports 0"."""
    box = facts("blackwell", RTX_PRO_6000, 8)
    driver_gone = replace(
        box, gpus=(), gpu_source="none", gpu_error="no NVML (NVMLError: Driver Not Loaded) and no nvidia-smi"
    )
    sick = evaluate("blackwell", {}, driver_gone, None, expected_gpus=BLACKWELL_BOX)
    [gpus] = [c for c in sick.checks if c.name == "gpus"]
    assert (gpus.status, gpus.hardware) == (CRITICAL, True) and gpus.detail.startswith("cannot read the GPUs: no NVML")
    no_tools = replace(
        driver_gone,
        gpu_error="no NVML (ModuleNotFoundError: No module named 'pynvml') and no nvidia-smi",
        gpu_tools_missing=True,  # what the probe says when nothing that reads GPUs is installed
    )
    unobservable = evaluate("blackwell", {}, no_tools, None)
    assert [(c.status, c.hardware) for c in unobservable.checks if c.name == "gpus"] == [(WARNING, False)]


def test_a_gpu_fault_blocks_healing_only_the_deployment_placed_on_that_gpu() -> None:
    """Two crashed deployments; uncorrectable ECC errors on GPU 7, where only `small` runs: `big` on GPUs
    0-3 may be restarted, `small` may not (a restart cannot fix its GPU)."""
    crashed = {"status": "ready", "pid": 4242, "pgid": 4242, "plan": {"argv": ["python"]}}
    f = facts(
        "blackwell",
        RTX_PRO_6000,
        8,
        deployments={
            "big": {"state": {**crashed, "gpus": [0, 1, 2, 3]}},
            "small": {"state": {**crashed, "gpus": [6, 7]}},
        },
    )
    broken = replace(f, gpus=(*f.gpus[:7], replace(f.gpus[7], ecc_uncorrected=3)))
    health = evaluate("blackwell", {}, broken, None)
    assert health.status == CRITICAL and health.healable == ("big",)
    fault = next(c for c in health.checks if c.name == "gpu7 ecc")
    assert fault.hardware and fault.gpu == 7
    assert evaluate("blackwell", {}, f, None).healable == ("big", "small")


def test_health_names_the_deployments_meant_to_serve_not_the_stopped_ones() -> None:
    """A stopped deployment's record stays on the host (its history); health says what should be serving."""
    serving = {"status": "ready", "pid": 4242, "pgid": 4242, "plan": {"argv": ["python"]}, "gpus": [0, 1]}
    f = facts(
        "blackwell",
        RTX_PRO_6000,
        8,
        deployments={"big": {"state": serving}, "old": {"state": {"status": "stopped", "gpus": [2, 3]}}},
    )
    assert evaluate("blackwell", {}, f, None).playbook == "big"
    nothing = facts("blackwell", RTX_PRO_6000, 8, deployments={"old": {"state": {"status": "stopped"}}})
    assert evaluate("blackwell", {}, nothing, None).playbook is None


@pytest.mark.parametrize(
    ("generation", "status"),
    [
        ({"ok": True, "status": 200, "text": " Paris."}, WARNING),  # answered a real prompt in this check
        ({"skipped": "served traffic since the last check", "serving": True}, WARNING),  # proved, and serving
        # no prompt was asked (the sweep asks one first when it can): the log alone condemns nothing
        ({"skipped": "--skip-generation"}, WARNING),
        ({"ok": False, "status": 500, "text": "scheduler is dead"}, CRITICAL),  # it was asked, and failed
    ],
    ids=["answered", "serving-traffic", "not-asked", "asked-and-failed"],
)
def test_a_crash_line_in_the_log_heals_only_a_server_nothing_shows_serving(generation: dict, status: str) -> None:
    """Log text alone (forged through a request, or stale) never restarts a server that is serving: one
    whose prompt was skipped because it served traffic since it was last proved has answered too; only a
    prompt that failed (or a server that does not answer at all) makes the crash line critical."""
    from fleet.crashes import diagnose

    serving = {"status": "ready", "pid": 4242, "pgid": 4242, "plan": {"argv": ["python"]}, "served_name": "m"}
    f = facts("ct129", RTX_A6000, 2, deployments={"m": {"state": serving}})
    server = {"alive": True, "pid": 4242, "group_pids": [4242], "port": 30000, "ports": [30000]}
    http = {"health": {"status": 200}, "models": {"status": 200, "ids": ["m"]}, "generation": generation}
    raw = {"deployments": {"m": {"server": server, "http": http}}}
    crash = diagnose(["RuntimeError: CUDA error: an illegal memory access was encountered"])
    health = evaluate("ct129", raw, f, {"m": crash})  # type: ignore[arg-type]
    assert {c.name: c.status for c in health.checks}["crash_log"] == status
    assert health.healable == (() if status == WARNING else ("m",))
