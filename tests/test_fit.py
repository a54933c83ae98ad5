"""`gpus: fit`: the smallest TP that holds the model's weights and the KV cache of one request of the whole
context, so the host's other GPUs stay free for other deployments or replicas (fleet.plan.fit)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from factsdata import B200, CONFIGS, RTX_A6000, RTX_PRO_6000, facts
from fleet.control import placing
from fleet.errors import ConfigError, PreflightError
from fleet.facts import HostFacts
from fleet.inventory import load_playbook
from fleet.plan import args_dict
from fleet.plan.fit import GIB, fit_gpus, kv_bytes_per_token
from fleet.plan.memory import sglang_pools_sliding
from fleet.plan.placement import place
from test_model_spec import spec_of
from test_plan import playbook

H100 = 81559
H100_GPU = ("NVIDIA H100 80GB HBM3", "9.0", H100)


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


def test_speculative_decoding_counts_the_mtp_drafts_own_kv_cache() -> None:
    """Qwen3.6-27B's one MTP head keeps its own KV cache for the whole context beside the 16 full-attention
    layers': 17/16 of it. On a GPU just big enough without the draft, asking for speculative decoding
    takes two GPUs, and the reason says the draft is counted."""
    q36 = spec_of("Qwen3.6-27B")
    assert q36.mtp_layers == 1 and q36.weights_bytes
    plain, drafted = kv_bytes_per_token(q36, 1), kv_bytes_per_token(q36, 1, draft_layers=1)
    assert plain and drafted and drafted * 16 == plain * 17
    context = q36.context_length or 0
    between = q36.weights_bytes + context * (plain + drafted) / 2  # what fits one GPU only without the draft
    memory_mib = math.ceil(between / 0.85 / (1 << 20))
    assert fit_gpus(q36, memory_mib, 8, None).gpus == 1
    with_draft = fit_gpus(q36, memory_mib, 8, None, speculative=True)
    assert with_draft.gpus == 2 and "(with the MTP draft's)" in with_draft.why and "TP 1 would not" in with_draft.why


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
    assert not too_long.fits and too_long.gpus == 4 and "a context_length: of at most " in too_long.why


def test_found_by_review_sliding_window_layers_hold_their_window_and_head_size_defaults() -> None:
    import json

    from fleet.model import parse_model_spec

    cfg = json.loads((Path(__file__).parent / "data" / "matrix" / "gpt-oss-120b" / "config.json").read_text())
    oss = parse_model_spec("/m", cfg, None, 65_248_815_744)
    assert (oss.sliding_window_layers, oss.sliding_window) == (18, 128) and sglang_pools_sliding(oss.architecture, None)
    per_layer = 2 * 8 * 64 * 2  # keys and values of 8 KV heads of 64, in BF16
    # vLLM keeps a sliding layer's 128 tokens; SGLang its SWA pool at 0.8 of the full layers' tokens
    assert kv_bytes_per_token(oss, 1, 131072, engine="vllm") == round(per_layer * (18 + 18 * 128 / 131072))
    assert kv_bytes_per_token(oss, 1, 131072) == round(per_layer * (18 + 0.8 * 18))
    assert fit_gpus(oss, H100, 8, None, engine="vllm").gpus == 1  # 60.8 GiB of weights, 4.5 GiB of cache
    assert fit_gpus(oss, H100, 8, None).gpus == 2  # SGLang's 8.1 GiB of cache does not fit beside them
    llama = json.loads((Path(__file__).parent / "data" / "configs" / "llama-3.1-8b.json").read_text())
    llama.pop("head_dim", None)
    assert parse_model_spec("/m", llama, None, None).head_dim == 128  # hidden size over heads
    no_kv = replace(spec_of("Qwen3.6-27B"), num_kv_heads=0)
    assert kv_bytes_per_token(no_kv, 1) == 2 * 16 * 24 * 256 * 2  # as many KV heads as heads


# --- gpus: left out: fit, unless something else says how many --------------------------------------------


def placed(pb_name: str, f: object, **changes: object) -> placing.Placed:
    from test_plan import host

    pb = playbook(pb_name, **changes)
    return placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=False)  # type: ignore[arg-type]


def blackwell(**kw: object) -> HostFacts:
    return facts("blackwell", RTX_PRO_6000, 8, model="Qwen3.5-397B-A17B-NVFP4", **kw)  # type: ignore[arg-type]


def test_gpus_fit_takes_what_the_model_needs_and_says_the_rest_stay_free() -> None:
    """The motivating box with gpus: fit (packing): TP 4 holds Qwen3.5-397B NVFP4 and its whole context, so
    it takes four GPUs sharing the closest links and leaves four for another deployment or a replica."""
    p = placed("qwen35-nvfp4", blackwell(), gpus="fit")
    assert p.result.plan is not None and p.placement.gpus == (0, 1, 2, 3)
    assert args_dict(p.result.plan.engine_args())["--tp-size"] == "4"
    assert {e.name: e.value for e in p.result.plan.env}["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    said = next(v.message for v in p.result.verdicts if v.rule == "gpus-fit")
    assert said.startswith("gpus: fit: 4 GPUs (TP 4)") and "TP 2 would not" in said
    assert "the host's other 4 are left for other deployments" in said and "gpus: all" in said
    whole = placed("qwen35-nvfp4", blackwell(), gpus="all")
    assert whole.indices is None and whole.result.plan is not None
    assert args_dict(whole.result.plan.engine_args())["--tp-size"] == "8"
    assert "CUDA_VISIBLE_DEVICES" not in {e.name for e in whole.result.plan.env}
    assert not [v for v in whole.result.verdicts if v.rule == "gpus-fit"]


def test_gpus_left_out_the_motivating_moe_model_takes_the_whole_box_as_one_tp_group() -> None:
    """What the seed command ran by hand: TP 8 on the 8x RTX PRO 6000 box. PCIe only, but a MoE (and
    hybrid) model is one TP group; TP 4 would hold it and the plan says so."""
    p = placed("qwen35-nvfp4", blackwell())
    assert p.result.plan is not None and p.placement.gpus == tuple(range(8))
    a = args_dict(p.result.plan.engine_args())
    assert a["--tp-size"] == "8" and "--dp-size" not in a
    said = next(v.message for v in p.result.verdicts if v.rule == "gpus-fit")
    assert said.startswith("gpus: left out, so the host's free GPUs: the host's 8 free GPUs as TP 8 (PCIe only, but")
    assert "TP 4 would hold it" in said and "gpus: fit takes as few as the model needs" in said


@pytest.mark.parametrize(
    ("model", "gpu", "count", "nvlink", "was", "now"),
    [
        ("Llama-3.1-70B-Instruct", ("NVIDIA A100-SXM4-80GB", "8.0", 81920), 8, True, 4, 8),
        # the issue's TP 2 was the FP8 release's (zai-org/GLM-4.5-Air-FP8, not among the test configs): this
        # BF16 one needs all four whatever the default, so the row holds only that the whole box is taken
        ("GLM-4.5-Air", H100_GPU, 4, True, 4, 4),
        ("Qwen3.5-397B-A17B-NVFP4", B200, 8, True, 2, 8),
        ("Qwen3.5-397B-A17B-NVFP4", RTX_PRO_6000, 8, False, 4, 8),
    ],
)
def test_the_issues_idle_boxes_now_serve_whole(
    model: str, gpu: tuple, count: int, nvlink: bool, was: int, now: int
) -> None:
    """Issue 42's cases (published configs: tests/data/matrix and the testbed's models): fit's TP, which
    left the rest of the box idle, and the whole box the default now takes as one TP group."""
    from factsdata import CONFIGS, MODELS

    d = CONFIGS.parent / "matrix" / model if (CONFIGS.parent / "matrix" / model).is_dir() else MODELS / model
    f = facts("box", gpu, count, model=d, nvlink=nvlink, version="0.5.23")
    pb_model = {"model": d.name}
    fitted = placed("qwen36-27b", f, gpus="fit", **pb_model)
    whole = placed("qwen36-27b", f, **pb_model)
    assert args_dict(fitted.result.plan.engine_args())["--tp-size"] == str(was)  # type: ignore[union-attr]
    a = args_dict(whole.result.plan.engine_args())  # type: ignore[union-attr]
    assert (a["--tp-size"], a.get("--dp-size")) == (str(now), None)
    assert len(whole.placement.gpus) == count


def test_gpus_left_out_a_dense_model_on_pcie_runs_data_parallel_replicas_and_on_nvlink_one_group() -> None:
    """Llama-3.1-8B (published config, 16 GB): one GPU holds it. On the 8x PCIe box it runs as TP 1 x 8
    replicas behind one port; on NVLink as one TP 8 group. GPUs another user's job holds are left out."""
    from factsdata import CONFIGS

    llama = CONFIGS.parent / "matrix" / "Llama-3.1-8B-Instruct"
    pcie = placed("qwen36-27b", facts("blackwell", RTX_PRO_6000, 8, model=llama), model=llama.name, speculative=None)
    assert pcie.result.plan is not None and pcie.placement.gpus == tuple(range(8))
    a = args_dict(pcie.result.plan.engine_args())
    assert (a["--tp-size"], a["--dp-size"]) == ("1", "8")
    assert pcie.result.plan.flag("--dp-size").rule == "data-parallel"  # type: ignore[union-attr]
    said = next(v.message for v in pcie.result.verdicts if v.rule == "gpus-fit")
    assert "TP 1 x 8 data-parallel replicas (PCIe only" in said
    job = {g: [{"pid": 900 + g, "used_mib": 90000}] for g in (5, 6, 7)}
    busy = placed("qwen36-27b", facts("blackwell", RTX_PRO_6000, 8, model=llama, gpu_processes=job), model=llama.name)
    assert busy.placement.gpus == (0, 1, 2, 3, 4) and args_dict(busy.result.plan.engine_args())["--dp-size"] == "5"  # type: ignore[union-attr]
    nvlink = placed("qwen36-27b", facts("box", H100_GPU, 8, model=llama, nvlink=True), model=llama.name)
    a = args_dict(nvlink.result.plan.engine_args())  # type: ignore[union-attr]
    assert a["--tp-size"] == "8" and "--dp-size" not in a


