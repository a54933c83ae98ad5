"""A model directory's `config.json` (+ `hf_quant_config.json`, weight size) → `ModelSpec`.

Pure: takes parsed JSON, returns a value. Key names and detection rules follow what SGLang and vLLM
read (engines.md §4): Qwen3.5/3.6 nest the language model under `text_config`, Qwen3-Next is flat.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HYBRID_MODEL_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text"}
HYBRID_ARCHS = {
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    # other mamba-style hybrids SGLang handles the same way (0.5.23 overrides.py L369-430)
    "KimiLinearForCausalLM",
    "BailingMoeV2_5ForCausalLM",
    "NemotronHForCausalLM",
    "FalconH1ForCausalLM",
    "Lfm2ForCausalLM",
    "JetNemotronForCausalLM",
}


# transformers fills in the layer types a config leaves out: one full-attention layer in every N, the rest
# sliding (configuration_gemma2.py: 2; configuration_gemma3.py: sliding_window_pattern, else 6;
# configuration_cohere2.py: sliding_window_pattern, else 4). The engines read the filled-in list.
SLIDING_PATTERN_DEFAULTS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6, "cohere2": 4}


def _layer_types(tc: Mapping[str, object], model_type: str, layers: int) -> Any:
    """The config's `layer_types`, or the list transformers makes when it leaves them out (Gemma 2 and 3,
    Cohere 2: Gemma 3's published configs name a `sliding_window_pattern` and no list)."""
    given = tc.get("layer_types")
    if isinstance(given, list) and given:
        return given[:layers]  # one per layer: a longer list's tail names no layer
    pattern = _int(tc, "sliding_window_pattern") or SLIDING_PATTERN_DEFAULTS.get(
        str(tc.get("model_type") or model_type)
    )
    if pattern and layers and tc.get("sliding_window"):
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    return given[:layers] if isinstance(given, list) else given


def _sliding(tc: dict[str, Any], layers: int, layer_types: Any, architecture: str) -> tuple[int, int | None]:
    """(layers holding only a window of tokens, that window), as vLLM's hybrid KV cache keeps them:
    `layer_types`' sliding layers (MiMo-V2: `hybrid_layer_pattern`'s), or Llama 4's chunked-attention
    layers (those with RoPE: every layer but each `no_rope_layer_interval`th) holding their chunk. SGLang
    pools the same layers apart for the architectures it names (fleet.plan.memory.sglang_pools_sliding),
    and names some by rules of its own (0.5.23 configs/model_config.py get_hybrid_layer_ids): Inkling's
    `local_layer_ids`, every layer of UnlimitedOCR, Beam's default of every sixth layer full (and the last,
    configs/beam.py) when its config lists none."""
    if architecture in ("InklingForConditionalGeneration", "InklingForConditionalGenerationMTP"):
        ids = tc.get("local_layer_ids")
        local = {i for i in ids if isinstance(i, int) and 0 <= i < layers} if isinstance(ids, list) else set()
        return len(local), _int(tc, "sliding_window_size", default=512)  # configs/inkling.py's default
    if architecture == "UnlimitedOCRForCausalLM":
        return layers, _int(tc, "sliding_window_size", "sliding_window") or None
    if architecture == "BeamForCausalLM" and not isinstance(layer_types, list):
        return sum(1 for i in range(layers - 1) if (i + 1) % 6), _int(tc, "sliding_window", default=512)
    chunk = _int(tc, "attention_chunk_size")
    if chunk:
        no_rope = tc.get("no_rope_layers")
        if isinstance(no_rope, list) and len(no_rope) >= layers:
            return sum(1 for x in no_rope[:layers] if x), chunk  # 1: RoPE, chunked; 0: global
        interval = _int(tc, "no_rope_layer_interval") or 4
        return sum(1 for i in range(layers) if (i + 1) % interval), chunk
    sliding = sum(1 for t in layer_types if t == "sliding_attention") if isinstance(layer_types, list) else 0
    pattern = tc.get("hybrid_layer_pattern")  # MiMo-V2: 1 for a sliding layer, 0 for a full one
    if not sliding and isinstance(pattern, list):
        sliding = sum(1 for x in pattern[:layers] if x == 1)
    return sliding, _int(tc, "sliding_window") or None


def _vision(vc: Any) -> tuple[int, int] | None:
    """A vision tower's (layers, hidden size), read as SGLang's adjust_mem_fraction_for_vlm reads them:
    `num_hidden_layers` and `hidden_size`, else ViT-L/14's 24 and 1024 (a `depth:` key is not read)."""
    if not isinstance(vc, dict):
        return None
    return _int(vc, "num_hidden_layers", default=24), _int(vc, "hidden_size", default=1024)


