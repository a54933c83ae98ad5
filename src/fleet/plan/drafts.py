"""Which model architectures SGLang drafts for with NEXTN, per version: the draft class it loads for a target.

SGLang's `ModelConfig._config_draft_model` (srt/configs/model_config.py) rewrites a target architecture to
its MTP/NextN draft class; an architecture it does not rewrite has no draft model in that version, whatever
its config.json says (MiniMax-M2 declares `num_mtp_modules: 3`; SGLang 0.5.23 has no draft class for it).
Read by running that method of the real SGLang 0.5.11 and 0.5.23 on each architecture it names
(`tests/test_real_parser.py` runs it again against this table); a version between them is taken as the
older one's. Pure data.
"""

from __future__ import annotations

from fleet.plan.types import Version

SGLANG_DRAFTS: tuple[tuple[tuple[Version, Version], dict[str, str]], ...] = (
    (
        ((0, 0, 0), (0, 5, 22)),  # as SGLang 0.5.11
        {
            "BailingMoeForCausalLM": "BailingMoeForCausalLMNextN",
            "BailingMoeV2ForCausalLM": "BailingMoeForCausalLMNextN",
            "BailingMoeV2_5ForCausalLM": "BailingMoeForCausalLMNextN",
            "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
            "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeForCausalLMMTP",
            "ExaoneMoEForCausalLM": "ExaoneMoEForCausalLMMTP",
            "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN",
            "Glm4MoeLiteForCausalLM": "Glm4MoeForCausalLMNextN",
            "GlmMoeDsaForCausalLM": "DeepseekV3ForCausalLMNextN",
            "GlmOcrForConditionalGeneration": "GlmOcrForConditionalGenerationNextN",
            "HYV3ForCausalLM": "HYV3ForCausalLMNextN",
            "LongcatFlashForCausalLM": "LongcatFlashForCausalLMNextN",
            "MiMoForCausalLM": "MiMoMTP",
            "MiMoV2FlashForCausalLM": "MiMoV2MTP",
            "MiMoV2ForCausalLM": "MiMoV2MTP",
            "NemotronHForCausalLM": "NemotronHForCausalLMMTP",
            "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP",
            "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
            "Qwen3_5MoeForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
            "Step3p5ForCausalLM": "Step3p5MTP",
        },
    ),
    (
        ((0, 5, 23), (999, 0, 0)),  # as SGLang 0.5.23 (DeepseekV4 and Qwen4Exp read from the source)
        {
            "BailingMoeForCausalLM": "BailingMoeForCausalLMNextN",
            "BailingMoeV2ForCausalLM": "BailingMoeForCausalLMNextN",
            "BailingMoeV2_5ForCausalLM": "BailingMoeForCausalLMNextN",
            "BailingMoeV3ForCausalLM": "BailingMoeForCausalLMNextN",
            "DeepseekV32ForCausalLM": "DeepseekV3ForCausalLMNextN",
            "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
            "DeepseekV4ForCausalLM": "DeepseekV4ForCausalLMNextN",
            "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeForCausalLMMTP",
            "ExaoneMoEForCausalLM": "ExaoneMoEForCausalLMMTP",
            "ExaoneMoeForCausalLM": "ExaoneMoEForCausalLMMTP",
            "GigaChat35ForCausalLM": "GigaChat35ForCausalLMNextN",
            "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN",
            "Glm4MoeLiteForCausalLM": "Glm4MoeLiteForCausalLMNextN",
            "Glm5NextForConditionalGeneration": "Glm5NextForConditionalGenerationNextN",
            "GlmMoeDsaForCausalLM": "GlmMoeDsaForCausalLMNextN",
            "GlmOcrForConditionalGeneration": "GlmOcrForConditionalGenerationNextN",
            "HYV3ForCausalLM": "HYV3ForCausalLMNextN",
            "HYV4ForCausalLM": "HYV4ForCausalLMNextN",
            "InklingForConditionalGeneration": "InklingForConditionalGenerationMTP",
            "InternS2MobiusForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
            "InternS2PreviewForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
            "LongcatFlashForCausalLM": "LongcatFlashForCausalLMNextN",
            "MiMoForCausalLM": "MiMoMTP",
            "MiMoV2FlashForCausalLM": "MiMoV2MTP",
            "MiMoV2ForCausalLM": "MiMoV2MTP",
            "NemotronHForCausalLM": "NemotronHForCausalLMMTP",
            "NemotronHPuzzleForCausalLM": "NemotronHForCausalLMMTP",
            "NemotronH_Omni_Reasoning_V3": "NemotronHForCausalLMMTP",
            "Qwen3MoeForCausalLM": "Qwen3MoeForCausalLMMTP",
            "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP",
            "Qwen3_5ForCausalLM": "Qwen3_5ForCausalLMMTP",
            "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
            "Qwen3_5MoeForCausalLM": "Qwen3_5ForCausalLMMTP",
            "Qwen3_5MoeForConditionalGeneration": "Qwen3_5ForCausalLMMTP",
            "Qwen4ExpForConditionalGeneration": "Qwen4ExpForCausalLMMTP",
            "Step3p5ForCausalLM": "Step3p5MTP",
            "Step3p7ForConditionalGeneration": "Step3p5MTP",
        },
    ),
)


def sglang_draft(architecture: str, version: Version | None) -> str | None:
    """The draft class SGLang `version` loads for NEXTN on `architecture`, or None when it has none. An
    unknown version is taken as the newest fleet has read."""
    for (lo, hi), drafts in reversed(SGLANG_DRAFTS):
        if version is None or lo <= version <= hi:
            return drafts.get(architecture)
    return None