def test_the_default_stops_nothing_the_free_gpus_make_needless() -> None:
    """Found by review: with gpus: left out, --replace took every GPU and stopped a deployment on four of
    them although the four free ones hold the model; a stale server's GPUs were taken the same way. The
    free GPUs come first, then stale servers', then (--replace) other deployments'."""
    from test_plan import host

    dense = CONFIGS.parent / "matrix" / "Llama-3.1-8B-Instruct"
    servers, on_gpus = engine_on({500 + i: i for i in range(4)}, 1000, 500)
    big = {"big": {"state": {"pid": 500, "pgid": 500, "status": "ready", "port": 30010, "gpus": [0, 1, 2, 3]}}}
    f = facts("blackwell", RTX_PRO_6000, 8, model=dense, servers=servers, gpu_processes=on_gpus, deployments=big)
    pb = playbook("qwen36-27b", model=dense.name, speculative=None)
    replaced = placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=True)  # type: ignore[arg-type]
    assert replaced.placement.gpus == (4, 5, 6, 7) and not replaced.placement.replaces
    stale = facts("blackwell", RTX_PRO_6000, 8, model=dense, servers=servers, gpu_processes=on_gpus)
    p = placing.place_and_plan(host("blackwell"), pb, stale, pb.name, None, replace=False)  # type: ignore[arg-type]
    assert p.placement.gpus == (4, 5, 6, 7) and "stale" not in p.how
    # the free GPUs cannot hold Qwen3.5-397B: then the stale server's come too, and the plan says so
    servers, on_gpus = engine_on({500 + i: i for i in range(6)}, 1000, 500)
    p = placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus))
    said = next(v.message for v in p.result.verdicts if v.rule == "gpus-fit")
    assert len(p.placement.gpus) == 8 and "free or a stale server's: the free ones alone do not hold it" in said


