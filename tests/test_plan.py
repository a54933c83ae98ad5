"""The planner: golden command lines for the motivating deployments, each rule firing and not firing,
user flags winning (but flagged), learned fixes applied, and pre-flight refusals."""

from __future__ import annotations

import os
import shlex
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from conftest import ROOT
from factsdata import B200, RTX_A6000, RTX_PRO_6000, facts
from fleet.inventory import Host, NamedPlaybook, load_inventory, load_playbook
from fleet.plan import KNOWN_CRASHES, SGLANG_RULES, Fix, apply_fix, args_dict, spell
from fleet.plan.build import PlanResult, build_plan

GOLDEN = Path(__file__).resolve().parent / "golden"
INVENTORY = load_inventory(ROOT / "inventory" / "hosts.yaml")


def host(name: str) -> Host:
    return INVENTORY.hosts[name]


def playbook(name: str, **changes: object) -> NamedPlaybook:
    pb = load_playbook(name, ROOT / "playbooks")
    return replace(pb, spec=msgspec.structs.replace(pb.spec, **changes)) if changes else pb


BLACKWELL_GPUS = (RTX_PRO_6000, 8)
CT129_GPUS = (RTX_A6000, 2)


def plan(
    pb: NamedPlaybook, host_name: str, gpus: tuple, version: str = "0.5.11", engine: str = "sglang", **kw: object
) -> PlanResult:
    model = {"Qwen3.5-397B-A17B-NVFP4": "Qwen3.5-397B-A17B-NVFP4", "Qwen3.6-27B": "Qwen3.6-27B"}[pb.spec.model]
    f = facts(host_name, gpus[0], gpus[1], engine=engine, version=version, model=model, **kw)  # type: ignore[arg-type]
    return build_plan(host(host_name), pb, f, f"/models/{model}")


def golden(name: str, result: PlanResult) -> None:
    """Compare the whole command line, each flag's rule and reason, and the environment with
    tests/golden/NAME.txt (UPDATE_GOLDEN=1 rewrites it)."""
    assert result.plan is not None
    lines = [shlex.join(result.plan.argv()[:3]), *(shlex.join(f.words()) for f in result.plan.flags)]
    text = " \\\n  ".join(lines) + "\n# env: " + " ".join(f"{e.name}={e.value}" for e in result.plan.env) + "\n"
    text += "".join(f"# {f.name}: {f.rule}: {f.reason}\n" for f in result.plan.flags)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"plan differs from {path} (UPDATE_GOLDEN=1 rewrites it)"


def test_golden_qwen35_nvfp4_on_blackwell_sglang_0511() -> None:
    r = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS)
    assert not r.errors
    a = args_dict(r.plan.engine_args())  # type: ignore[union-attr]
    assert a["--tp-size"] == "8"
    assert (
        a["--speculative-algorithm"],
        a["--speculative-num-steps"],
        a["--speculative-eagle-topk"],
        a["--speculative-num-draft-tokens"],
    ) == ("NEXTN", "1", "1", "2")
    assert a["--mamba-scheduler-strategy"] == "extra_buffer" and "--mamba-radix-cache-strategy" not in a
    assert (a["--moe-runner-backend"], a["--fp4-gemm-backend"]) == ("flashinfer_cutlass", "flashinfer_cudnn")
    assert any(v.rule == "quantization" and "NVFP4" in v.message for v in r.verdicts)
    assert not [v for v in r.verdicts if v.level == "crash"]
    golden("qwen35-nvfp4-blackwell-sglang-0.5.11", r)


def test_golden_qwen35_nvfp4_on_blackwell_sglang_0523_uses_the_renamed_flag() -> None:
    r = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS, version="0.5.23")
    a = args_dict(r.plan.engine_args())  # type: ignore[union-attr]
    assert a["--mamba-radix-cache-strategy"] == "extra_buffer" and "--mamba-scheduler-strategy" not in a
    assert "SGLANG_ENABLE_SPEC_V2" not in {e.name for e in r.plan.env}  # type: ignore[union-attr]
    golden("qwen35-nvfp4-blackwell-sglang-0.5.23", r)


