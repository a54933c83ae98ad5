"""SGLang's own memory budget (fleet.plan.memory), on the two cases issue 42 met and on points the real
SGLang resolved (tests/test_plan_matrix.py holds every cell of its matrix to the real resolution; these
run without it). Configs: Mixtral-8x22B-v0.1's and Qwen3-32B-AWQ's config.json as their model cards give
them (mistralai/Mixtral-8x22B-v0.1: 56 layers, 48 heads, 8 KV heads, 8 experts, 65,536 positions;
Qwen/Qwen3-32B-AWQ: 64 layers, 64 heads, 8 KV heads of 128, 40,960 positions, AWQ)."""

from __future__ import annotations

from pathlib import Path

from fleet.model import ModelSpec, parse_model_spec
from fleet.plan.fit import GIB, budget, fit_gpus, kv_bytes_per_token
from fleet.plan.memory import MemoryWishes, sglang_chunked_prefill, sglang_mem_fraction, vlm_factor

H100_MIB, RTX4090_MIB, A6000_GIB_MIB = 81559, 24564, 47 * 1024

MIXTRAL_8X22B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 6144,
    "num_hidden_layers": 56, "num_attention_heads": 48, "num_key_value_heads": 8, "num_local_experts": 8,
    "num_experts_per_tok": 2, "max_position_embeddings": 65536, "torch_dtype": "bfloat16",
}  # fmt: skip
QWEN3_32B_AWQ = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120, "head_dim": 128,
    "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
    "max_position_embeddings": 40960, "torch_dtype": "float16",
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
}  # fmt: skip


def model(cfg: dict[str, object], weights_gib: float) -> ModelSpec:
    return parse_model_spec("/m", cfg, None, int(weights_gib * GIB))


def test_a_24_gb_card_gives_the_weights_less_than_fleet_s_old_85_percent() -> None:
    """Qwen3-32B-AWQ on one RTX 4090: 18.0 GiB of weights against SGLang 0.5.23's 17.3 GiB (0.72); 0.5.11
    reserved less on such a card (2k-token chunks, 24 graphs), 0.833."""
    awq = model(QWEN3_32B_AWQ, 18.0)
    assert sglang_mem_fraction((0, 5, 23), RTX4090_MIB, awq, MemoryWishes()) == 0.72
    assert sglang_mem_fraction((0, 5, 11), RTX4090_MIB, awq, MemoryWishes()) == 0.833
    room = budget(awq, RTX4090_MIB, None, "sglang", (0, 5, 23), MemoryWishes())
    assert round(room.bytes / GIB, 1) == 17.3 and "SGLang 0.5.23's own mem_fraction_static 0.720" in room.rule
    assert room.bytes < 18.0 * GIB  # pre-flight refuses: no room for a KV cache (fleet.plan.build)


def test_mixtral_8x22b_on_four_h100s_leaves_sglang_no_room_for_a_prefill_step() -> None:
    """65.5 GiB of weights per GPU at TP 4 against SGLang 0.5.23's 65.6 GiB: the weights alone pass, the
    cache of one 8192-token prefill step (0.4 GiB) does not, and SGLang stops at load."""
    mixtral = model(MIXTRAL_8X22B, 262.0)
    wishes = MemoryWishes(tp=4)
    assert sglang_mem_fraction((0, 5, 23), H100_MIB, mixtral, wishes) == 0.824
    room = budget(mixtral, H100_MIB, None, "sglang", (0, 5, 23), wishes)
    step = sglang_chunked_prefill((0, 5, 23), H100_MIB, wishes) * (kv_bytes_per_token(mixtral, 4) or 0)
    assert round(room.bytes / GIB, 1) == 65.6 and 65.5 * GIB < room.bytes < 65.5 * GIB + step
    assert not fit_gpus(mixtral, H100_MIB, 4, None, version=(0, 5, 23)).fits  # 4 GPUs hold no TP of it


def test_what_each_version_reserves() -> None:
    """Points the real SGLang resolved on fake GPUs (tests/test_plan_matrix.py's cells)."""
    llama8b = model({**QWEN3_32B_AWQ, "architectures": ["LlamaForCausalLM"], "quantization_config": None}, 15)
    # 47 GiB, TP 1: 4k-token chunks, 32 decode graphs, and in 0.5.11 50 piecewise graphs of 8 MiB
    assert sglang_mem_fraction((0, 5, 11), A6000_GIB_MIB, llama8b, MemoryWishes()) == 0.849
    assert sglang_mem_fraction((0, 5, 23), A6000_GIB_MIB, llama8b, MemoryWishes()) == 0.858
    # 0.5.11 reserves 4 GiB more for a speculative draft; 0.5.23 does not
    spec = MemoryWishes(speculative=True)
    assert sglang_mem_fraction((0, 5, 11), A6000_GIB_MIB, llama8b, spec) == round((48128 - 7248 - 4096) / 48128, 3)
    assert sglang_mem_fraction((0, 5, 23), A6000_GIB_MIB, llama8b, spec) == 0.858
    # a GPU over 60 GiB keeps at least 10 GiB back, whatever the sum
    assert sglang_mem_fraction((0, 5, 23), 183 * 1024, llama8b, MemoryWishes(chunked_prefill_size=2048)) == round(
        (183 * 1024 - 10240) / (183 * 1024), 3
    )
    # a vision tower lowers it: Qwen3.6's (24 layers read, hidden 1152) by 0.95 x 0.973
    assert round(vlm_factor((24, 1152)), 6) == round(0.95 * (1 - 0.1 * (24 * 1152**2 / (24 * 1024**2) - 1)), 6)


