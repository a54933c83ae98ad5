"""Reasoning and tool-call parsers (playbook `parsers:`): the engine's own detection where it has one
(SGLang 0.5.23 `auto`), else the family's names from fleet.plan.parsers, else a warning. The names are held
to the real engines' parsers in tests/test_real_parser.py and tests/test_vllm_real.py."""

from __future__ import annotations

import pytest

from fleet.inventory import Parsers
from fleet.plan.parsers import FAMILIES, parsers_for
from test_plan import CT129_GPUS, plan, playbook


@pytest.mark.parametrize(
    ("engine", "model_type", "version", "expect"),
    [
        ("sglang", "qwen3_5", (0, 5, 11), ("qwen3", "qwen3_coder")),
        ("sglang", "qwen3_5", (0, 5, 23), ("auto", "auto")),  # the engine reads the chat template itself
        ("sglang", "qwen3_next", (0, 5, 11), ("qwen3", "qwen25")),
        ("sglang", "llama", (0, 5, 11), (None, "llama3")),
        ("sglang", "gpt_oss", None, ("gpt-oss", "gpt-oss")),  # an unknown version: no auto claimed
        ("vllm", "qwen3_5", (0, 32, 0), ("qwen3", "qwen3_coder")),
        ("vllm", "gpt_oss", (0, 32, 0), ("openai_gptoss", "openai")),
        ("vllm", "qwen3_moe", (0, 32, 0), ("qwen3", "hermes")),
    ],
)
def test_auto_picks_the_engines_detection_or_the_familys_parsers(
    engine: str, model_type: str, version: tuple[int, int, int] | None, expect: tuple[str | None, str | None]
) -> None:
    choice = parsers_for(engine, model_type, version, "auto")
    assert choice is not None and (choice.reasoning, choice.tool_call) == expect
    assert choice.reason and choice.source


def test_a_family_fleet_does_not_know_gets_nothing_and_names_win() -> None:
    assert parsers_for("sglang", "mystery", (0, 5, 11), "auto") is None
    named = parsers_for("sglang", "mystery", (0, 5, 11), ("deepseek-r1", None))
    assert named is not None and (named.reasoning, named.tool_call) == ("deepseek-r1", None)


def test_every_family_row_is_whole() -> None:
    seen: set[str] = set()
    for row in FAMILIES:
        assert row.why and row.source and any(row.sglang) and any(row.vllm)
        assert not seen & set(row.model_types)  # one row per model_type
        seen |= set(row.model_types)


def test_the_plan_passes_them_and_says_why() -> None:
    r = plan(playbook("qwen36-27b", parsers="auto"), "ct129", CT129_GPUS, "0.5.11")
    assert r.plan is not None
    argv = r.plan.engine_args()
    assert argv[argv.index("--reasoning-parser") + 1] == "qwen3"
    assert argv[argv.index("--tool-call-parser") + 1] == "qwen3_coder"
    said = [v.message for v in r.plan.verdicts if v.rule == "parsers"]
    assert said and "qwen3_5 family" in said[0] and "template_detection.py" in said[0]
    flag = r.plan.flag("--tool-call-parser")
    assert flag is not None and flag.rule == "parsers" and "no parser" in flag.replaces
    r = plan(playbook("qwen36-27b", parsers="auto"), "ct129", CT129_GPUS, "0.5.23")
    assert r.plan is not None and r.plan.flag("--reasoning-parser").value == "auto"  # type: ignore[union-attr]
    r = plan(playbook("qwen36-27b", engine="vllm", parsers="auto"), "ct129", CT129_GPUS, "0.33.0", engine="vllm")
    assert r.plan is not None and "--enable-auto-tool-choice" in r.plan.engine_args()


def test_a_playbook_without_parsers_gets_none_and_a_named_one_is_passed_as_written() -> None:
    r = plan(playbook("qwen36-27b"), "ct129", CT129_GPUS)
    assert r.plan is not None and "--reasoning-parser" not in r.plan.engine_args()
    r = plan(playbook("qwen36-27b", parsers=Parsers(tool_call="hermes")), "ct129", CT129_GPUS)
    assert r.plan is not None
    argv = r.plan.engine_args()
    assert "--reasoning-parser" not in argv and argv[argv.index("--tool-call-parser") + 1] == "hermes"


def test_an_unknown_family_is_a_warning_not_a_guess() -> None:
    from dataclasses import replace

    from fleet.plan import Wishes, plan_launch

    r = plan(playbook("qwen36-27b"), "ct129", CT129_GPUS)
    assert r.model is not None and r.gpus is not None
    model = replace(r.model, model_type="mystery")
    wishes = Wishes(engine="sglang", served_name="m", port=30000, parsers="auto")
    p = plan_launch(model=model, gpus=r.gpus, engine_version=(0, 5, 11), python="python3", wishes=wishes)
    assert "--reasoning-parser" not in p.engine_args()
    warned = [v for v in p.verdicts if v.rule == "parsers"]
    assert warned[0].level == "warning" and "name them in the playbook" in warned[0].message
