"""config.json (+ hf_quant_config.json, safetensors index) → ModelSpec, over real-shaped configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT
from factsdata import CONFIGS, model_files
from fleet.model import ModelConfigError, parse_model_spec


def spec_of(name: str):  # type: ignore[no-untyped-def]
    if name.endswith(".json"):
        return parse_model_spec("/m", json.loads((CONFIGS / name).read_text()), None, None)
    files = model_files(name)
    return parse_model_spec("/m", files["config"], files["quant_config"], files["weights_bytes"])


@pytest.mark.parametrize(
    ("model", "arch", "hybrid", "linear", "layers", "mtp", "quant", "sglang_quant", "experts", "heads", "kv"),
    [
        (
            "Qwen3.5-397B-A17B-NVFP4",
            "Qwen3_5MoeForConditionalGeneration",
            True,
            45,
            60,
            1,
            "nvfp4",
            "modelopt_fp4",
            512,
            32,
            2,
        ),
        ("Qwen3.6-27B", "Qwen3_5ForConditionalGeneration", True, 48, 64, 1, "bf16", None, 0, 24, 4),
        ("qwen3-next-80b-a3b.json", "Qwen3NextForCausalLM", True, 36, 48, 1, "bf16", None, 512, 16, 2),
        ("llama-3.1-8b.json", "LlamaForCausalLM", False, 0, 32, 0, "bf16", None, 0, 32, 8),
        ("llama-3.1-8b-fp8.json", "LlamaForCausalLM", False, 0, 32, 0, "fp8", "fp8", 0, 32, 8),
        # FP8 inside compressed-tensors (llm-compressor's FP8_DYNAMIC): judged by its scheme, not its name
        (
            "qwen3-30b-a3b-fp8-dynamic.json",
            "Qwen3MoeForCausalLM",
            False,
            0,
            48,
            0,
            "fp8",
            "compressed-tensors",
            128,
            32,
            4,
        ),
    ],
)
def test_model_traits_are_read_from_the_config(
    model: str,
    arch: str,
    hybrid: bool,
    linear: int,
    layers: int,
    mtp: int,
    quant: str,
    sglang_quant: str | None,
    experts: int,
    heads: int,
    kv: int,
) -> None:
    s = spec_of(model)
    assert (s.architecture, s.hybrid, len(s.linear_attention_layers), s.num_layers, s.mtp_layers) == (
        arch,
        hybrid,
        linear,
        layers,
        mtp,
    )
    assert (s.quantization, s.sglang_quantization, s.num_experts, s.num_attention_heads, s.num_kv_heads) == (
        quant,
        sglang_quant,
        experts,
        heads,
        kv,
    )


def test_qwen36_layer_pattern_is_three_linear_then_one_full() -> None:
    s = spec_of("Qwen3.6-27B")
    assert s.linear_attention_layers[:6] == (0, 1, 2, 4, 5, 6)
    assert 3 not in s.linear_attention_layers and 63 not in s.linear_attention_layers


def test_qwen3_next_layer_pattern_is_derived_from_the_interval() -> None:
    s = spec_of("qwen3-next-80b-a3b.json")  # flat config, no layer_types: (i+1) % 4 == 0 is full attention
    assert 3 not in s.linear_attention_layers and 7 not in s.linear_attention_layers
    assert {0, 1, 2, 4} <= set(s.linear_attention_layers)


def test_nvfp4_is_found_in_hf_quant_config_alone() -> None:
    files = model_files("Qwen3.5-397B-A17B-NVFP4")
    cfg = {k: v for k, v in files["config"].items() if k != "quantization_config"}
    s = parse_model_spec("/m", cfg, files["quant_config"], None)
    assert (s.quantization, s.sglang_quantization) == ("nvfp4", "modelopt_fp4")


def test_weight_size_comes_from_the_safetensors_index() -> None:
    assert spec_of("Qwen3.5-397B-A17B-NVFP4").weights_bytes == 233_900_000_000


@pytest.mark.parametrize("config", [None, [], "text"])
def test_a_missing_or_malformed_config_is_a_clear_error(config: object) -> None:
    with pytest.raises(ModelConfigError, match="config.json is missing or not a JSON object"):
        parse_model_spec("/m", config, None, None)  # type: ignore[arg-type]


def test_mtp_heads_named_only_by_the_checkpoints_tensors_count(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Qwen3-Next's config.json says nothing of its MTP head (SGLang knows it by architecture); the weight map
    names its mtp.* tensors, which the probe counts."""
    from fleet.host import probe

    config = json.loads((CONFIGS / "qwen3-next-80b-a3b.json").read_text())
    config.pop("num_nextn_predict_layers")
    assert parse_model_spec("/m", config, None, None).mtp_layers == 0
    weight_map = {
        "model.layers.0.mlp.gate.weight": "a.safetensors",
        "mtp.fc.weight": "b.safetensors",
        "mtp.layers.0.self_attn.q_proj.weight": "b.safetensors",
        "mtp.pre_fc_norm_hidden.weight": "b.safetensors",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 10}, "weight_map": weight_map})
    )
    found = probe._model(str(tmp_path))
    assert found is not None and found["mtp_weight_layers"] == 1
    spec = parse_model_spec("/m", config, None, 10, found["mtp_weight_layers"])
    assert spec.mtp_layers == 1 and spec.hybrid
    assert probe._mtp_layers({"model.mtp.layers.0.x": "", "model.mtp.layers.1.x": ""}) == 2
    assert probe._mtp_layers({"model.layers.0.mlp.gate_up_proj": "", "model.embed_tokens": ""}) == 0
    assert probe._mtp_layers(["not", "a", "map"]) == 0