def test_a_playbook_that_lays_its_gpus_out_itself_keeps_every_gpu() -> None:
    """Found by review: extra_args: [--dp-size, 2] got all eight GPUs planned as TP 1 x 8 while running
    two; --pp-size was multiplied into a layout the box does not have. Like a hand-written TP, they are
    the playbook's own layout."""
    for extra in (["--dp-size", "2"], ["--dp", "2"], ["--pp-size", "2"], ["--data-parallel-size", "2"]):
        p = placed("qwen36-27b", blackwell(), extra_args=extra)
        assert p.indices is None, extra
        assert "--dp-size" not in [f.name for f in p.result.plan.flags if f.rule == "data-parallel"]  # type: ignore[union-attr]


def test_tp_gives_the_count_and_a_hand_written_tp_keeps_every_gpu() -> None:
    two = placed("qwen36-27b", blackwell(), tp=2)
    assert two.placement.gpus == (0, 1) and two.result.plan is not None
    assert args_dict(two.result.plan.engine_args())["--tp-size"] == "2"
    with pytest.raises(PreflightError, match=r"qwen36-27b.yaml \(blackwell\): 16 GPUs asked for; blackwell has 8"):
        placed("qwen36-27b", blackwell(), tp=16)
    for changes in ({"extra_args": ["--tp", "8"]}, {"extra_args": ["--tensor-parallel-size=8"]}):
        assert placed("qwen36-27b", blackwell(), **changes).indices is None
    assert placed("qwen35-nvfp4-handwritten", blackwell()).indices is None  # literal: the command as typed


