"""`fleet facts` against simulated GPU hosts over a real sshd: one command execution, real-shaped data."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from conftest import BLACKWELL, CT129, Background, run_cli
from fleet_testbed import simhost

pytestmark = pytest.mark.ssh


def test_facts_of_blackwell_show_eight_sm120_gpus_in_one_round_trip(fleet_env: simhost.Sandbox) -> None:
    r = run_cli("facts", "--host", "blackwell", "--json", "--model", "Qwen3.5-397B-A17B-NVFP4")
    assert r.code == 0, r.err
    facts = json.loads(r.out)
    assert facts["round_trips"] == 1
    gpus = facts["gpu"]["gpus"]
    assert len(gpus) == 8
    assert {g["compute_capability"] for g in gpus} == {"12.0"}
    assert facts["gpu"]["source"] == "nvml"
    assert facts["engines"]["sglang"]["version"] == "0.5.11"
    assert facts["model"]["config"]["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert facts["model"]["quant_config"]["quantization"]["quant_algo"] == "NVFP4"
    assert facts["model"]["weights_bytes"] == 233_900_000_000


def test_facts_of_ct129_show_two_a6000(fleet_env: simhost.Sandbox) -> None:
    r = run_cli("facts", "--host", "ct129", "--json")
    facts = json.loads(r.out)
    assert [g["name"] for g in facts["gpu"]["gpus"]] == ["NVIDIA RTX A6000"] * 2
    assert facts["gpu"]["gpus"][0]["compute_capability"] == "8.6"
    assert facts["gpu"]["gpus"][0]["nvlink"] is False


def test_facts_fall_back_to_nvidia_smi_when_nvml_is_broken(fleet_env: simhost.Sandbox) -> None:
    through_nvml = json.loads(run_cli("facts", "--host", "ct129", "--json").out)["gpu"]["gpus"]
    simhost.set_host(fleet_env.host_dir("ct129"), nvml_broken=True)
    facts = json.loads(run_cli("facts", "--host", "ct129", "--json").out)
    assert facts["gpu"]["source"] == "nvidia-smi"
    assert "Driver Not Loaded" in facts["gpu"]["nvml_error"]
    assert len(facts["gpu"]["gpus"]) == 2
    assert facts["gpu"]["driver_version"] == "580.95.05"
    # as on a real idle H200: NVML counts the driver's reserved memory as used, nvidia-smi does not
    assert [g["memory_used_mib"] for g in through_nvml] == [615, 615]
    assert [g["memory_used_mib"] for g in facts["gpu"]["gpus"]] == [0, 0]


def test_missing_gpu_tools_are_reported_not_raised(fleet_env: simhost.Sandbox) -> None:
    simhost.set_host(fleet_env.host_dir("ct129"), nvml_broken=True, nvidia_smi_broken=True)
    r = run_cli("facts", "--host", "ct129", "--json")
    assert r.code == 0
    facts = json.loads(r.out)
    assert facts["gpu"]["gpus"] == []


def test_device_holders_are_listed_with_user_and_command(fleet_env: simhost.Sandbox) -> None:
    dev = fleet_env.host_dir("ct129") / "dev" / "nvidia0"
    with Background([*simhost.ssh_argv(fleet_env, CT129), f"exec 3<{dev}; exec sleep 30"]):
        for _ in range(50):
            facts = json.loads(run_cli("facts", "--host", "ct129", "--json").out)
            if facts["devices"]["holders"]:
                break
            time.sleep(0.1)
        assert [h["comm"] for h in facts["devices"]["holders"]] == ["sleep"]
        assert facts["devices"]["holders"][0]["user"] == "root"


def test_facts_of_one_host_do_not_see_processes_of_another(fleet_env: simhost.Sandbox) -> None:
    # an engine's shape (python -m sglang.launch_server) running a module that only sleeps
    mod = fleet_env.root / "fakemod" / "sglang"
    mod.mkdir(parents=True, exist_ok=True)
    (mod / "launch_server.py").write_text("import time\ntime.sleep(30)\n")
    fake_server = f"cd {mod.parent} && exec python3 -m sglang.launch_server"
    with Background([*simhost.ssh_argv(fleet_env, BLACKWELL), fake_server]):
        for _ in range(50):
            seen = [s["cmdline"] for s in json.loads(run_cli("facts", "--host", "blackwell", "--json").out)["servers"]]
            if seen == ["python3 -m sglang.launch_server"]:
                break
            time.sleep(0.1)
        assert seen == ["python3 -m sglang.launch_server"]
        assert json.loads(run_cli("facts", "--host", "ct129", "--json").out)["servers"] == []


def test_facts_warn_where_the_gpus_differ_from_what_the_inventory_expects(
    fleet_env: simhost.Sandbox, tmp_path: Path
) -> None:
    inventory = yaml.safe_load(fleet_env.inventory.read_text())
    expect = inventory["hosts"]["ct129"]
    expect["expected_gpus"] = {"count": 4, "name_contains": "RTX PRO 6000", "compute_capability": "12.0"}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(inventory))
    r = run_cli("-i", str(path), "facts", "--host", "ct129")
    assert r.code == 0 and "warning: inventory expects 4 GPUs, the host reports 2" in r.out
    warnings = json.loads(run_cli("-i", str(path), "facts", "--host", "ct129", "--json").out)["warnings"]
    assert warnings == [
        "inventory expects 4 GPUs, the host reports 2 (a GPU that fell off the bus is gone from NVML: "
        "look for Xid 79 in the kernel log)",
        'inventory expects GPUs named "*RTX PRO 6000*", the host reports NVIDIA RTX A6000',
        "inventory expects compute capability 12.0, the host reports 8.6",
    ]
    expect["expected_gpus"] = {"count": 2, "name_contains": "rtx a6000", "compute_capability": "8.6"}
    path.write_text(yaml.safe_dump(inventory))
    assert json.loads(run_cli("-i", str(path), "facts", "--host", "ct129", "--json").out)["warnings"] == []


def test_gpus_from_ampere_on_report_row_remapping_not_page_retirement(fleet_env: simhost.Sandbox) -> None:
    """As a real H200 does (docs/real-gpu.md): page retirement is NotSupported, row remapping answers."""
    gpu = json.loads(run_cli("facts", "--host", "ct129", "--json").out)["gpu"]["gpus"][0]
    assert gpu["retired_pages_pending"] is None
    assert gpu["row_remap_pending"] is False and gpu["row_remap_failure"] is False


def test_plan_and_facts_print_whole_lines_into_a_pipe(fleet_env: simhost.Sandbox) -> None:
    """Output read by grep or saved to a file is not folded at 80 columns (rich's default off a terminal)."""
    r = run_cli("plan", "qwen35-nvfp4", "--host", "ct129")
    assert r.code == 4
    first = r.out.splitlines()[0]
    assert first.startswith("qwen35-nvfp4 on ct129: Qwen3_5MoeForConditionalGeneration") and "GB weights" in first
    assert any(x.startswith("error [quant-capability]") and x.endswith("§1.7].") for x in r.out.splitlines())
    facts = run_cli("facts", "--host", "blackwell").out.splitlines()
    assert sum("│ NVIDIA RTX PRO 6000 Blackwell Workstation Edition │ 12.0 │" in x for x in facts) == 8


def test_credentials_on_command_lines_the_probe_reports_are_masked() -> None:
    """Another user's server started with `--api-key sk-...` holds a GPU: `fleet facts` names it, masked."""
    from fleet.facts import parse_facts

    proc = {"pid": 9, "ppid": 1, "pgid": 9, "uid": 1001, "user": "bob", "comm": "python", "start_ticks": 5}
    cmd = "python -m vllm.entrypoints.openai.api_server --api-key sk-bob-secret --port 8001"
    raw = {
        "servers": [dict(proc, cmdline=cmd, argv=cmd.split(), ports=[])],
        "devices": {"device_files": [], "method": "fuser", "holders": [dict(proc, cmdline=cmd, argv=cmd.split())]},
        "gpu": {"gpus": []},
        "state": {},
    }
    facts = parse_facts("h", json.dumps(raw))
    shown = json.dumps(facts.raw) + repr(facts)
    assert "sk-bob-secret" not in shown and "--api-key ***" in shown


def test_a_deployment_record_is_read_once_into_typed_fields_and_a_damaged_field_reads_as_not_recorded() -> None:
    """fleet.facts.recorded: the one place a record's fields are read by name. A record is text on the
    host (edited, cut short, an older fleet's): a field of another type is "not recorded", never a crash
    in status, placement or a restart."""
    from fleet.facts.recorded import Recorded, parse_recorded

    good = {
        "status": "ready",
        "pid": 41,
        "pgid": 41,
        "port": 30000,
        "ports": [30000, 30100],
        "gpus": [2, 3],
        "playbook": "qwen36-27b",
        "plan": {"argv": ["python3", "-m", "sglang.launch_server"]},
        "attempt": 2,
        "applied_fixes": ["graph-oom"],
        "weight_cache": {"pgid": 77},
        "ready_timeout_s": 1800,
    }
    r = parse_recorded(good)
    assert (r.status, r.pid, r.port, r.ports, r.gpus, r.attempts) == ("ready", 41, 30000, (30000, 30100), (2, 3), 2)
    assert r.argv == ["python3", "-m", "sglang.launch_server"] and r.cache_group == 77
    assert r.applied_fixes == ("graph-oom",) and r.ready_timeout_s == 1800.0
    assert r.raw == good and r.raw is not good, "what fleet sends back whole is the record as read"
    damaged = {
        "status": ["ready"],
        "pid": True,
        "pgid": "41",
        "port": 30000.5,
        "gpus": "all",
        "plan": "argv",
        "group": [1],
        "weight_cache": {"pgid": 1},
        "applied_fixes": "graph-oom",
        "ready_timeout_s": False,
    }
    bad = parse_recorded(damaged)
    assert bad == Recorded(weight_cache={"pgid": 1}), bad  # a group id of 1 (init) names no daemon
    assert bad.argv == [] and bad.cache_group is None and bad.ports == ()
    # an empty record and no record read alike
    assert parse_recorded({}) == Recorded()
