"""Rules keyed on what the engine picks itself (fleet.plan.picks): a rule overrides SGLang's own pick only
where that pick is known to fail on the GPU and version, says which pick it replaces and why, leaves a
working pick alone (and `fleet plan` shows it), follows what the engine told on the host over fleet's
table (a plan made with `told`, as a deploy makes it again when the engine's check picks otherwise), and
the act step asks the engine about exactly the settings keyed rules decided (keyed_premises). The table
itself is held to the real SGLang resolution in tests/test_plan_matrix.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factsdata import B200
from fleet.host.check import picks_differ, picks_of
from fleet.host.check_sglang import without
from fleet.plan import keyed_premises
from fleet.plan.build import PlanResult, build_plan
from fleet.plan.picks import AT_LOAD, ATTENTION, FP4_GEMM, MAMBA, MOE_RUNNER, PICKS, engine_pick, told_picks
from test_plan import BLACKWELL_GPUS, CT129_GPUS, plan, playbook

H100 = ("NVIDIA H100 80GB HBM3", "9.0", 81559)


def told_plan(pb_name: str, gpus: tuple, version: str, told: dict[str, str], **changes: object) -> PlanResult:
    """The plan a deploy makes again when the engine's check said `told` (test_plan.plan, with told)."""
    from factsdata import facts
    from test_plan import host

    model = {"qwen35-nvfp4": "Qwen3.5-397B-A17B-NVFP4", "qwen36-27b": "Qwen3.6-27B"}[pb_name]
    f = facts("blackwell", gpus[0], gpus[1], version=version, model=model)
    return build_plan(host("blackwell"), playbook(pb_name, **changes), f, f"/models/{model}", told=told)


def flags_of(r):  # type: ignore[no-untyped-def]
    assert r.plan is not None and not r.errors
    return {f.name: f for f in r.plan.flags}


def test_a_working_engine_pick_is_left_alone_and_shown_as_the_engines_own() -> None:
    """Issue #24: the SM120 attention rule once forced triton/flashinfer on B200, where SGLang picks trtllm_mha."""
    r = plan(playbook("qwen36-27b"), "blackwell", (B200, 8), version="0.5.23")
    assert "--attention-backend" not in flags_of(r)
    assert r.plan is not None
    shown = {p.setting: p for p in r.plan.left_to_engine}
    assert shown[ATTENTION].value == "trtllm_mha" and "SM100" in shown[ATTENTION].source
    assert r.plan.to_json()["left_to_engine"][0]["setting"] == ATTENTION


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_sm120_hybrid_attention_is_sglangs_own_flashinfer_on_both_pinned_versions(version: str) -> None:
    r = plan(playbook("qwen36-27b"), "blackwell", BLACKWELL_GPUS, version=version)
    assert "--attention-backend" not in flags_of(r)
    assert r.plan is not None
    assert [p.value for p in r.plan.left_to_engine if p.setting == ATTENTION] == ["flashinfer"]


def test_a_version_without_a_known_pick_gets_the_flag_and_says_it_does_not_know() -> None:
    r = plan(playbook("qwen36-27b"), "blackwell", BLACKWELL_GPUS, version="0.5.16")
    attention = flags_of(r)["--attention-backend"]
    assert attention.value == "flashinfer"
    assert "0.5.16's own attention here, which fleet does not know" in attention.replaces


def test_a_failing_pick_is_overridden_with_the_pick_it_replaces_and_the_evidence() -> None:
    moe = flags_of(plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS))["--moe-runner-backend"]
    assert moe.value == "flashinfer_cutlass"
    assert moe.replaces.startswith("SGLang's own MoE runner auto, which becomes flashinfer_trtllm at model load")
    assert "which fails here" in moe.replaces and "engines.md §1.4" in moe.replaces


def test_a_hybrid_model_keeps_the_overlap_scheduler_on_0511_without_speculative_decoding() -> None:
    """no_buffer (0.5.11's own pick) turns the overlap scheduler off; extra_buffer keeps it."""
    mamba = flags_of(plan(playbook("qwen36-27b", speculative=None), "ct129", CT129_GPUS))["--mamba-scheduler-strategy"]
    assert mamba.value == "extra_buffer" and "no_buffer" in mamba.replaces and "overlap scheduler" in mamba.replaces