def engine_on(pids_gpus: dict[int, int], uid: int, pgid: int, **extra: object) -> tuple[list, dict]:
    """An SGLang server's processes, each on one GPU (as NVML lists them), of user `uid`."""
    servers = [
        {
            "pid": pid,
            "pgid": pgid,
            "uid": uid,
            "user": "ops" if uid == 1000 else "alice",
            "comm": "python3",
            "cmdline": "python3 -m sglang.launch_server --model-path /m",
            **extra,
        }
        for pid in pids_gpus
    ]
    return servers, {gpu: [{"pid": pid, "used_mib": 40000}] for pid, gpu in pids_gpus.items()}


def test_a_stale_server_of_fleets_user_gives_its_gpus_back_and_anyone_elses_never() -> None:
    """A server fleet's user started by hand on all eight GPUs (the story's starting point) is stopped as a
    stale server, as it was before placements, and the plan says so; a second user's server, a server in
    a container and one whose deployment is recorded are never placed over."""
    by_hand = {100 + i: i for i in range(8)}
    servers, on_gpus = engine_on(by_hand, 1000, 100)
    p = placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus), gpus="fit")
    assert p.placement.gpus == (0, 1, 2, 3)
    assert "a server no deployment records holds some (pids 100, 101, 102, 103): stopped as a stale server" in p.how
    for uid, extra in ((1001, {}), (1000, {"container": "c0ffee"})):
        servers, on_gpus = engine_on(by_hand, uid, 100, **extra)
        with pytest.raises(PreflightError, match="4 free GPUs asked for; blackwell has 0 free"):
            placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus), gpus="fit")
    servers, on_gpus = engine_on(by_hand, 1000, 100)
    recorded = {"other": {"state": {"pid": 999, "pgid": 100, "status": "stopped", "gpus": [0]}}}
    with pytest.raises(PreflightError, match="blackwell has 0 free"):
        placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus, deployments=recorded), gpus="fit")
    with pytest.raises(PreflightError, match="4 free GPUs asked for"):  # a count the operator gave: never
        placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus), gpus=4)
    unreadable = {"prod": {"state": {}, "state_error": "state.json: not JSON"}}  # its server may be this one
    with pytest.raises(PreflightError, match="blackwell has 0 free"):
        placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus, deployments=unreadable), gpus="fit")


def test_the_port_a_stale_server_listens_on_is_kept_when_it_is_stopped_and_moved_when_it_is_not() -> None:
    """The story's hand-started server holds all eight GPUs and port 30000: fit takes four of them, so the
    server is stopped whole, and the deployment keeps the playbook's port rather than moving off a port
    that is about to be free. A server fleet does not stop (it holds no GPU fleet takes) keeps its port,
    and the deployment moves."""
    servers, on_gpus = engine_on({100 + i: i for i in range(8)}, 1000, 100)
    listening = [{"address": "0.0.0.0", "port": 30000, "pid": 100}]
    p = placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus, listeners=listening), gpus="fit")
    assert p.result.plan is not None and p.result.plan.port == 30000
    assert "port 30000 is a stale server's, stopped first" in p.how
    servers, on_gpus = engine_on({100: 7}, 1000, 100)  # on GPU 7 only: fit takes 0-3, so it keeps running
    p = placed("qwen35-nvfp4", blackwell(servers=servers, gpu_processes=on_gpus, listeners=listening), gpus="fit")
    assert p.placement.gpus == (0, 1, 2, 3) and p.result.plan is not None and p.result.plan.port == 30010
    assert "port 30000 is in use: qwen35-nvfp4 uses 30010" in p.how


