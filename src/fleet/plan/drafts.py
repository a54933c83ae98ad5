"""Which models the engines draft for with the model's own MTP heads: SGLang's NEXTN draft class per
version, and vLLM's `mtp` draft model type.

SGLang's `ModelConfig._config_draft_model` (srt/configs/model_config.py) rewrites a target architecture to
its MTP/NextN draft class; an architecture it does not rewrite has no draft model in that version, whatever
its config.json says (MiniMax-M2 declares `num_mtp_modules: 3`; SGLang 0.5.23 has no draft class for it).
Read by running that method of the real SGLang 0.5.11 and 0.5.23 on each architecture it names
(`tests/test_real_parser.py` runs it again against this table); a version between them is taken as the
older one's.

vLLM's `SpeculativeConfig.hf_config_override` (vllm/config/speculative.py) rewrites a target's model_type,
or for some its architecture, to an MTP draft type; a target it does not rewrite is refused at start with
`--speculative-config '{"method":"mtp"}'` ("Unsupported speculative method"). Read by running that method
of the real vLLM 0.32.0 (the CPU build CI installs) on each model_type and architecture it names
(`tests/test_vllm_real.py` runs it again against these tables and fails on a name they lack). Left out:
DeepSeek V4.1 (vLLM refuses its `mtp`: it drafts with DSpark), Inkling and InternS2-Mobius (their drafts
need MTP weights or experts declared the way fleet does not read), so speculative decoding is skipped
for them. Pure data.
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


VLLM_MTP_BY_MODEL_TYPE: dict[str, str] = {
    "bailing_hybrid": "bailing_hybrid_mtp",
    "deepseek_v3": "deepseek_mtp",
    "deepseek_v32": "deepseek_mtp",
    "deepseek_v4": "deepseek_mtp",
    "dots3_note": "dots3_note_mtp",
    "ernie4_5_moe": "ernie_mtp",
    "exaone4_5": "exaone4_5_mtp",
    "exaone_moe": "exaone_moe_mtp",
    "gemma4_assistant": "gemma4_mtp",
    "gemma4_unified_assistant": "gemma4_mtp",
    "glm5_next": "glm5_next_mtp",
    "glm_moe_dsa": "deepseek_mtp",
    "hy_v3": "hy_v3_mtp",
    "hy_v4": "hy_v4_mtp",
    "intern_s2_preview": "qwen3_5_mtp",
    "kimi_k3": "kimi_k3_mtp",
    "longcat_flash": "longcat_flash_mtp",
    "minimax_m3_vl": "minimax_m3_mtp",
    "nemotron_h": "nemotron_h_mtp",
    "nemotron_h_puzzle": "nemotron_h_mtp",
    "pangu_ultra_moe": "pangu_ultra_moe_mtp",
    "qwen3_5": "qwen3_5_mtp",
    "qwen3_5_moe": "qwen3_5_mtp",
    "qwen3_5_moe_text": "qwen3_5_mtp",
    "qwen3_5_text": "qwen3_5_mtp",
    "qwen3_next": "qwen3_next_mtp",
    "qwen4_exp": "qwen4_exp_mtp",
    "qwen4_exp_text": "qwen4_exp_mtp",
    "step3p5": "step3p5_mtp",
    "step3p7": "step3p5_mtp",
}
VLLM_MTP_BY_ARCHITECTURE: dict[str, str] = {
    "BailingMoeV2_5ForCausalLM": "bailing_hybrid_mtp",
    "BailingMoeV3ForCausalLM": "bailing_hybrid_v3_mtp",
    "BailingMoeV3VLForConditionalGeneration": "bailing_hybrid_v3_mtp",
    "Glm4MoeForCausalLM": "glm4_moe_mtp",
    "Glm4MoeLiteForCausalLM": "glm4_moe_lite_mtp",
    "GlmOcrForConditionalGeneration": "glm_ocr_mtp",
    "MiMoForCausalLM": "mimo_mtp",
    "MiMoV2FlashForCausalLM": "mimo_v2_mtp",
    "MiMoV2ForCausalLM": "mimo_v2_mtp",
    "MiMoV2OmniForCausalLM": "mimo_v2_mtp",
    "MiniMaxM3SparseForConditionalGeneration": "minimax_m3_mtp",
    "Step3p5ForCausalLM": "step3p5_mtp",
    "Step3p7ForConditionalGeneration": "step3p5_mtp",
}
# Named in hf_config_override but given no MTP draft here (see above); the test holds the list complete.
VLLM_MTP_LEFT_OUT = (
    "deepseek_v41",
    "inkling_mm_model",
    "inkling_model",
    "interns2_mobius",
    "MistralLarge3ForCausalLM",  # rewritten to an EAGLE draft, not MTP
    "NemotronH_Omni_Reasoning_V3",
    "NemotronH_Super_Omni_Reasoning_V3",
)


def vllm_draft(model_type: str, architecture: str) -> str | None:
    """The MTP draft type vLLM makes of a target (its config's model_type and first architecture), or None
    when `--speculative-config '{"method":"mtp"}'` would be refused."""
    return VLLM_MTP_BY_MODEL_TYPE.get(model_type) or VLLM_MTP_BY_ARCHITECTURE.get(architecture)