def test_golden_qwen36_27b_on_ct129_sglang_0511() -> None:
    r = plan(playbook("qwen36-27b"), "ct129", CT129_GPUS)
    assert not r.errors
    a = args_dict(r.plan.engine_args())  # type: ignore[union-attr]
    assert a["--tp-size"] == "2" and a["--speculative-num-steps"] == "1"
    assert a["--mamba-scheduler-strategy"] == "extra_buffer"
    assert not {
        "--moe-runner-backend",
        "--fp4-gemm-backend",
        "--attention-backend",
        "--disable-custom-all-reduce",
    } & set(a)
    golden("qwen36-27b-ct129-sglang-0.5.11", r)


@pytest.mark.parametrize(
    ("pb_name", "host_name", "gpus", "tp"),
    [("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS, "8"), ("qwen36-27b", "ct129", CT129_GPUS, "2")],
)
def test_golden_vllm_plans_use_mtp_speculative_config(pb_name: str, host_name: str, gpus: tuple, tp: str) -> None:
    r = plan(playbook(pb_name, engine="vllm"), host_name, gpus, version="0.33.0", engine="vllm")
    assert r.plan is not None and r.plan.module() == "vllm.entrypoints.openai.api_server"
    a = args_dict(r.plan.engine_args())
    assert a["--tensor-parallel-size"] == tp
    assert a["--speculative-config"] == '{"method":"mtp","num_speculative_tokens":1}'
    golden(f"{pb_name}-{host_name}-vllm-0.33.0", r)


def test_qwen35_nvfp4_on_ct129_is_refused_in_preflight_on_0511() -> None:
    r = plan(playbook("qwen35-nvfp4"), "ct129", CT129_GPUS)
    messages = [v.message for v in r.errors]
    assert (
        "qwen35-nvfp4 on ct129: NVFP4 needs compute capability >= 10.0 before SGLang 0.5.23 (ModelOptFp4Config's "
        "minimum is 100); pick a Blackwell host, or SGLang >= 0.5.23 (Marlin, slow); NVIDIA RTX A6000 is 8.6, "
        "sglang 0.5.11 [0.5.11 srt/layers/quantization/modelopt_quant.py L1141; engines.md §1.7]."
    ) in messages
    assert any(m.startswith("qwen35-nvfp4 on ct129: weights need 108.9 GiB per GPU at TP 2") for m in messages)


def test_nvfp4_on_ampere_with_0523_is_a_slow_warning_not_a_capability_refusal() -> None:
    r = plan(playbook("qwen35-nvfp4"), "ct129", CT129_GPUS, version="0.5.23")
    assert [v.rule for v in r.errors] == ["fit"]
    assert any(v.level == "warning" and "Marlin" in v.message for v in r.verdicts)


RULE_CASES = [
    # rule id, (playbook, host, gpus, version, overrides), fires?
    ("speculative-mtp", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {}), True),
    ("speculative-mtp", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {"speculative": None}), False),
    ("hybrid-extra-buffer-old", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {}), True),
    # without NEXTN too: no_buffer would turn the overlap scheduler off
    ("hybrid-extra-buffer-old", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {"speculative": None}), True),
    ("hybrid-extra-buffer-old", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.14", {}), False),
    ("hybrid-spec-extra-buffer", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.14", {}), True),
    ("hybrid-spec-extra-buffer", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {}), False),
    ("sm120-nvfp4-moe-runner", ("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS, "0.5.11", {}), True),
    ("sm120-nvfp4-moe-runner", ("qwen35-nvfp4", "blackwell", (B200, 8), "0.5.11", {}), False),
    ("sm120-nvfp4-fp4-gemm", ("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS, "0.5.11", {}), True),
    ("sm120-nvfp4-fp4-gemm", ("qwen36-27b", "blackwell", BLACKWELL_GPUS, "0.5.11", {}), False),
    # keyed on SGLang's own pick: 0.5.11 and 0.5.23 pick flashinfer on SM120 themselves, which works there;
    # a version fleet has no pick for gets it written down
    ("hybrid-sm120-attention", ("qwen36-27b", "blackwell", BLACKWELL_GPUS, "0.5.11", {}), False),
    ("hybrid-sm120-attention", ("qwen36-27b", "blackwell", BLACKWELL_GPUS, "0.5.23", {}), False),
    ("hybrid-sm120-attention", ("qwen36-27b", "blackwell", BLACKWELL_GPUS, "0.5.16", {}), True),
    ("hybrid-sm120-attention", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {}), False),
    # SM100: SGLang's own default (trtllm_mha, in the allow-list) is not overridden
    ("hybrid-sm120-attention", ("qwen36-27b", "blackwell", (B200, 8), "0.5.23", {}), False),
    ("pcie-custom-all-reduce", ("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS, "0.5.11", {}), True),
    ("pcie-custom-all-reduce", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {}), False),
    ("cuda-graph-max-bs", ("qwen36-27b", "ct129", CT129_GPUS, "0.5.11", {"extra_args": []}), False),
]

VLLM_RULE_CASES = [
    ("sm120-nvfp4-moe-backend", ("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS, "0.33.0"), True),
    ("sm120-nvfp4-moe-backend", ("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS, "0.32.0"), True),
    ("sm120-nvfp4-moe-backend", ("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS, "0.31.0"), False),  # not checked
    ("sm120-nvfp4-moe-backend", ("qwen35-nvfp4", "blackwell", (B200, 8), "0.33.0"), False),  # SM100: auto works
    ("sm120-nvfp4-moe-backend", ("qwen36-27b", "blackwell", BLACKWELL_GPUS, "0.33.0"), False),  # dense, BF16
]


@pytest.mark.parametrize(
    ("rule", "case", "fires"),
    VLLM_RULE_CASES,
    ids=[f"{r}-{'fires' if f else 'quiet'}-{c[3]}-{c[1]}" for r, c, f in VLLM_RULE_CASES],
)
def test_each_vllm_rule_fires_only_when_it_should(rule: str, case: tuple, fires: bool) -> None:
    pb_name, host_name, gpus, version = case
    r = plan(playbook(pb_name, engine="vllm"), host_name, gpus, version=version, engine="vllm")
    assert r.plan is not None
    assert (rule in {f.rule for f in r.plan.flags}) is fires


@pytest.mark.parametrize(
    ("rule", "case", "fires"),
    RULE_CASES,
    ids=[f"{r}-{'fires' if f else 'quiet'}-{c[3]}-{c[1]}" for r, c, f in RULE_CASES],
)
def test_each_rule_fires_only_when_it_should(rule: str, case: tuple, fires: bool) -> None:
    pb_name, host_name, gpus, version, overrides = case
    r = plan(playbook(pb_name, **overrides), host_name, gpus, version=version)
    assert r.plan is not None
    assert (rule in {f.rule for f in r.plan.flags}) is fires


def test_the_speculative_flags_come_all_three_or_none() -> None:
    for steps in (1, 3):
        from fleet.inventory import Speculative

        r = plan(playbook("qwen36-27b", speculative=Speculative(steps=steps)), "ct129", CT129_GPUS)
        a = args_dict(r.plan.engine_args())  # type: ignore[union-attr]
        assert a["--speculative-num-draft-tokens"] == str(steps + 1)
        assert {"--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"} <= set(a)


def test_pcie_rule_does_not_fire_with_nvlink() -> None:
    r = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS, nvlink=True)
    assert "--disable-custom-all-reduce" not in r.plan.engine_args()  # type: ignore[union-attr]


def test_user_flags_win_but_known_crashes_are_flagged() -> None:
    r = plan(playbook("qwen35-nvfp4-handwritten"), "blackwell", BLACKWELL_GPUS)
    a = args_dict(r.plan.engine_args())  # type: ignore[union-attr]
    assert "--speculative-num-steps" not in a and a["--speculative-num-draft-tokens"] == "2"
    crashes = {v.rule for v in r.verdicts if v.level == "crash"}
    assert crashes == {"spec-params-incomplete", "hybrid-spec-no-buffer"}


def test_a_user_flag_replaces_the_derived_one_in_place() -> None:
    r = plan(
        playbook("qwen35-nvfp4", extra_args=["--tp", "4", "--moe-runner-backend", "flashinfer_cutedsl"]),
        "blackwell",
        BLACKWELL_GPUS,
    )
    a = args_dict(r.plan.engine_args())  # type: ignore[union-attr]
    assert a["--tp-size"] == "4" and "--tp" not in a
    assert a["--moe-runner-backend"] == "flashinfer_cutedsl"
    assert "sm120-nvfp4-cutedsl-garbage" in {v.rule for v in r.verdicts if v.level == "crash"}


def test_learned_fixes_are_applied_and_named() -> None:
    key = "blackwell|/models/Qwen3.5-397B-A17B-NVFP4|sglang|0.5.11"
    learned = {
        key: [
            {
                "signature": "sglang-spec-params-incomplete",
                "learned_at": "2026-11-29 10:00:00",
                "fix": Fix(derive="speculative_num_steps").to_json(),
            }
        ]
    }
    r = plan(playbook("qwen35-nvfp4-handwritten"), "blackwell", BLACKWELL_GPUS, learned=learned)
    assert r.plan is not None and r.plan.applied_fixes == ("sglang-spec-params-incomplete",)
    assert args_dict(r.plan.engine_args())["--speculative-num-steps"] == "1"
    assert "spec-params-incomplete" not in {v.rule for v in r.verdicts}


def test_learned_fixes_are_kept_per_gpu_model_and_older_keys_read_as_this_ones() -> None:
    fix = [{"signature": "sglang-spec-params-incomplete", "learned_at": "-", "fix": Fix(derive="x").to_json()}]
    base = "blackwell|/models/Qwen3.5-397B-A17B-NVFP4|sglang|0.5.11"
    gpu = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
    r = plan(playbook("qwen35-nvfp4-handwritten"), "blackwell", BLACKWELL_GPUS, learned={f"{base}|NVIDIA B200": fix})
    assert r.plan is not None and r.plan.applied_fixes == () and r.learned_key == f"{base}|{gpu}"
    r = plan(playbook("qwen35-nvfp4-handwritten"), "blackwell", BLACKWELL_GPUS, learned={f"{base}|{gpu}": fix})
    assert r.plan is not None and r.plan.applied_fixes == ("sglang-spec-params-incomplete",)


def test_learned_fixes_of_another_engine_version_are_not_applied() -> None:
    key = "blackwell|/models/Qwen3.5-397B-A17B-NVFP4|sglang|0.5.10"
    learned = {key: [{"signature": "x", "learned_at": "-", "fix": Fix(derive="speculative_num_steps").to_json()}]}
    r = plan(playbook("qwen35-nvfp4-handwritten"), "blackwell", BLACKWELL_GPUS, learned=learned)
    assert r.plan is not None and r.plan.applied_fixes == ()


def test_fixes_are_spelled_for_the_engine_version() -> None:
    r = plan(playbook("qwen36-27b", speculative=None), "ct129", CT129_GPUS, version="0.5.23")
    fixed = apply_fix(r.plan, Fix(set_flags=(("--mamba-scheduler-strategy", "extra_buffer"),)), "x", "y")  # type: ignore[arg-type]
    assert args_dict(fixed.engine_args())["--mamba-radix-cache-strategy"] == "extra_buffer"
    assert spell("--cuda-graph-max-bs", (0, 5, 20)) == "--cuda-graph-max-bs-decode"
    assert spell("--cuda-graph-max-bs", (0, 5, 13)) == "--cuda-graph-max-bs"


def test_respell_fix_renames_old_flags_keeping_values() -> None:
    r = plan(
        playbook("qwen36-27b", extra_args=["--mamba-scheduler-strategy", "extra_buffer", "--cuda-graph-max-bs", "32"]),
        "ct129",
        CT129_GPUS,
        version="0.5.23",
    )
    assert {"old-mamba-flag", "ambiguous-cuda-graph-flag"} <= {v.rule for v in r.verdicts if v.level == "crash"}
    fixed = apply_fix(r.plan, Fix(derive="respell_renamed_flags"), "respell", "why")  # type: ignore[arg-type]
    a = args_dict(fixed.engine_args())
    assert a["--mamba-radix-cache-strategy"] == "extra_buffer" and a["--cuda-graph-max-bs-decode"] == "32"
    assert "--mamba-scheduler-strategy" not in a and "--cuda-graph-max-bs" not in a


def test_port_held_by_a_non_server_is_refused() -> None:
    r = plan(
        playbook("qwen36-27b"), "ct129", CT129_GPUS, listeners=[{"address": "0.0.0.0", "port": 30000, "pid": 4242}]
    )
    assert [v.rule for v in r.errors] == ["port-held"]
    assert "port 30000 is held by pid 4242" in r.errors[0].message


def test_port_held_by_an_inference_server_is_not_refused() -> None:
    server = {
        "pid": 4242,
        "ppid": 1,
        "pgid": 4242,
        "uid": 1000,
        "user": "ops",
        "comm": "python",
        "cmdline": "python -m sglang.launch_server --port 30000",
        "ports": [{"address": "0.0.0.0", "port": 30000}],
    }
    r = plan(
        playbook("qwen36-27b"),
        "ct129",
        CT129_GPUS,
        listeners=[{"address": "0.0.0.0", "port": 30000, "pid": 4242}],
        servers=[server],
    )
    assert not r.errors


def test_every_rule_and_known_crash_has_a_reason() -> None:
    assert all(rule.reason for rule in SGLANG_RULES)
    assert all(k.message for k in KNOWN_CRASHES)


def test_derived_plans_never_trip_a_known_crash() -> None:
    for pb_name, host_name, gpus in (
        ("qwen35-nvfp4", "blackwell", BLACKWELL_GPUS),
        ("qwen36-27b", "ct129", CT129_GPUS),
        ("qwen36-27b", "blackwell", BLACKWELL_GPUS),
    ):
        for version in ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.15", "0.5.20", "0.5.23"):
            r = plan(playbook(pb_name), host_name, gpus, version=version)
            assert not [v for v in r.verdicts if v.level == "crash"], (pb_name, version)


def test_golden_a_deployment_placed_beside_another_on_blackwell() -> None:
    """CUDA_VISIBLE_DEVICES and PCI bus order for its GPUs, TP from their count, its own NCCL port."""
    f = facts("blackwell", BLACKWELL_GPUS[0], BLACKWELL_GPUS[1], model="Qwen3.6-27B")
    r = build_plan(host("blackwell"), playbook("qwen36-27b"), f, "/models/Qwen3.6-27B", gpu_indices=(6, 7), port=30010)
    golden("qwen36-27b-blackwell-gpus-6-7-sglang-0.5.11", r)
    assert not r.errors


def test_memory_someone_else_uses_on_the_deployments_gpus_is_a_warning_before_anything_stops() -> None:
    busy = {6: [{"pid": 900, "used_mib": 20480}]}
    f = facts("blackwell", BLACKWELL_GPUS[0], BLACKWELL_GPUS[1], model="Qwen3.6-27B", gpu_processes=busy)
    on_it = build_plan(host("blackwell"), playbook("qwen36-27b"), f, "/models/Qwen3.6-27B", gpu_indices=(6, 7))
    said = [v.message for v in on_it.verdicts if v.rule == "gpu-memory-used"]
    assert said == [
        "qwen36-27b on blackwell: GPU 6 has 20.0 GiB in use by pid 900, not an engine fleet stops; the launch "
        "is refused while it runs (or pass --force)."
    ]
    beside = build_plan(host("blackwell"), playbook("qwen36-27b"), f, "/models/Qwen3.6-27B", gpu_indices=(0, 1))
    assert not [v for v in beside.verdicts if v.rule == "gpu-memory-used"]


def test_a_placed_vllm_server_starts_its_internal_ports_from_its_http_port() -> None:
    f = facts("blackwell", BLACKWELL_GPUS[0], BLACKWELL_GPUS[1], engine="vllm", version="0.33.0", model="Qwen3.6-27B")
    pb = playbook("qwen36-27b", engine="vllm")
    placed = build_plan(host("blackwell"), pb, f, "/models/Qwen3.6-27B", gpu_indices=(6, 7), port=30010)
    assert placed.plan is not None
    env = {e.name: e.value for e in placed.plan.env}
    assert env["VLLM_PORT"] == "40010" and env["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert placed.plan.flag("--nccl-port") is None  # SGLang's flag, not vLLM's
    whole = build_plan(host("blackwell"), pb, f, "/models/Qwen3.6-27B")
    assert whole.plan is not None and "VLLM_PORT" not in {e.name for e in whole.plan.env}


def test_an_upgrade_preview_shows_the_renamed_flag_and_its_rule() -> None:
    from fleet.plan.diff import plan_diff, versions

    now = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS, version="0.5.11").plan
    then = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS, version="0.5.23").plan
    assert now is not None and then is not None
    lines = plan_diff(now, then)
    assert versions(now, then) == "sglang 0.5.11 -> 0.5.23"
    assert "- --mamba-scheduler-strategy extra_buffer" in "\n".join(lines)
    assert any(line.startswith("+ --mamba-radix-cache-strategy extra_buffer  (") for line in lines)
    assert plan_diff(now, now) == []


def test_every_rule_names_the_engine_default_it_replaces_and_fleet_plan_shows_it() -> None:
    from fleet.plan.rules import VLLM_RULES

    # a keyed rule says what it replaces from the engine's own pick (fleet.plan.picks), the others in words
    assert all(r.replaces or r.keyed_on for r in (*SGLANG_RULES, *VLLM_RULES)), [
        r.id for r in SGLANG_RULES if not r.replaces
    ]
    r = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS)
    assert r.plan is not None
    assert all(f.replaces for f in r.plan.flags if f.rule in {x.id for x in SGLANG_RULES})
    moe = next(f for f in r.plan.flags if f.name == "--moe-runner-backend")
    assert "SGLang's own MoE runner auto, which becomes flashinfer_trtllm at model load" in moe.replaces
    assert "which fails here" in moe.replaces and "SM100/SM103/SM110" in moe.replaces
    assert r.plan.to_json()["flags"][-1]["replaces"] == r.plan.flags[-1].replaces


def test_an_upgrade_preview_names_the_engine_defaults_that_change_between_the_two_versions() -> None:
    from fleet.plan.defaults import DEFAULTS, default_changes

    lines = default_changes("sglang", (0, 5, 11), (0, 5, 23))
    said = "\n".join(lines)
    assert "~ default mamba strategy" in said and "auto resolves to no_buffer" in said and "extra_buffer" in said
    assert "~ default SGLANG_ENABLE_SPEC_V2: True" in said and "not read any more" in said
    assert "~ default --fp4-gemm-backend: auto selects flashinfer_cudnn on SM120" in said
    assert "~ default --cuda-graph-max-bs: a flag of its own" in said and "ambiguous" in said
    assert all("engines.md" in line for line in lines)  # each with its source
    assert default_changes("sglang", (0, 5, 23), (0, 5, 23)) == []
    assert default_changes("sglang", (0, 5, 15), (0, 5, 16)) == []  # no entry covers one side: nothing said
    assert default_changes("vllm", (0, 5, 11), (0, 5, 23)) == []
    for d in DEFAULTS:  # every entry a real range with a source
        assert d.first <= d.last and d.source.startswith("engines.md")


MINIMAX_M2 = {  # the shape of MiniMaxAI/MiniMax-M2's config.json; it declares MTP modules under its own key
    "architectures": ["MiniMaxM2ForCausalLM"],
    "model_type": "minimax_m2",
    "hidden_size": 3072,
    "num_hidden_layers": 62,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_local_experts": 256,
    "num_experts_per_tok": 8,
    "vocab_size": 200064,
    "max_position_embeddings": 196608,
    "torch_dtype": "bfloat16",
    "num_mtp_modules": 3,
}


@pytest.mark.parametrize("mtp_keys", [{}, {"num_nextn_predict_layers": 1}])
@pytest.mark.parametrize("version", [(0, 5, 11), (0, 5, 23)])
def test_speculative_decoding_is_skipped_for_the_true_reason_sglang_has_no_draft_for_it(
    mtp_keys: dict[str, int], version: tuple[int, int, int]
) -> None:
    """SGLang drafts NEXTN only for the architectures its ModelConfig maps to a draft class (fleet.plan.drafts).
    MiniMax-M2 has none in either version: skipped, and said so, even where its config names MTP layers in a
    key fleet reads (before, fleet planned NEXTN on such a model and the engine would load the whole model as
    its draft)."""
    from fleet.model import parse_model_spec
    from fleet.plan import GpuSummary, Wishes, plan_launch

    model = parse_model_spec("/m", {**MINIMAX_M2, **mtp_keys}, None, 230 << 30)
    gpus = GpuSummary("NVIDIA H100", 8, 90, 81559, True)
    wishes = Wishes(engine="sglang", served_name="m", port=30000, speculative=True)
    p = plan_launch(model=model, gpus=gpus, engine_version=version, python="python3", wishes=wishes)
    assert "--speculative-algorithm" not in p.engine_args()
    [said] = [v.message for v in p.verdicts if v.rule == "speculative-mtp"]
    assert said.startswith(f"SGLang {'.'.join(map(str, version))} has no NEXTN draft model for MiniMaxM2ForCausalLM")


@pytest.mark.parametrize("mtp_keys", [{}, {"num_nextn_predict_layers": 1}])
def test_on_vllm_speculative_decoding_is_skipped_for_the_true_reason_too(mtp_keys: dict[str, int]) -> None:
    """vLLM turns a target into its MTP draft only for the model types and architectures its speculative
    config names (fleet.plan.drafts); for MiniMax-M2 it names none, and `method: mtp` would be refused at
    start ("Unsupported speculative method"). Said so, not "has no MTP heads"."""
    from fleet.model import parse_model_spec
    from fleet.plan import GpuSummary, Wishes, plan_launch

    model = parse_model_spec("/m", {**MINIMAX_M2, **mtp_keys}, None, 230 << 30)
    gpus = GpuSummary("NVIDIA H100", 8, 90, 81559, True)
    wishes = Wishes(engine="vllm", served_name="m", port=30000, speculative=True)
    p = plan_launch(model=model, gpus=gpus, engine_version=(0, 32, 0), python="python3", wishes=wishes)
    assert "--speculative-config" not in p.engine_args()
    [said] = [v.message for v in p.verdicts if v.rule == "speculative-mtp"]
    assert said.startswith("vLLM has no MTP draft for MiniMaxM2ForCausalLM (minimax_m2"), said
    qwen_next = parse_model_spec("/m", {**MINIMAX_M2, **mtp_keys, "model_type": "qwen3_next"}, None, 230 << 30)
    p = plan_launch(model=qwen_next, gpus=gpus, engine_version=(0, 32, 0), python="python3", wishes=wishes)
    assert ("--speculative-config" in p.engine_args()) == bool(mtp_keys)  # a draft type, and heads to draft with


def test_speculative_decoding_runs_where_the_version_has_the_draft_and_the_model_its_heads() -> None:
    """Qwen3-Next's MTP head: SGLang maps Qwen3NextForCausalLM to Qwen3NextForCausalLMMTP in both versions;
    Qwen3-30B-A3B (Qwen3MoeForCausalLM) gets a draft class only in 0.5.23, and has no heads anyway."""
    from fleet.plan.drafts import sglang_draft

    assert sglang_draft("Qwen3NextForCausalLM", (0, 5, 11)) == sglang_draft("Qwen3NextForCausalLM", (0, 5, 23))
    assert sglang_draft("Qwen3MoeForCausalLM", (0, 5, 11)) is None
    assert sglang_draft("Qwen3MoeForCausalLM", (0, 5, 23)) == "Qwen3MoeForCausalLMMTP"
    r = plan(playbook("qwen36-27b"), "ct129", CT129_GPUS)  # Qwen3_5ForConditionalGeneration, one MTP head
    assert r.plan is not None and "--speculative-algorithm" in r.plan.engine_args()


def test_a_gguf_checkpoint_is_refused_for_what_it_is_not_for_a_missing_config(tmp_path: Path) -> None:
    """A directory of .gguf files (or one .gguf file, which SGLang also takes) has no config.json: it is a
    GGUF checkpoint, which fleet does not plan yet, and pre-flight says so rather than "config.json is
    missing"."""
    from fleet.facts.parse import ModelFiles
    from fleet.host import probe

    d = tmp_path / "Qwen3-8B-GGUF"
    d.mkdir()
    (d / "Qwen3-8B-Q4_K_M.gguf").write_bytes(b"GGUF" + bytes(60))
    seen, single = probe._model(str(d)), probe._model(str(d / "Qwen3-8B-Q4_K_M.gguf"))
    assert seen["gguf"] == single["gguf"] == ["Qwen3-8B-Q4_K_M.gguf"] and single["exists"]
    for where in (d, d / "Qwen3-8B-Q4_K_M.gguf"):
        f = replace(
            facts("ct129", RTX_A6000, 2),
            model=ModelFiles(str(where), True, None, None, None, None, gguf=("Qwen3-8B-Q4_K_M.gguf",)),
        )
        result = build_plan(host("ct129"), playbook("qwen36-27b", model=str(where)), f, str(where))
        [refusal] = [v for v in result.errors if v.rule.startswith("model")]
        assert refusal.rule == "model-gguf" and "GGUF checkpoint (Qwen3-8B-Q4_K_M.gguf)" in refusal.message
        assert "config.json is missing" not in refusal.message and result.plan is None
    # found by review: a quantisation in a folder of its own (the Hub's layout) was not found, and a broken
    # config.json beside .gguf files was said to be missing
    nested = tmp_path / "Qwen3-8B-GGUF-nested"
    (nested / "Q4_K_M").mkdir(parents=True)
    (nested / "Q4_K_M" / "Qwen3-8B-Q4_K_M-00001-of-00002.gguf").write_bytes(b"GGUF" + bytes(60))
    assert probe._model(str(nested))["gguf"] == ["Q4_K_M/Qwen3-8B-Q4_K_M-00001-of-00002.gguf"]
    # a name is the host's: one line in the refusal, no terminal controls, whatever it holds
    odd = ModelFiles(str(nested), True, None, None, None, None, gguf=("Q4\n\x1b]0;pwned\x07x.gguf",))
    f = replace(facts("ct129", RTX_A6000, 2), model=odd)
    said = build_plan(host("ct129"), playbook("qwen36-27b", model=str(nested)), f, str(nested)).errors[0].message
    assert "GGUF checkpoint (Q4\\nx.gguf)" in said and "\n" not in said and "\x1b" not in said
    (d / "config.json").write_text("{not json")
    broken = probe._model(str(d))
    assert broken["config_error"] and not broken.get("gguf")  # a broken config.json is said as that