def test_as_few_stale_servers_as_the_count_needs_are_stopped() -> None:
    """Two hand-started servers hold GPUs 0 and 1, another user's job GPUs 3-6, and 2 and 7 are free: a
    count of three fleet chose takes the free two and one stale server's GPU, and stops that one only."""
    a, on_a = engine_on({100: 0}, 1000, 100)
    b, on_b = engine_on({110: 1}, 1000, 110)
    job = {g: [{"pid": 900 + g, "used_mib": 90000}] for g in (3, 4, 5, 6)}
    f = blackwell(servers=[*a, *b], gpu_processes={**on_a, **on_b, **job})
    placement = place("qwen35-nvfp4", 3, f, replace=False, where="x", take_stale=True)
    assert len(placement.gpus) == 3 and {2, 7} <= set(placement.gpus)
    assert "(pids 100): stopped as a stale server" in placement.how


def test_fleet_plan_showing_an_overlap_does_not_say_the_other_deployments_port_is_taken_over() -> None:
    """`fleet plan` shows a refused overlap as an error verdict, placed as --replace would place it; the
    other deployment is not stopped without --replace, so its port is not this one's."""
    from test_plan import host

    servers, on_gpus = engine_on({500 + i: i for i in range(8)}, 1000, 500)
    whole = {"big": {"state": {"pid": 500, "pgid": 500, "status": "ready", "port": 30000}}}
    f = blackwell(
        servers=servers,
        gpu_processes=on_gpus,
        deployments=whole,
        listeners=[{"address": "0.0.0.0", "port": 30000, "pid": 500}],
    )
    pb = playbook("qwen35-nvfp4", gpus="all")
    shown = placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=False, show_refusal=True)  # type: ignore[arg-type]
    assert shown.result.plan is not None and shown.result.plan.port == 30010
    assert any(v.rule == "placement" and "overlap deployment big" in v.message for v in shown.result.verdicts)
    replaced = placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=True)  # type: ignore[arg-type]
    assert replaced.result.plan is not None and replaced.result.plan.port == 30000


def test_fleet_plan_says_why_fit_chose_a_count_once_and_a_deploy_in_its_one_error() -> None:
    """A refused fit: `fleet plan` lists the fit's reason as its own verdict, so the placement's error and
    the placement line do not repeat it (they did: three times); a deploy, whose error is all it says,
    gives the reason in that error."""
    from test_plan import host

    servers, on_gpus = engine_on({500 + i: i for i in range(6)}, 1000, 500)  # 6 of 8 GPUs held: fit wants 4
    whole = {"big": {"state": {"pid": 500, "pgid": 500, "status": "ready", "port": 30000, "gpus": list(range(6))}}}
    f = blackwell(servers=servers, gpu_processes=on_gpus, deployments=whole)
    pb = playbook("qwen35-nvfp4", gpus="fit")
    shown = placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=False, show_refusal=True)  # type: ignore[arg-type]
    fit = next(v.message for v in shown.result.verdicts if v.rule == "gpus-fit")
    texts = [v.message for v in shown.result.verdicts] + [shown.how]
    assert fit.startswith("gpus: fit: 4 GPUs") and sum(fit in t for t in texts) == 1
    assert any(v.rule == "placement" and v.level == "error" for v in shown.result.verdicts)
    with pytest.raises(PreflightError) as refused:
        placing.place_and_plan(host("blackwell"), pb, f, pb.name, None, replace=False)  # type: ignore[arg-type]
    assert refused.value.message.startswith(fit)


# --- KV cache as each engine sizes it (issue 42, item 3) ---------------------------------------------------
# tests/data/configs, each config.json as published, copied verbatim from a public copy (the Hub's own
# repositories are not reachable from here):
# - kimi-k2-instruct, deepseek-v3.2, deepseek-v4-flash: the raw config.json of local snapshots of
#   moonshotai/Kimi-K2-Instruct, deepseek-ai/DeepSeek-V3.2 and deepseek-ai/DeepSeek-V4-Flash, dumped by a
#   model-inspection report on GitHub (its "original config.json" sections; the V4 copy matches another one
#   embedded in a Rust test field for field);
# - llama-4-scout-17b-16e-instruct: ai-dynamo/aiconfigurator's copy of meta-llama/Llama-4-Scout-17B-16E-
#   Instruct's config.json (aic-core/src/aiconfigurator_core/model_configs/, commit 64c5ddb6), which drops
#   keys fleet does not read (token ids, no_rope_layers: every fourth layer, the default, is global).