@pytest.mark.parametrize(("version", "backend"), [("0.5.11", "flashinfer_cudnn"), ("0.5.23", "flashinfer_cutlass")])
def test_the_fp4_gemm_pin_writes_down_the_versions_own_choice(version: str, backend: str) -> None:
    fp4 = flags_of(plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS, version=version))["--fp4-gemm-backend"]
    assert fp4.value == backend
    assert fp4.replaces.startswith("nothing: SGLang's own FP4 GEMM auto, which becomes " + backend)


def test_what_the_engine_told_on_the_host_wins_over_fleets_table() -> None:
    r = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS, version="0.5.23")
    assert r.plan is not None
    # a build whose attention default is trtllm_mha on SM120 (it fails there): fleet sets flashinfer
    told = told_plan("qwen35-nvfp4", BLACKWELL_GPUS, "0.5.23", {"attention": "trtllm_mha"}).plan
    assert told is not None
    attention = told.flag("--attention-backend")
    assert attention is not None and attention.value == "flashinfer"
    assert "told by SGLang 0.5.23's check on this host" in attention.replaces
    assert "which fails here" in attention.replaces
    assert told.to_json()["told"] == {"attention": "trtllm_mha"}  # the record says what it stood on
    # a build that picks the working MoE runner itself: fleet's override goes, nothing else changes
    fixed = told_plan("qwen35-nvfp4", BLACKWELL_GPUS, "0.5.23", {"MoE runner": "flashinfer_cutlass"}).plan
    assert fixed is not None and fixed.flag("--moe-runner-backend") is None
    assert [p.value for p in fixed.left_to_engine if p.setting == MOE_RUNNER] == ["flashinfer_cutlass"]
    assert [f.name for f in fixed.flags] == [f.name for f in r.plan.flags if f.name != "--moe-runner-backend"]


@pytest.mark.parametrize(
    ("version", "why"),
    [
        ("0.5.16", "which becomes flashinfer_trtllm at model load"),  # the MoE method's code is read for 0.5.11-0.5.23
        ("0.5.24", "which fleet does not know"),
    ],
)
def test_an_auto_whose_meaning_at_load_fleet_does_not_know_is_not_a_working_pick(version: str, why: str) -> None:
    """Found by review: an engine of a version fleet's table lacks says `auto` for the NVFP4 MoE runner and
    FP4 GEMM backend; where fleet has not read what that becomes at load for this version, the flags stay
    (and the plan says why), instead of being dropped as if `auto` were a working pick."""
    told = told_plan("qwen35-nvfp4", BLACKWELL_GPUS, version, {"MoE runner": "auto", "FP4 GEMM": "auto"}).plan
    assert told is not None
    moe, fp4 = told.flag("--moe-runner-backend"), told.flag("--fp4-gemm-backend")
    assert moe is not None and moe.value == "flashinfer_cutlass" and why in moe.replaces
    assert fp4 is not None and fp4.value == "flashinfer_cudnn"
    # and the engine is not asked again about what it already said
    r = told_plan("qwen35-nvfp4", BLACKWELL_GPUS, version, {"MoE runner": "auto", "FP4 GEMM": "auto"})
    assert r.plan is not None and r.model is not None and r.gpus is not None
    expect = keyed_premises(r.plan, r.model, r.gpus, r.wishes)["expect"]
    assert "auto" in expect[MOE_RUNNER] and "auto" in expect[FP4_GEMM]


