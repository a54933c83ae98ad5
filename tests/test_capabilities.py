"""Quantised checkpoints x dense/MoE x compute capability x engine version, as data (fleet.plan.capabilities),
each row with the engine code path it comes from; pre-flight refuses or warns from it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factsdata import facts
from fleet.plan.capabilities import ANY, TABLE, capability
from fleet.plan.preflight import preflight
from test_plan import CT129_GPUS, host, plan, playbook

V0511, V0523, V032 = (0, 5, 11), (0, 5, 23), (0, 32, 0)

CASES = [
    # engine, format, MoE, SM, version, extra argv -> verdict (None: runs natively, nothing to say)
    ("sglang", "fp8", False, 86, V0511, (), "marlin"),  # dense FP8 on Ampere: Marlin weight-only
    ("sglang", "fp8", False, 80, V0523, (), "marlin"),
    ("sglang", "fp8", True, 86, V0511, (), "refused"),  # FP8 MoE on Ampere: no Marlin path in 0.5.11
    ("sglang", "fp8", True, 86, V0523, (), "refused"),
    ("sglang", "fp8", True, 86, V0523, ("--moe-runner-backend", "marlin"), "marlin"),
    ("sglang", "fp8", True, 86, V0511, ("--moe-runner-backend", "marlin"), "refused"),  # no such path there
    ("sglang", "fp8", False, 75, V0523, (), "refused"),
    ("sglang", "fp8", True, 90, V0511, (), None),  # Hopper: native FP8
    ("sglang", "modelopt_fp8", False, 86, V0523, (), "refused"),  # ModelOpt FP8: minimum 8.9, no fallback
    ("sglang", "modelopt_fp8", False, 89, V0511, (), None),
    ("sglang", "modelopt_fp4", True, 86, V0511, (), "refused"),
    ("sglang", "modelopt_fp4", True, 86, V0523, (), "marlin"),
    ("sglang", "modelopt_fp4", True, 75, V0523, (), "refused"),
    ("sglang", "modelopt_fp4", True, 120, V0511, (), None),
    ("sglang", "fp8", False, 86, None, (), "marlin"),  # an unknown version: rows that hold for every version
    ("sglang", "modelopt_fp4", True, 86, None, (), None),  # version-dependent: nothing claimed
    ("vllm", "fp8", True, 86, V032, (), "marlin"),
    ("vllm", "fp8", False, 70, V032, (), "refused"),
    ("vllm", "modelopt_fp4", True, 86, V032, (), "marlin"),
    ("vllm", "modelopt_fp4", True, 75, V032, (), "marlin"),
    ("vllm", "modelopt_fp4", True, 75, (0, 31, 0), (), "refused"),
    ("vllm", "modelopt_fp8", False, 86, V032, (), "marlin"),
    ("sglang", "awq", False, 86, V0511, (), None),  # formats without a row are not judged
    # FP8 inside compressed-tensors: W8A8 needs 8.9, else W8A16 through Marlin (dense); MoE has no Marlin path
    ("sglang", "compressed-tensors-fp8", False, 86, V0511, (), "marlin"),
    ("sglang", "compressed-tensors-fp8", False, 86, V0523, (), "marlin"),
    ("sglang", "compressed-tensors-fp8", True, 86, V0523, (), "refused"),
    ("sglang", "compressed-tensors-fp8", False, 75, V0511, (), "refused"),
    ("sglang", "compressed-tensors-fp8", True, 89, V0511, (), None),
    ("vllm", "compressed-tensors-fp8", True, 86, V032, (), "marlin"),
    # block-wise scales: SGLang's W8A16 fallback has no block strategy; vLLM's Marlin has
    ("sglang", "compressed-tensors-fp8-block", False, 86, V0523, (), "refused"),
    ("sglang", "compressed-tensors-fp8-block", False, 75, V0511, (), "refused"),  # the plain format's row
    ("sglang", "compressed-tensors-fp8-block", False, 90, V0511, (), None),
    ("vllm", "compressed-tensors-fp8-block", False, 86, V032, (), "marlin"),
    ("vllm", "compressed-tensors-fp8", False, 70, V032, (), "refused"),
]


@pytest.mark.parametrize(("engine", "fmt", "moe", "sm", "version", "argv", "verdict"), CASES)
def test_each_format_gpu_and_version_gets_its_verdict(
    engine: str, fmt: str, moe: bool, sm: int, version: tuple[int, int, int] | None, argv: tuple, verdict: str | None
) -> None:
    row = capability(engine, fmt, moe, sm, version, argv)
    assert (row.verdict if row else None) == verdict


def test_every_row_says_why_and_where_it_comes_from() -> None:
    for row in TABLE:
        assert row.why and row.source and row.verdict in ("marlin", "refused")
        assert row.sm[0] <= row.sm[1] and row.versions[0] <= row.versions[1]
    assert any(row.versions == ANY for row in TABLE)


def test_preflight_warns_for_dense_fp8_on_ampere_and_refuses_fp8_moe() -> None:
    """Judged by the checkpoint format and the model's shape, not by a name: a dense FP8 model on an A6000
    is a Marlin warning; the same format with experts is refused, naming the code path."""
    f = facts("ct129", CT129_GPUS[0], CT129_GPUS[1], version="0.5.11", model="Qwen3.6-27B")
    r = plan(playbook("qwen36-27b"), "ct129", CT129_GPUS)
    assert r.plan is not None and r.model is not None and r.gpus is not None
    dense = replace(r.model, quantization="fp8", sglang_quantization="fp8")
    said = preflight("pb on ct129", r.plan, dense, r.gpus, f, host("ct129"))
    cap = [v for v in said if v.rule == "quant-capability"]
    assert [v.level for v in cap] == ["warning"] and "Marlin weight-only FP8" in cap[0].message
    moe = replace(dense, num_experts=128, experts_per_token=8)
    said = preflight("pb on ct129", r.plan, moe, r.gpus, f, host("ct129"))
    cap = [v for v in said if v.rule == "quant-capability"]
    assert [v.level for v in cap] == ["error"] and "Fp8MoEMethod" in cap[0].message


def test_fp8_inside_compressed_tensors_is_seen_by_its_scheme() -> None:
    """An llm-compressor FP8 checkpoint says quant_method compressed-tensors: before, no row matched it and
    an FP8 MoE on an A6000 was planned without a word (it fails at load). Its INT4 sibling is not FP8."""
    from test_model_spec import spec_of

    ct = spec_of("qwen3-30b-a3b-fp8-dynamic.json")
    assert (ct.quantization, ct.sglang_quantization, ct.checkpoint_format) == (
        "fp8",
        "compressed-tensors",
        "compressed-tensors-fp8",
    )
    f = facts("ct129", CT129_GPUS[0], CT129_GPUS[1], version="0.5.23", model="Qwen3.6-27B")
    r = plan(playbook("qwen36-27b"), "ct129", CT129_GPUS)
    assert r.plan is not None and r.gpus is not None
    said = [v for v in preflight("pb on ct129", r.plan, ct, r.gpus, f, host("ct129")) if v.rule == "quant-capability"]
    assert [v.level for v in said] == ["error"] and "compressed_tensors_w8a8_fp8_moe.py" in said[0].message
    int4 = replace(ct, quantization="compressed_tensors")
    assert int4.checkpoint_format == "compressed-tensors"
    assert not [v for v in preflight("pb", r.plan, int4, r.gpus, f, host("ct129")) if v.rule == "quant-capability"]


def test_block_wise_fp8_inside_compressed_tensors_is_its_own_format() -> None:
    import json

    from factsdata import CONFIGS
    from fleet.model import parse_model_spec

    cfg = json.loads((CONFIGS / "qwen3-30b-a3b-fp8-dynamic.json").read_text())
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    group["weights"] = {**group["weights"], "strategy": "block", "block_structure": [128, 128]}
    assert parse_model_spec("/m", cfg, None, None).checkpoint_format == "compressed-tensors-fp8-block"
    cfg["quantization_config"]["config_groups"]["group_1"] = {"weights": {"num_bits": 4, "type": "int"}}
    assert parse_model_spec("/m", cfg, None, None).checkpoint_format == "compressed-tensors"  # mixed: not FP8