def config(name: str) -> dict[str, object]:
    import json

    return json.loads((Path(__file__).parent / "data" / "configs" / f"{name}.json").read_text())


def test_mla_caches_one_latent_per_token_and_layer_on_every_rank() -> None:
    from fleet.model import parse_model_spec

    kimi = parse_model_spec("/m", config("kimi-k2-instruct"), None, 1_029_000_000_000)
    assert (kimi.mla, kimi.mla_kv_dim) == (True, 512 + 64)
    per_token = 61 * 576 * 2  # SGLang pool_configurator: (kv_lora_rank + qk_rope_head_dim) x layers x BF16
    assert kv_bytes_per_token(kimi, 8) == kv_bytes_per_token(kimi, 1) == per_token  # not split over ranks
    assert round(per_token * 131072 / GIB, 1) == 8.6  # was counted 26.7 GiB, as 8 of 64 heads of 112 per rank
    assert kv_bytes_per_token(kimi, 8, draft_layers=1) == 62 * 576 * 2  # a NEXTN draft's layer is MLA too


def test_chunked_attention_is_a_window_to_vllm_and_a_sliding_pool_to_sglang() -> None:
    from fleet.model import parse_model_spec

    scout = parse_model_spec("/m", config("llama-4-scout-17b-16e-instruct"), None, 217_000_000_000)
    assert (scout.sliding_window_layers, scout.sliding_window) == (36, 8192)
    per_layer = 2 * 2 * 128 * 2  # TP 4: 2 of the 8 KV heads per rank
    assert kv_bytes_per_token(scout, 4, 131072) == round(per_layer * (12 + 0.8 * 36))  # SGLang: 41.8 of 48
    assert kv_bytes_per_token(scout, 4, 131072, engine="vllm") == round(per_layer * (12 + 36 * 8192 / 131072))


def test_deepseek_sparse_attention_caches_an_indexer_key_beside_each_latent_in_the_gpus_dtype() -> None:
    """DeepSeek-V3.2 (DSA): SGLang keeps, per token and layer, the MLA latent and the indexer's FP8 key with
    its scale (128 + 4 bytes); the latent is BF16 on Hopper and FP8 from SM100 up, which is what both real
    versions resolve --kv-cache-dtype to there (test_real_parser.py). An FP8 latent outside the trtllm
    backend keeps a scale per 128 values and its rope part in BF16: 656 bytes, which 0.5.23 counts and
    0.5.11 sizes as the raw 576."""
    from dataclasses import replace

    from fleet.model import parse_model_spec

    v32 = parse_model_spec("/m", config("deepseek-v3.2"), None, 689_000_000_000)
    assert (v32.dsa_index_dim, v32.mla_kv_dim, v32.rope_dim) == (128, 576, 64)
    hopper, blackwell = (kv_bytes_per_token(v32, 8, version=(0, 5, 23), sm=sm) for sm in (90, 100))
    assert (hopper, blackwell) == (61 * (1152 + 132), 61 * (576 + 132))
    assert kv_bytes_per_token(v32, 8, version=(0, 5, 11), sm=90) == hopper  # the same in 0.5.11
    assert kv_bytes_per_token(v32, 8, draft_layers=1, version=(0, 5, 23), sm=100) == 62 * (576 + 132)
    fp8 = replace(v32, kv_cache_quant="FP8")  # an FP8 KV cache on Hopper: flashmla_kv's scaled rows
    assert kv_bytes_per_token(fp8, 8, version=(0, 5, 23), sm=90) == 61 * (656 + 132)
    assert kv_bytes_per_token(fp8, 8, version=(0, 5, 11), sm=90) == 61 * (576 + 132)
    assert kv_bytes_per_token(v32, 8, engine="vllm") == 61 * 576 * 2  # vLLM's latent alone, as before
    v3 = parse_model_spec("/m", config("kimi-k2-instruct"), None, 1_029_000_000_000)  # DeepseekV3, no index_topk
    assert v3.dsa_index_dim == 0 and kv_bytes_per_token(v3, 8, sm=100) == 61 * 576 * 2


