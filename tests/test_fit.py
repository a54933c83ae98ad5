"""`gpus: fit`: the smallest TP that holds the model's weights and the KV cache of one request of the whole
context, so the host's other GPUs stay free for other deployments or replicas (fleet.plan.fit)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from factsdata import B200, RTX_A6000, RTX_PRO_6000
from fleet.errors import ConfigError
from fleet.inventory import load_playbook
from fleet.plan.fit import fit_gpus, kv_bytes_per_token
from test_model_spec import spec_of
from test_plan import playbook

H100 = 81559


def test_the_kv_cache_counts_full_attention_layers_and_heads_split_over_ranks() -> None:
    q36 = spec_of("Qwen3.6-27B")  # 16 of 64 layers full attention, 4 KV heads of 256
    assert kv_bytes_per_token(q36, 1) == 2 * 16 * 4 * 256 * 2
    assert kv_bytes_per_token(q36, 2) == 2 * 16 * 2 * 256 * 2
    assert kv_bytes_per_token(q36, 8) == kv_bytes_per_token(q36, 4)  # fewer heads than ranks: replicated
    assert kv_bytes_per_token(replace(q36, head_dim=None), 1) is None  # the config does not say


@pytest.mark.parametrize(
    ("model", "gpu_mib", "context", "gpus"),
    [
        ("llama-3.1-8b.json", H100, None, 1),  # 16 GB and 16 GiB of KV for 131072 tokens: one GPU
        ("Qwen3.6-27B", RTX_A6000[2], None, 2),  # 55.6 GB: two 48 GB GPUs
        ("Qwen3.6-27B", RTX_PRO_6000[2], None, 1),  # one 96 GB GPU holds it and 262144 tokens
        ("Qwen3.6-27B", RTX_PRO_6000[2], 4096, 1),
        ("Qwen3.5-397B-A17B-NVFP4", RTX_PRO_6000[2], None, 4),  # the motivating box: TP 4 would do
        ("Qwen3.5-397B-A17B-NVFP4", B200[2], None, 2),
        ("Qwen3.5-397B-A17B-NVFP4", RTX_A6000[2], None, 8),
    ],
)
def test_the_smallest_power_of_two_that_holds_it(model: str, gpu_mib: int, context: int | None, gpus: int) -> None:
    spec = spec_of(model)
    if model.endswith(".json"):
        spec = replace(spec, weights_bytes=16_060_522_496, head_dim=128)
    fit = fit_gpus(spec, gpu_mib, 8, context)
    assert fit.gpus == gpus, fit.why
    assert f"TP {gpus}" in fit.why and "GiB" in fit.why


def test_a_long_context_needs_more_gpus_and_nothing_fitting_takes_them_all() -> None:
    q36 = spec_of("Qwen3.6-27B")
    assert fit_gpus(q36, RTX_PRO_6000[2], 8, 4096).gpus == 1
    assert fit_gpus(replace(q36, context_length=1_000_000), RTX_PRO_6000[2], 8, None).gpus == 2
    huge = fit_gpus(replace(q36, weights_bytes=10**13), RTX_PRO_6000[2], 8, None)
    assert huge.gpus == 8 and not huge.fits and "no TP up to 8 holds" in huge.why


def test_fit_is_not_asked_with_tp_or_a_group(tmp_path: Path) -> None:
    base = (Path(__file__).parents[1] / "playbooks" / "qwen36-27b.yaml").read_text()
    for extra, said in (("gpus: fit\ntp: 2\n", "fit picks the TP"), ("gpus: fit\nhosts: [a, b]\n", "a group runs")):
        (tmp_path / "pb.yaml").write_text(base.replace("default_host: ct129\n", "") + extra)
        with pytest.raises(ConfigError, match=said):
            load_playbook(str(tmp_path / "pb.yaml"), tmp_path)
    assert playbook("qwen36-27b", gpus="fit").spec.gpus == "fit"


def test_found_by_review_fit_agrees_with_the_planners_tp_and_budget() -> None:
    """The count fit takes is a TP the planner chooses (heads and KV heads split), under the budget
    pre-flight checks (mem_fraction: less 2 GiB), else the largest such TP with a warning."""
    from fleet.plan.rules import choose_tp
    from fleet.plan.types import GpuSummary

    odd = replace(spec_of("Qwen3.6-27B"), num_attention_heads=40, num_kv_heads=10, weights_bytes=60 * 10**9)
    fit = fit_gpus(odd, 23034, 8, 4096)  # 24 GB GPUs
    gpus = GpuSummary(name="L4", count=fit.gpus, memory_mib=23034, sm=89, nvlink=False, indices=())
    assert choose_tp(odd, gpus, None) == fit.gpus
    q36 = spec_of("Qwen3.6-27B")
    assert fit_gpus(q36, H100, 8, 4096).gpus == 1
    assert fit_gpus(q36, H100, 8, 4096, mem_fraction=0.4).gpus == 2  # 29.9 GiB per GPU, as pre-flight counts
    unknown = fit_gpus(replace(q36, weights_bytes=None), H100, 8, 4096)
    assert not unknown.fits and "size is unknown" in unknown.why
    too_long = fit_gpus(q36, H100, 6, 10_000_000)
    assert not too_long.fits and too_long.gpus == 4 and "shorter context_length" in too_long.why


def test_found_by_review_sliding_window_layers_hold_their_window_and_head_size_defaults() -> None:
    import json

    from fleet.model import parse_model_spec

    cfg = json.loads((Path(__file__).parent / "data" / "matrix" / "gpt-oss-120b" / "config.json").read_text())
    oss = parse_model_spec("/m", cfg, None, 65_248_815_744)
    assert (oss.sliding_window_layers, oss.sliding_window) == (18, 128)
    assert kv_bytes_per_token(oss, 1, 131072) < kv_bytes_per_token(replace(oss, sliding_window_layers=0), 1, 131072)
    assert fit_gpus(oss, H100, 8, None).gpus == 1  # 60.8 GiB of weights, and 18 full layers' cache
    llama = json.loads((Path(__file__).parent / "data" / "configs" / "llama-3.1-8b.json").read_text())
    llama.pop("head_dim", None)
    assert parse_model_spec("/m", llama, None, None).head_dim == 128  # hidden size over heads
    no_kv = replace(spec_of("Qwen3.6-27B"), num_kv_heads=0)
    assert kv_bytes_per_token(no_kv, 1) == 2 * 16 * 24 * 256 * 2  # as many KV heads as heads