def test_a_group_plans_on_fleets_table_alone() -> None:
    """Every rank of a group must run one command line: what one host learned is not planned on."""
    from factsdata import facts
    from test_plan import host

    f = facts("blackwell", BLACKWELL_GPUS[0], 8, version="0.5.11", model="Qwen3.6-27B")
    learned = {"k": [{"signature": "engine-picks", "picks": {"attention": "trtllm_mha"}}]}
    f = replace(f, remote=replace(f.remote, learned=learned))
    pb = playbook("qwen36-27b")
    single = build_plan(host("blackwell"), pb, f, "/models/Qwen3.6-27B")
    group = build_plan(host("blackwell"), pb, f, "/models/Qwen3.6-27B", nodes=2)
    assert single.plan is not None and group.plan is not None
    assert group.plan.flag("--attention-backend") is None and group.plan.told == ()


def test_the_engine_is_asked_about_each_setting_a_keyed_rule_decided() -> None:
    r = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS)
    assert r.plan is not None and r.model is not None and r.gpus is not None
    premises = keyed_premises(r.plan, r.model, r.gpus, r.wishes)
    # the flags fleet set, one setting at a time (resolved again without them on the host)
    assert premises["drop"] == {
        MAMBA: ["--mamba-scheduler-strategy"],
        MOE_RUNNER: ["--moe-runner-backend"],
        FP4_GEMM: ["--fp4-gemm-backend"],
    }
    assert premises["expect"][MOE_RUNNER] == ["auto", "flashinfer_cutlass"]
    assert premises["expect"][MAMBA] == ["no_buffer", "extra_buffer"]
    assert premises["expect"][FP4_GEMM] == ["auto", "flashinfer_cudnn"]
    assert premises["expect"][ATTENTION] == ["flashinfer"]  # left to SGLang: read from the plan's resolution
    assert ATTENTION not in premises["drop"]


def test_a_setting_the_playbook_chose_is_not_asked_about() -> None:
    pb = playbook("qwen35-nvfp4", extra_args=["--moe-runner-backend", "triton"])
    r = plan(pb, "blackwell", BLACKWELL_GPUS)
    assert r.plan is not None and r.model is not None and r.gpus is not None
    premises = keyed_premises(r.plan, r.model, r.gpus, r.wishes)
    assert MOE_RUNNER not in premises["expect"] and MOE_RUNNER not in premises["drop"]
    told = told_plan(
        "qwen35-nvfp4",
        BLACKWELL_GPUS,
        "0.5.11",
        {"MoE runner": "flashinfer_trtllm"},
        extra_args=["--moe-runner-backend", "triton"],
    ).plan
    assert told is not None
    moe = told.flag("--moe-runner-backend")
    assert moe is not None and moe.value == "triton" and moe.rule == "playbook-extra-args"


def test_only_what_a_keyed_rule_decided_is_asked_about() -> None:
    r = plan(playbook("qwen36-27b"), "blackwell", (H100, 8), version="0.5.23")  # only the mamba pin on SM90
    assert r.plan is not None and r.model is not None and r.gpus is not None
    premises = keyed_premises(r.plan, r.model, r.gpus, r.wishes)
    assert premises == {"drop": {MAMBA: ["--mamba-radix-cache-strategy"]}, "expect": {MAMBA: ["extra_buffer"]}}
    vllm = plan(playbook("qwen36-27b", engine="vllm"), "ct129", CT129_GPUS, version="0.33.0", engine="vllm")
    assert vllm.plan is not None and vllm.model is not None and vllm.gpus is not None
    assert keyed_premises(vllm.plan, vllm.model, vllm.gpus, vllm.wishes) == {}
    literal = plan(playbook("qwen35-nvfp4", literal=True), "blackwell", BLACKWELL_GPUS)
    assert literal.plan is not None and literal.model is not None and literal.gpus is not None
    assert keyed_premises(literal.plan, literal.model, literal.gpus, literal.wishes) == {}