def test_deepseek_v4_is_counted_as_sglang_sizes_its_compressed_cache() -> None:
    """DeepSeek-V4-Flash: 43 layers, each keeping a 128-token window of FlashMLA-layout latents (584 bytes,
    padded to 576-byte rows per 256-token page), 21 compressing 4 tokens into one (with an indexer key and a
    per-slot fp32 compression state) and 20 compressing 128 into one. SGLang 0.5.23 sizes the window's pool
    at 0.1 of the full tokens (its model override): 7,086.75 bytes per token on every rank, where counting
    every layer as full attention of 512 dimensions gave 88,064."""
    from fleet.model import parse_model_spec

    flash = parse_model_spec("/m", config("deepseek-v4-flash"), None, 160_000_000_000)
    assert (len(flash.compress_ratios), flash.compress_ratios.count(4), flash.compress_ratios.count(128)) == (
        43,
        21,
        20,
    )
    per_token = kv_bytes_per_token(flash, 4, version=(0, 5, 23), sm=90)
    assert per_token == round(0.1 * (43 * 585 + 21 * 320) + 21 * (585 + 132) / 4 + 20 * 864 / 128) == 7087
    assert kv_bytes_per_token(flash, 8, version=(0, 5, 23), sm=100) == per_token  # one latent: no TP split
    assert kv_bytes_per_token(flash, 4, draft_layers=1, version=(0, 5, 23)) > per_token  # a draft widens both
    assert kv_bytes_per_token(flash, 4, version=(0, 5, 11)) == 43 * 2 * 1 * 512 * 2  # 0.5.11 has no V4


def test_counting_v4s_compressed_cache_as_sglang_does_flips_whether_its_whole_context_fits() -> None:
    """The decision issue 42 said a KV count would flip: DeepSeek-V4-Flash's whole context (1,048,576
    tokens) on 8 H100s. Counted as full attention (88,064 bytes a token, 86 GiB on every rank) it could
    not fit on any number of 80 GB GPUs, whatever the weights; as SGLang 0.5.23 sizes it (7,087 bytes,
    6.9 GiB) four of them hold it beside the weights (a stand-in size: the flip is the cache's)."""
    from fleet.model import parse_model_spec

    flash = parse_model_spec("/m", config("deepseek-v4-flash"), None, 160 * 10**9)
    assert flash.context_length == 1_048_576
    as_full = 43 * 2 * 1 * 512 * 2  # what fleet counted before: every layer a full-attention one
    assert as_full * flash.context_length > H100 * (1 << 20)  # more than the whole GPU, on every rank
    fit = fit_gpus(flash, H100, 8, None, version=(0, 5, 23), sm=90)
    assert fit.fits and fit.gpus == 4, fit.why
    assert "the KV cache for 1048576 tokens 6.9 GiB" in fit.why


def test_deepseek_v4_drafts_with_its_mtp_head_under_the_name_its_hook_accepts(tmp_path: Path) -> None:
    """Found by the real 0.5.23 resolving fleet's plan (tests/test_plan_matrix.py): DeepSeek V4's hook
    refuses NEXTN by name ("Only EAGLE and DSPARK speculative algorithms are supported") and any topk but
    1, so its draft runs as EAGLE, topk 1."""
    import json

    d = tmp_path / "DeepSeek-V4-Flash"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config("deepseek-v4-flash")))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 160 * 10**9}}))
    p = placed("qwen36-27b", facts("box", H100_GPU, 8, model=d, nvlink=True, version="0.5.23"), model=d.name)
    assert p.result.plan is not None and not p.result.errors
    a = args_dict(p.result.plan.engine_args())
    assert (a["--speculative-algorithm"], a["--speculative-eagle-topk"]) == ("EAGLE", "1")
    assert p.result.plan.flag("--speculative-algorithm").rule == "speculative-mtp-eagle"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("architecture", "extra", "sliding", "share"),
    [
        # Inkling: its config's local_layer_ids slide (configs/inkling.py; window 512 by default), in a
        # pool 0.1 of the full tokens (0.5.23 model_overrides/inkling.py), with heads of their own
        (
            "InklingForConditionalGeneration",
            {"local_layer_ids": [0, 1, 2, 4, 5, 6, 99], "swa_num_key_value_heads": 2},
            6,
            0.1,
        ),
        # Beam without layer_types: every sixth layer full, and the last (configs/beam.py)
        ("BeamForCausalLM", {"sliding_window": 512}, 10, 0.8),
        # UnlimitedOCR: every layer slides, so its one pool holds every token (no ratio without full layers)
        ("UnlimitedOCRForCausalLM", {"sliding_window_size": 1024}, 12, 1.0),
    ],
)
def test_sglangs_own_rules_for_which_layers_slide(architecture: str, extra: dict, sliding: int, share: float) -> None:
    from fleet.model import parse_model_spec

    cfg = {"architectures": [architecture], "num_hidden_layers": 12, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 128, **extra}  # fmt: skip
    spec = parse_model_spec("/m", cfg, None, 10 * GIB)
    assert spec.sliding_window_layers == sliding
    full, swa = 2 * 4 * 128 * 2, 2 * (extra.get("swa_num_key_value_heads") or 4) * 128 * 2
    assert kv_bytes_per_token(spec, 1, version=(0, 5, 23)) == round(full * (12 - sliding) + swa * sliding * share)
    assert kv_bytes_per_token(spec, 1, version=(0, 5, 11)) == full * 12  # 0.5.11 pools none of them apart


