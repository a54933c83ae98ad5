"""Reasoning and tool-call parsers: which of an engine's output parsers read a model family's thinking and
tool calls, as data. Pure; the planner's `parsers` rule reads it.

A playbook's `parsers: auto` asks the engine where it can decide by itself: SGLang from 0.5.23 takes
`--reasoning-parser auto --tool-call-parser auto` and detects both from the model's chat template
(srt/parser/template_detection.py `resolve_auto_parsers`). Older SGLang and vLLM have no such choice, so
fleet names the family's parsers from this table, keyed on config.json's `model_type`: each row says what
the family's chat template does and which engine code reads it. Every name is one the engine's own parser
accepts in the versions fleet pins (checked against the real SGLang 0.5.11/0.5.23 parsers in
tests/test_real_parser.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.plan.types import Version

SGLANG_AUTO_FROM: Version = (0, 5, 23)  # 0.5.11's --reasoning-parser choices have no "auto"

Names = tuple[str | None, str | None]  # (reasoning parser, tool-call parser)


@dataclass(frozen=True)
class FamilyParsers:
    model_types: tuple[str, ...]
    sglang: Names
    vllm: Names
    why: str  # what the family's chat template does
    source: str


FAMILIES: tuple[FamilyParsers, ...] = (
    FamilyParsers(
        ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"),
        ("qwen3", "qwen3_coder"),
        ("qwen3", "qwen3_coder"),
        "Qwen3.5/3.6 think by default (enable_thinking) and call tools as <function=...><parameter=...>",
        "SGLang 0.5.23 srt/parser/template_detection.py _is_qwen3, _is_qwen3_coder; vLLM tool_parsers qwen3_coder",
    ),
    FamilyParsers(
        ("qwen3", "qwen3_moe", "qwen3_next"),
        ("qwen3", "qwen25"),
        ("qwen3", "hermes"),
        "Qwen3 and Qwen3-Next think in <think> tags and call tools as JSON inside <tool_call> tags",
        "SGLang srt/function_call/qwen25_detector.py; srt/parser/reasoning_parser.py Qwen3Detector; vLLM hermes",
    ),
    FamilyParsers(
        ("gpt_oss",),
        ("gpt-oss", "gpt-oss"),
        ("openai_gptoss", "openai"),
        "gpt-oss speaks OpenAI's harmony format: analysis and commentary channels",
        "SGLang reasoning_parser.py GptOssDetector, function_call/gpt_oss_detector.py; vLLM openai_gptoss, openai",
    ),
    FamilyParsers(
        ("glm4_moe",),
        ("glm45", "glm45"),
        ("glm45", "glm45"),
        "GLM-4.5/4.6 think in <think> tags and call tools as <tool_call> with <arg_key>/<arg_value>",
        "SGLang template_detection.py _is_glm_family; function_call/glm4_moe_detector.py; vLLM glm45",
    ),
    FamilyParsers(
        ("kimi_k2",),
        ("kimi_k2", "kimi_k2"),
        ("kimi_k2", "kimi_k2"),
        "Kimi K2 marks tool calls with <|tool_calls_section_begin|>",
        "SGLang template_detection.py _is_kimi_k2; vLLM kimi_k2",
    ),
    FamilyParsers(
        ("llama",),
        (None, "llama3"),
        (None, "llama3_json"),
        "Llama 3.x calls tools as a JSON object; it does not think in tags",
        "SGLang function_call/llama32_detector.py; vLLM llama3_json",
    ),
)


@dataclass(frozen=True)
class ParserChoice:
    reasoning: str | None
    tool_call: str | None
    reason: str
    source: str


def parsers_for(engine: str, model_type: str, version: Version | None, asked: str | Names) -> ParserChoice | None:
    """The parsers to pass: the playbook's own names, the engine's `auto` where it has one, or the family's
    from the table. None: `auto` for a family fleet has no row for (the planner warns)."""
    if not isinstance(asked, str):
        return ParserChoice(asked[0], asked[1], "named in the playbook (parsers:)", "")
    if engine == "sglang" and version is not None and version >= SGLANG_AUTO_FROM:
        return ParserChoice(
            "auto",
            "auto",
            "SGLang detects both from the model's chat template at start-up",
            "0.5.23 srt/parser/template_detection.py resolve_auto_parsers",
        )
    for row in FAMILIES:
        if model_type in row.model_types:
            names = row.sglang if engine == "sglang" else row.vllm
            return ParserChoice(names[0], names[1], f"the {model_type} family: {row.why}", row.source)
    return None