def fit_refusals(model_dir: Path, version: str) -> list[str]:
    """Pre-flight's fit refusals of Qwen3-32B-AWQ on one RTX 4090, as `fleet plan` plans it from facts."""
    from factsdata import facts
    from fleet.control import placing
    from fleet.inventory import parse_inventory, parse_playbook
    from fleet.yamlfile import parse_yaml

    inventory = parse_inventory(parse_yaml("hosts:\n  box:\n    address: 10.0.0.9\n", Path("inv.yaml")))
    text = (
        "engine: sglang\nmodel: Qwen3-32B-AWQ\nserved_name: q\ngpus: 1\ncontext_length: 4096\n"
        "smoke: {prompt: Capital of France?, expect: Paris}\n"
    )
    playbook = parse_playbook(parse_yaml(text, Path("q.yaml")), "q")
    f = facts("box", ("NVIDIA GeForce RTX 4090", "8.9", RTX4090_MIB), 1, version=version, model=model_dir)
    result = placing.place_and_plan(inventory.hosts["box"], playbook, f, "q", None, replace=False).result
    return [v.message for v in result.errors if v.rule == "fit"]


def test_pre_flight_refuses_what_sglang_would_stop_at_load_and_says_whose_budget(tmp_path: Path) -> None:
    """Refused before anything is stopped under 0.5.23 (17.3 GiB), planned under 0.5.11 (20.0 GiB)."""
    import json

    d = tmp_path / "Qwen3-32B-AWQ"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN3_32B_AWQ))
    index = {"metadata": {"total_size": int(18.0 * GIB)}, "weight_map": {}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    (refused,) = fit_refusals(d, "0.5.23")
    assert "more than 17.3 GiB (SGLang 0.5.23's own mem_fraction_static 0.720" in refused
    assert "would stop at load" in refused
    assert fit_refusals(d, "0.5.11") == []


def test_a_release_candidate_is_its_release_not_a_later_one() -> None:
    """0.5.3rc0 once read as 0.5.30 and was given 0.5.23's rules (found by review)."""
    from fleet.plan import parse_version

    assert parse_version("0.5.3rc0") == (0, 5, 3) and parse_version("0.5.11rc1") == (0, 5, 11)
    assert parse_version("0.5.23.post1") == parse_version("0.5.23+cu128") == (0, 5, 23)
    awq = model(QWEN3_32B_AWQ, 18.0)
    rc = parse_version("0.5.3rc0")
    assert rc is not None and sglang_mem_fraction(rc, RTX4090_MIB, awq, MemoryWishes()) == 0.833


def test_flags_that_move_the_budget_are_read_from_the_command_line() -> None:
    """Chunked prefill off (-1: SGLang then counts --max-prefill-tokens, 16384) and DP attention (padding
    of max_bs x dp x 3, 4.5 past 300 graphs) reserve more (found by review)."""
    llama = model({**QWEN3_32B_AWQ, "architectures": ["LlamaForCausalLM"], "quantization_config": None}, 15)
    off = MemoryWishes(chunked_prefill_size=-1)
    assert sglang_mem_fraction((0, 5, 23), H100_MIB, llama, off) == round(
        1 - (512 + 16384 * 1.5 + 128 + 512) / H100_MIB, 3
    )
    assert sglang_chunked_prefill((0, 5, 23), H100_MIB, off) == 16384
    dp = MemoryWishes(tp=8, dp_attention_size=8)
    expected = 512 + 8192 * 1.5 + 1024 + 512 * 2 + 512 * 8 * 4.5
    assert sglang_mem_fraction((0, 5, 23), H100_MIB, llama, dp) == round(1 - expected / H100_MIB, 3) == 0.592


def test_fit_never_picks_a_tp_pre_flight_then_refuses() -> None:
    """With a short context fit once counted less cache than pre-flight's one prefill step (review)."""
    mixtral = model(MIXTRAL_8X22B, 262.0)
    assert not fit_gpus(mixtral, H100_MIB, 4, 512, version=(0, 5, 23)).fits
    assert fit_gpus(mixtral, H100_MIB, 8, 512, version=(0, 5, 23)).gpus == 8


def test_a_shorter_context_is_advised_only_where_it_would_fit() -> None:
    """Both of issue 42's cases were told "a shorter context_length: would" fit: the context does not move
    SGLang's budget, and their weights with one prefill step's cache do not fit whatever the context. Where
    a context would, the advice names the longest, and that one fits."""
    awq, mixtral = model(QWEN3_32B_AWQ, 18.0), model(MIXTRAL_8X22B, 262.0)
    for refused in (
        fit_gpus(awq, RTX4090_MIB, 1, None, version=(0, 5, 23)),
        fit_gpus(mixtral, H100_MIB, 4, None, version=(0, 5, 23)),
    ):
        assert not refused.fits and refused.why.endswith(
            "more or bigger GPUs would, a shorter context_length: would not"
        ), refused.why
    long = fit_gpus(awq, A6000_GIB_MIB, 1, 262144, version=(0, 5, 23))
    assert not long.fits and "a context_length: of at most " in long.why
    tokens = int(long.why.split("a context_length: of at most ")[1].split()[0])
    assert 40960 < tokens < 262144
    assert fit_gpus(awq, A6000_GIB_MIB, 1, tokens, version=(0, 5, 23)).fits
    assert not fit_gpus(awq, A6000_GIB_MIB, 1, tokens + 1, version=(0, 5, 23)).fits