# Gemma 3 4B's text config as published (google/gemma-3-4b-it, as public config fixtures reproduce it, e.g.
# a Rust model loader's test_gemma3_4b_config_from_json): a sliding_window_pattern, no layer_types.
GEMMA3_4B_TEXT = {
    "model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34, "num_attention_heads": 8,
    "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 1024, "sliding_window_pattern": 6,
    "max_position_embeddings": 131072,
}  # fmt: skip


@pytest.mark.parametrize("pattern_given", [True, False])
def test_sglang_pools_apart_only_the_architectures_it_names(pattern_given: bool) -> None:
    """Gemma 3 has one global layer in six and sliding ones between, though its config lists no layer
    types (transformers fills them in from sliding_window_pattern, else 6 for the model type, and vLLM
    reads that list: found by review, when fleet counted every layer full for vLLM). SGLang (0.5.11,
    0.5.23) gives it no sliding pool: every layer holds the whole context there."""
    from fleet.model import parse_model_spec

    text = dict(GEMMA3_4B_TEXT) if pattern_given else {k: v for k, v in GEMMA3_4B_TEXT.items() if "pattern" not in k}
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text}
    gemma = parse_model_spec("/m", cfg, None, 8_600_000_000)
    assert (gemma.sliding_window_layers, gemma.sliding_window) == (29, 1024)
    assert not sglang_pools_sliding(gemma.architecture, (0, 5, 11)) and not sglang_pools_sliding(
        gemma.architecture, None
    )
    per_layer = 2 * 4 * 256 * 2
    assert kv_bytes_per_token(gemma, 1, 131072) == per_layer * 34
    assert kv_bytes_per_token(gemma, 1, 131072, engine="vllm") == round(per_layer * (5 + 29 * 1024 / 131072))


def test_sglang_pools_a_models_sliding_layers_apart_only_from_the_version_that_names_it() -> None:
    """MiMo-V2-Flash says its sliding layers with hybrid_layer_pattern (1: sliding), not layer_types; SGLang
    0.5.11 already pools them apart. Granite's SWA model is pooled apart only from 0.5.23 on: before, its
    sliding layers hold the whole context too (found by review: fleet named neither)."""
    from fleet.model import parse_model_spec

    base = {"num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128}
    mimo = parse_model_spec(
        "/m",
        {**base, "architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash",
         "sliding_window": 128, "hybrid_layer_pattern": [0, 1, 1, 1, 1, 1, 1, 0]},
        None, 10 << 30,
    )  # fmt: skip
    per_layer = 2 * 4 * 128 * 2
    assert mimo.sliding_window_layers == 6
    for version in ((0, 5, 11), (0, 5, 23)):
        assert kv_bytes_per_token(mimo, 1, 65536, version=version) == round(per_layer * (2 + 0.8 * 6))
    granite = replace(mimo, architecture="GraniteSWAForCausalLM")
    assert kv_bytes_per_token(granite, 1, 65536, version=(0, 5, 11)) == per_layer * 8
    assert kv_bytes_per_token(granite, 1, 65536, version=(0, 5, 23)) == round(per_layer * (2 + 0.8 * 6))