def _safetensors(path: Path, data_bytes: int, cut: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "BF16", "shape": [data_bytes // 2], "data_offsets": [0, data_bytes]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * (data_bytes - cut))


def test_a_model_that_is_not_whole_is_reported_file_by_file_without_reading_the_weights(tmp_path: Path) -> None:
    from fleet.host import probe

    (tmp_path / "config.json").write_text("{}")
    weight_map = {"a": "model-1.safetensors", "b": "model-2.safetensors", "c": "model-3.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _safetensors(tmp_path / "model-1.safetensors", 64)  # whole
    _safetensors(tmp_path / "model-2.safetensors", 64, cut=10)  # a cut download
    (tmp_path / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "download" / "model-3.safetensors.incomplete").write_bytes(b"x")
    damage = probe._model(str(tmp_path))["damage"]  # type: ignore[index]
    assert damage[0].startswith("model-2.safetensors: truncated: ") and "of " in damage[0]
    assert damage[1] == "model-3.safetensors: missing"
    assert damage[2].endswith("model-3.safetensors.incomplete: an unfinished download")
    assert len(damage) == 3  # model-1 is whole
    (tmp_path / "model-4.safetensors").write_bytes(b"\xff" * 20)  # not safetensors at all
    assert any(
        d.startswith("model-4.safetensors: truncated or not safetensors") for d in probe._model(str(tmp_path))["damage"]
    )  # type: ignore[index]


def test_a_damaged_model_is_refused_by_preflight_naming_the_files() -> None:
    from dataclasses import replace

    from factsdata import RTX_A6000, facts
    from fleet.inventory import load_inventory, load_playbook
    from fleet.plan.build import build_plan

    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    f = facts("ct129", RTX_A6000, 2, model=pb.spec.model)
    f = replace(f, model=replace(f.model, damage=("model-00001-of-00094.safetensors: truncated: 10 of 20 bytes",)))
    r = build_plan(inv.hosts["ct129"], pb, f, f"/models/{pb.spec.model}")
    (err,) = [v for v in r.verdicts if v.rule == "model-damaged"]
    assert err.level == "error" and "model-00001-of-00094.safetensors: truncated" in err.message


LLAMA_LIKE = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 8, "head_dim": 64}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"architectures": {"a": 1}}, "architectures must be a list of class names"),
        ({"architectures": 7}, "architectures must be a list of class names"),
        ({"architectures": "LlamaForCausalLM"}, "architectures must be a list of class names"),
        ({"num_hidden_layers": 10**8, "model_type": "gemma2", "sliding_window": 4096}, "is no model's"),
    ],
)
def test_a_config_no_model_has_is_a_clear_error_not_a_crash(changes: dict, said: str) -> None:
    """Found by review: a host's config.json with a dict or a string for architectures raised KeyError or
    read as architecture "L"; a hundred million layers built a list for ten seconds. The deploy now says
    what is wrong with the file (fleet.plan.build reports a ModelConfigError with its path)."""
    with pytest.raises(ModelConfigError, match=said):
        parse_model_spec("/m", {**LLAMA_LIKE, **changes}, None, 10**9)


@pytest.mark.parametrize(
    "changes",
    [
        {
            "architectures": ["Llama4ForConditionalGeneration"],
            "attention_chunk_size": 8192,
            "no_rope_layer_interval": 0,
        },
        {"model_type": "qwen3_next", "full_attention_interval": 0.5},
        {"model_type": "qwen3_next", "full_attention_interval": "abc"},
        {"model_type": "qwen3_next", "full_attention_interval": [4]},
        {"layer_types": ["linear_attention"] * 10},  # longer than the model
        {"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": "512", "qk_rope_head_dim": 64},
        {"architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 0, "qk_rope_head_dim": 64},
        {"architectures": ["DeepseekV4ForCausalLM"], "compress_ratios": [4, "x", 128.0, None]},
        {"quantization_config": {}},
    ],
)
def test_odd_values_read_as_unsaid_and_never_give_a_negative_or_crashing_count(changes: dict) -> None:
    """Found by review: each raised ZeroDivisionError, ValueError or TypeError, counted a negative KV cache
    (a layer_types list longer than the model made every layer linear and then some), read "512" as an MLA
    rank of 0, or took an empty quantization_config for modelopt. A value fleet cannot read is unsaid: the
    count falls back to full attention, which never makes fit accept too much."""
    from fleet.plan.fit import kv_bytes_per_token

    spec = parse_model_spec("/m", {**LLAMA_LIKE, **changes}, None, 10**9)
    assert spec.quantization == "bf16" and not spec.mla
    for engine in ("sglang", "vllm"):
        per_token = kv_bytes_per_token(spec, 1, 1000, engine=engine, version=(0, 5, 23))
        assert per_token is not None and per_token >= 0


def test_a_negative_size_or_a_v4_without_head_size_says_too_little_for_a_kv_count() -> None:
    from fleet.plan.fit import kv_bytes_per_token

    for changes in ({"num_hidden_layers": -4}, {"head_dim": -64}):
        assert kv_bytes_per_token(parse_model_spec("/m", {**LLAMA_LIKE, **changes}, None, 10**9), 1) is None
    v4 = {"architectures": ["DeepseekV4ForCausalLM"], "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 1, "compress_ratios": [0, 4, 128, 4]}  # fmt: skip
    assert kv_bytes_per_token(parse_model_spec("/m", v4, None, 10**9), 1, version=(0, 5, 23)) is None