# What a server of the model answers (the smoke check asks the matching endpoint):
# generate: /v1/chat/completions; embed: /v1/embeddings; rerank: /v1/rerank (a cross-encoder's scores).
GENERATE, EMBED, RERANK = "generate", "embed", "rerank"
# Base-model architectures the engines serve as embedding models (SGLang configs/model_config.py
# is_generation_model and configs/embedding_model_spec.py, 0.5.23; vLLM's pooling-model docs: "*Model"
# converts to embed)
EMBEDDING_ARCHS = {"LlamaEmbeddingModel", "MistralModel", "Qwen3Model", "BertModel", "XLMRobertaModel", "Contriever"}


def serving_task(architecture: str, sentence_transformers: bool) -> str:
    """What the checkpoint serves: a sequence classifier is a cross-encoder reranker (SGLang serves
    *ForSequenceClassification on /v1/rerank, vLLM as a "classify"/"score" pooling model); a base model
    without a language-model head, or a checkpoint that ships a sentence-transformers pipeline
    (modules.json: Qwen3-Embedding is a Qwen3ForCausalLM with one), is an embedding model."""
    if architecture.endswith("ForSequenceClassification"):
        return RERANK
    if sentence_transformers or architecture in EMBEDDING_ARCHS or architecture.endswith("EmbeddingModel"):
        return EMBED
    return GENERATE


class ModelConfigError(ValueError):
    """The model directory cannot describe a servable model (missing or malformed config)."""


@dataclass(frozen=True)
class ModelSpec:
    path: str
    architecture: str
    model_type: str
    num_layers: int
    linear_attention_layers: tuple[int, ...]  # Gated-DeltaNet / mamba-style layers
    mtp_layers: int  # built-in multi-token-prediction heads (NEXTN / vLLM "mtp")
    quantization: str  # "nvfp4", "fp8", "awq", "gptq", "mxfp4", "bf16", "fp16", ...
    sglang_quantization: str | None  # what SGLang resolves it to, e.g. "modelopt_fp4"
    kv_cache_quant: str | None
    num_experts: int
    experts_per_token: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int | None
    context_length: int | None
    weights_bytes: int | None
    custom_code: bool = False  # config.json's auto_map names code shipped with the model (transformers' remote code)
    sliding_window_layers: int = 0  # layers that attend to the last `sliding_window` tokens only (gpt-oss;
    # Llama 4's chunked-attention layers, their chunk as the window)
    sliding_window: int | None = None
    mla: bool = False  # multi-head latent attention (kv_lora_rank: DeepSeek-V2/V3, Kimi K2): its own backends
    mla_kv_dim: int = 0  # what MLA caches per token and layer: kv_lora_rank + qk_rope_head_dim
    rope_dim: int = 0  # qk_rope_head_dim: the part of an MLA latent FP8 caches keep in BF16
    dsa_index_dim: int = 0  # DeepSeek sparse attention (V3.2): the indexer's key per token and layer
    swa_kv_heads: int = 0  # sliding layers' own KV heads and head size where they differ (Inkling); 0: the same
    swa_head_dim: int = 0
    compress_ratios: tuple[int, ...] = ()  # DeepSeek V4: each layer's KV compression (0: sliding only)
    # a vision tower (multimodal): its layers and hidden size as SGLang reads them, 24 and 1024 when unsaid
    vision: tuple[int, int] | None = None
    task: str = GENERATE  # GENERATE, EMBED or RERANK (serving_task)
    # native FP8 with block-wise scales (quantization_config.weight_block_size): the one quantised form SGLang's
    # weight cache shares over CUDA IPC (weight_cache/protocol.py IPC_QUANT_ALLOWLIST)
    fp8_blocks: bool = False
    labels: int = 0  # a sequence classifier's output labels (id2label, else num_labels); a cross-encoder has one

    @property
    def generates(self) -> bool:
        return self.task == GENERATE

    @property
    def hybrid(self) -> bool:
        return bool(self.linear_attention_layers) or self.architecture in HYBRID_ARCHS

    @property
    def attention_sinks(self) -> bool:
        """Learned attention sinks, which FlashInfer's kernels lack (SGLang model_config.py
        `_detect_attention_sinks`: gpt-oss always has them)."""
        return self.architecture == "GptOssForCausalLM"

    @property
    def kv_cache_fp8(self) -> bool:
        """The checkpoint quantises the KV cache to FP8 (its kv_cache_quant_algo)."""
        return bool(self.kv_cache_quant and "FP8" in self.kv_cache_quant.upper())

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def nvfp4(self) -> bool:
        return self.quantization == "nvfp4"

    @property
    def checkpoint_format(self) -> str | None:
        """What decides which GPUs run it (fleet.plan.capabilities): the engine's quantisation method, and
        for compressed-tensors the scheme inside it."""
        if self.sglang_quantization == "compressed-tensors" and self.quantization in ("fp8", "fp8-block"):
            return f"compressed-tensors-{self.quantization}"
        return self.sglang_quantization

    def describe(self) -> str:
        traits = [self.architecture, self.quantization.upper()]
        if not self.generates:
            traits.append("an embedding model" if self.task == EMBED else "a cross-encoder reranker")
        if self.hybrid:
            traits.append(f"hybrid GDN ({len(self.linear_attention_layers)}/{self.num_layers} linear-attention layers)")
        if self.moe:
            traits.append(f"MoE {self.num_experts} experts, {self.experts_per_token} active")
        if self.mtp_layers:
            traits.append(f"{self.mtp_layers} MTP head(s)")
        if self.weights_bytes:
            traits.append(f"{self.weights_bytes / 1e9:.1f} GB weights")
        return ", ".join(traits)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's keys: nested under text_config for Qwen3.5/3.6 (VL wrapper), flat otherwise."""
    tc = cfg.get("text_config")
    return tc if isinstance(tc, dict) else cfg