@pytest.mark.parametrize(
    ("told", "expect", "differ"),
    [
        ({"MoE runner": "auto"}, {"MoE runner": ["auto", "flashinfer_cutlass"]}, {}),
        ({"MoE runner": "flashinfer_cutlass"}, {"MoE runner": ["auto"]}, {"MoE runner": "flashinfer_cutlass"}),
        ({"attention": "triton", "FP4 GEMM": "auto"}, {"FP4 GEMM": ["auto"]}, {}),  # not asked about: ignored
        ({"mamba strategy": "refused: ValueError: ..."}, {"mamba strategy": ["extra_buffer"]}, {}),  # needed
        ({}, {"attention": ["flashinfer"]}, {}),  # an engine that said nothing changes nothing
    ],
)
def test_the_act_step_stops_before_anything_only_where_the_plan_did_not_stand(
    told: dict[str, str], expect: dict[str, list[str]], differ: dict[str, str]
) -> None:
    assert picks_differ(told, expect) == differ


def test_the_check_programs_picks_line_is_read_defensively() -> None:
    out = 'noise\nFLEET-PICKS {"attention": "flashinfer", "n": 3}\nFLEET-RESOLVED {}\n'
    assert picks_of(out) == {"attention": "flashinfer"}
    assert picks_of('FLEET-PICKS {"attention": "x"}\nFLEET-PICKS {"attention": [}\n') == {}  # the last line wins
    assert picks_of("FLEET-PICKS {" + '"a": ' * 3000 + "}\n") == {}
    assert picks_of("") == {}


def test_every_row_of_the_table_names_where_it_comes_from() -> None:
    for row in PICKS:
        assert row.first <= row.last and row.sm[0] <= row.sm[1]
        assert row.source.startswith(f"SGLang {'.'.join(map(str, row.first))}'s resolution on SM")
    for load in AT_LOAD:  # what code decides at load names the file it is read from
        assert load.first <= load.last and ".py" in load.source and "engines.md" in load.source
    model = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS).model
    assert model is not None
    r = plan(playbook("qwen35-nvfp4"), "blackwell", BLACKWELL_GPUS)
    assert r.gpus is not None
    assert engine_pick(ATTENTION, model, r.gpus, None, True, {}) is None  # an unknown version: nothing claimed


@pytest.mark.parametrize(
    ("argv", "flags", "left"),
    [
        (["--a", "1", "--attention-backend", "fa3", "--b"], ["--attention-backend"], ["--a", "1", "--b"]),
        (["--attention-backend=fa3", "--b", "2"], ["--attention-backend"], ["--b", "2"]),
        (["--x", "--attention-backend"], ["--attention-backend"], ["--x"]),
        (["--attention-backendx", "1"], ["--attention-backend"], ["--attention-backendx", "1"]),
    ],
)
def test_the_check_resolves_again_without_exactly_the_flags_fleet_set(
    argv: list[str], flags: list[str], left: list[str]
) -> None:
    assert without(argv, flags) == left


def test_what_a_host_says_the_engine_picks_is_kept_only_as_plain_words_for_the_settings_asked() -> None:
    """The check's answer and the learned record are the host's: shown, remembered and planned on."""
    said = {
        "attention": "flashinfer",
        "mamba strategy": "refused: ValueError: no_buffer ...",  # says the flag is needed, not a pick
        "MoE runner": "\x1b[31mflashinfer_cutlass\n",
        "FP4 GEMM": 3,
        "--attention-backend": "triton",
    }
    assert told_picks(said) == {"attention": "flashinfer"}
    assert told_picks(["attention", "flashinfer"]) == {} and told_picks(None) == {}


def test_a_damaged_learned_record_of_the_engines_picks_is_ignored() -> None:
    from fleet.plan.build import ENGINE_PICKS, learned_picks

    class Remote:
        def __init__(self, learned: object) -> None:
            self.learned = learned

    class Facts:
        def __init__(self, learned: object) -> None:
            self.remote = Remote(learned)

    good = {"k": [{"signature": "x"}, {"signature": ENGINE_PICKS, "picks": {"attention": "triton"}}]}
    assert learned_picks(Facts(good), "k") == {"attention": "triton"}  # type: ignore[arg-type]
    for damaged in ({"k": "nope"}, {"k": [None, 3, {"signature": ENGINE_PICKS, "picks": "x"}]}, [], None):
        assert learned_picks(Facts(damaged), "k") == {}  # type: ignore[arg-type]