def _int(d: Mapping[str, object], *keys: str, default: int = 0) -> int:
    """The first of `keys` the config gives as a count (a whole number, not negative), else `default`."""
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return default


MAX_LAYERS = 10_000  # far above any model's; a host's config asking for more is not read as one (lists of it)


def _fp8_weights(qc: Mapping[str, object]) -> list[dict[str, Any]] | None:
    """The weight schemes of a compressed-tensors checkpoint whose quantised weights are all 8-bit floats
    (its W8A8/W8A16 FP8 schemes: SGLang compressed_tensors.py `_is_fp8_w8a8` / `_is_fp8_w8a16` read the
    same keys), else None."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return None
    weights = [g.get("weights") if isinstance(g, dict) else None for g in groups.values()]
    fp8 = [w for w in weights if isinstance(w, dict) and w.get("num_bits") == 8 and w.get("type") == "float"]
    return fp8 if len(fp8) == len(weights) else None


def _quantization(cfg: dict[str, Any], quant_cfg: dict[str, Any] | None) -> tuple[str, str | None, str | None]:
    """(family, SGLang method, KV-cache quant) — 0.5.11 model_config.py L779-908."""
    qc = cfg.get("quantization_config")
    if isinstance(qc, dict) and qc:
        method = str(qc.get("quant_method") or "modelopt").lower()
        algo = str(qc.get("quant_algo") or "").upper()
        kv = qc.get("kv_cache_quant_algo")
        if method == "modelopt" or (not qc.get("quant_method") and algo):
            if "FP4" in algo:
                return "nvfp4", "modelopt_fp4", kv
            if "FP8" in algo:
                return "fp8", "modelopt_fp8", kv
            if algo == "MIXED_PRECISION":
                return "mixed", "modelopt_mixed", kv
        fp8 = _fp8_weights(qc) if method == "compressed-tensors" else None
        if fp8 is not None:  # block-wise scales decide which fallback exists (fleet.plan.capabilities)
            return ("fp8-block" if any(w.get("strategy") == "block" for w in fp8) else "fp8"), method, kv
        if method in ("fp8", "awq", "gptq", "mxfp4", "compressed-tensors", "bitsandbytes", "gguf"):
            return method.replace("-", "_"), method, kv
        return method, method, kv
    if isinstance(quant_cfg, dict):
        q = quant_cfg.get("quantization")
        q = q if isinstance(q, dict) else {}
        algo = str(q.get("quant_algo") or "").upper()
        kv = q.get("kv_cache_quant_algo")
        if "FP4" in algo:
            return "nvfp4", "modelopt_fp4", kv
        if "FP8" in algo:
            return "fp8", "modelopt_fp8", kv
    tc = _text_config(cfg)
    dtype = str(tc.get("dtype") or tc.get("torch_dtype") or cfg.get("torch_dtype") or "bfloat16")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype), None, None


def _compress_ratios(tc: dict[str, Any], layers: int) -> tuple[int, ...]:
    ratios = tc.get("compress_ratios")
    if not isinstance(ratios, list) or not all(type(r) is int and r >= 0 for r in ratios):
        return ()  # a list fleet cannot read is no list: every layer is counted as a full one
    return tuple(ratios[:layers])


def _fp8_blocks(cfg: dict[str, Any]) -> bool:
    qc = cfg.get("quantization_config")
    return isinstance(qc, dict) and qc.get("quant_method") == "fp8" and qc.get("weight_block_size") is not None


def parse_model_spec(
    path: str,
    config: dict[str, Any] | None,
    quant_config: dict[str, Any] | None,
    weights_bytes: int | None,
    mtp_weight_layers: int = 0,
    sentence_transformers: bool = False,
) -> ModelSpec:
    """`mtp_weight_layers`: MTP layers the checkpoint's weight map names, for configs that do not say.
    `sentence_transformers`: the directory ships a sentence-transformers pipeline (modules.json)."""
    if not isinstance(config, dict):
        raise ModelConfigError(f"{path}/config.json is missing or not a JSON object")
    archs = config.get("architectures") or ["?"]
    if not isinstance(archs, list) or not all(isinstance(a, str) and a for a in archs):
        raise ModelConfigError(
            f"{path}/config.json: architectures must be a list of class names (as transformers writes it, e.g. "
            f'["LlamaForCausalLM"]), not {json.dumps(archs)[:80]}'
        )
    tc = _text_config(config)
    model_type = str(config.get("model_type") or tc.get("model_type") or "?")
    layers = _int(tc, "num_hidden_layers", "n_layer", "num_layers")
    if layers > MAX_LAYERS:
        raise ModelConfigError(f"{path}/config.json: num_hidden_layers {layers} is no model's (at most {MAX_LAYERS})")
    layer_types = _layer_types(tc, model_type, layers)
    if isinstance(layer_types, list) and layer_types:
        linear = tuple(i for i, t in enumerate(layer_types) if t in ("linear_attention", "mamba"))
    elif _int(tc, "full_attention_interval") and (
        model_type in HYBRID_MODEL_TYPES or archs[0] in HYBRID_ARCHS or tc.get("linear_num_value_heads")
    ):
        # Qwen3-Next: layer i is full attention iff (i+1) % interval == 0 (sglang configs/qwen3_next.py L254)
        interval = _int(tc, "full_attention_interval")
        linear = tuple(i for i in range(layers) if (i + 1) % interval != 0)
    else:
        linear = ()
    mtp = (
        _int(tc, "mtp_num_hidden_layers")
        or _int(config, "mtp_num_hidden_layers", "num_nextn_predict_layers", "nextn_predict_layers")
        or _int(tc, "num_nextn_predict_layers")
        or mtp_weight_layers
    )
    family, sglang_quant, kv = _quantization(config, quant_config)
    experts = _int(tc, "num_experts", "n_routed_experts", "num_local_experts")
    heads = _int(tc, "num_attention_heads", "n_head")
    sliding, window = _sliding(tc, layers, layer_types, str(archs[0]))
    return ModelSpec(
        path=path,
        architecture=str(archs[0]),
        model_type=model_type,
        num_layers=layers,
        linear_attention_layers=linear,
        mtp_layers=mtp,
        quantization=family,
        sglang_quantization=sglang_quant,
        kv_cache_quant=kv if isinstance(kv, str) else None,
        num_experts=experts,
        experts_per_token=_int(tc, "num_experts_per_tok", "moe_topk"),
        num_attention_heads=heads,
        num_kv_heads=_int(tc, "num_key_value_heads", default=heads),
        # transformers' default when the config does not say: hidden size over attention heads
        head_dim=_int(tc, "head_dim") or (_int(tc, "hidden_size") // heads if heads else 0) or None,
        context_length=_int(tc, "max_position_embeddings") or None,
        weights_bytes=weights_bytes,
        custom_code=isinstance(config.get("auto_map"), dict) and bool(config["auto_map"]),
        sliding_window_layers=sliding,
        sliding_window=window,
        mla=_int(tc, "kv_lora_rank") > 0,
        mla_kv_dim=_int(tc, "kv_lora_rank") + _int(tc, "qk_rope_head_dim") if _int(tc, "kv_lora_rank") else 0,
        rope_dim=_int(tc, "qk_rope_head_dim"),
        # DeepSeek sparse attention's indexer: a key of index_head_dim per token and layer (SGLang is_deepseek_dsa)
        dsa_index_dim=_int(tc, "index_head_dim", default=128) if tc.get("index_topk") is not None else 0,
        swa_kv_heads=_int(tc, "swa_num_key_value_heads"),
        swa_head_dim=_int(tc, "swa_head_dim"),
        compress_ratios=_compress_ratios(tc, layers),
        vision=_vision(config.get("vision_config")),
        task=serving_task(str(archs[0]), sentence_transformers),
        fp8_blocks=_fp8_blocks(config),
        labels=len(config["id2label"]) if isinstance(config.get("id2label"), dict) else _int(config, "num_labels"),
    )
