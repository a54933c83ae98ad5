"""SGLang's own memory budget: the `mem_fraction_static` it resolves when none is given, per version, so a
plan made without asking the host (and fit, which chooses the GPUs first) counts with what the engine will
allow. Weights and the KV pool must fit in that fraction of each GPU, or SGLang raises "Not enough memory"
at load. Pure; read from SGLang's source:

- 0.5.11: server_args.py `_handle_gpu_memory_settings` (L1294-1480) and `_handle_piecewise_cuda_graph`,
  model_config.py `piecewise_cuda_graph_disabled_model_archs`, `adjust_mem_fraction_for_vlm`;
- 0.5.23: arg_groups/memory_hook.py (the same heuristic without the speculative and piecewise reserves, the
  prefill CUDA graph off by default) and its `adjust_mem_fraction_for_vlm`.

Versions between the two are counted with 0.5.11's rules: which release changed them was not read.
tests/test_plan_matrix.py holds the result to what the real SGLang resolves, in every cell of its matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.model import ModelSpec

MIB_PER_GIB = 1024
# 0.5.11: architectures whose piecewise CUDA graph SGLang turns off (and so reserves nothing for)
PIECEWISE_OFF_ARCHS = frozenset(
    {"DeepseekV32ForCausalLM", "Qwen3NextForCausalLM", "GlmMoeDsaForCausalLM", "BailingMoeV2_5ForCausalLM"}
)
FIRST_HEURISTIC_REWRITE = (0, 5, 23)  # the first version read with memory_hook.py's rules

# The architectures SGLang gives a sliding-window KV pool of their own (configs/model_config.py
# is_hybrid_swa_model), as 0.5.11 and as 0.5.23 name them (tests/test_real_parser.py asks both of the real
# function): their sliding layers hold a share of the full layers' tokens. Any other model's sliding
# layers get a full-context cache from SGLang (Gemma 3). Which layers slide is the config's (its
# layer_types, MiMo-V2's hybrid_layer_pattern, Llama 4's every fourth layer full: fleet.model).
SGLANG_SWA_0511 = frozenset(
    {
        "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "GptOssForCausalLM", "Llama4ForConditionalGeneration",
        "MiMoV2FlashForCausalLM", "MiMoV2ForCausalLM", "MiMoV2MTP", "Step3p5ForCausalLM", "Step3p5MTP",
    }
)  # fmt: skip
SGLANG_SWA_0523 = SGLANG_SWA_0511 | {
    "BeamForCausalLM", "DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMDSpark", "DeepseekV4ForCausalLMNextN",
    "DiffusionGemmaForBlockDiffusion", "EmbeddingGemma2Model", "Gemma4UnifiedForConditionalGeneration",
    "GraniteMoeSWAForCausalLM", "GraniteSWAForCausalLM", "IQuestQ1ForCausalLM", "IQuestQ1MTP",
    "InklingForConditionalGeneration", "InklingForConditionalGenerationMTP", "LagunaForCausalLM",
    "MellumForCausalLM", "MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration",
    "Step3p7ForConditionalGeneration", "UnlimitedOCRForCausalLM",
}  # fmt: skip


# DeepSeek sparse attention (configs/model_config.py is_deepseek_nsa in 0.5.11, is_deepseek_dsa in 0.5.23,
# each with index_topk in the config): beside each layer's MLA latent, an indexer key per token and layer
SGLANG_DSA_0511 = frozenset(
    {
        "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN", "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
    }
)  # fmt: skip
SGLANG_DSA_0523 = SGLANG_DSA_0511 | {
    "GlmMoeDsaForCausalLMNextN", "Glm5NextForConditionalGenerationNextN", "Glm5NextForConditionalGeneration",
    "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN", "Dots3NoteForCausalLM", "Dots3NoteForCausalLMNextN",
    "HYV4ForCausalLM", "HYV4ForCausalLMNextN",
}  # fmt: skip
SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio left alone (0.5.11's default; 0.5.23's fallback)
# 0.5.23's per-model override of that ratio when left alone (arg_groups/model_overrides/inkling.py)
SWA_RATIO_0523 = {"InklingForConditionalGeneration": 0.1, "InklingForConditionalGenerationMTP": 0.1}
FP8_SCALE_BLOCK = 128  # an FP8 MLA or indexer row keeps one fp32 scale per 128 values (memory_pool.py)


def read_as_newest(version: tuple[int, ...] | None) -> bool:
    """Whether SGLang `version` is counted with 0.5.23's rules (None: the newest read); a version between the
    two read is taken as the older."""
    return version is None or version >= FIRST_HEURISTIC_REWRITE


def _table(version: tuple[int, ...] | None, old: frozenset[str], new: frozenset[str]) -> frozenset[str]:
    return new if read_as_newest(version) else old


def sglang_swa_ratio(architecture: str, version: tuple[int, ...] | None) -> float:
    """The share of the full layers' tokens SGLang's sliding-window pool holds for this architecture."""
    newest = read_as_newest(version)
    return SWA_RATIO_0523.get(architecture, SWA_FULL_TOKENS_RATIO) if newest else SWA_FULL_TOKENS_RATIO


def sglang_dsa_bytes(model: ModelSpec, version: tuple[int, ...] | None, sm: int | None, fp8: bool) -> int:
    """One token's cache in one layer of a DeepSeek-sparse-attention model, as SGLang `version` sizes its
    pool (0 for any other model), with an FP8 KV cache or BF16:

    - the MLA latent: BF16 whole; FP8 raw (kv_lora_rank + rope, 576 B) on SM100 and later, where the DSA
      backend is trtllm, else with a scale per 128 values and the rope part in BF16 (656 B: 0.5.23
      kv_cache_configurator.py calculate_mla_kv_cache_dim). 0.5.11 allocates the same but sizes its pool
      with the raw 576 B (pool_configurator.py L122-127), so its count is the smaller one;
    - the indexer's FP8 key with its scale: index_head_dim + index_head_dim / 128 * 4 (132 B), whatever
      the KV dtype (0.5.23 `_compute_dsa_indexer_cell_size`, 0.5.11 pool_configurator.py L140-150)."""
    if not model.dsa_index_dim or model.architecture not in _table(version, SGLANG_DSA_0511, SGLANG_DSA_0523):
        return 0
    indexer = model.dsa_index_dim + model.dsa_index_dim // FP8_SCALE_BLOCK * 4
    if not fp8:
        return model.mla_kv_dim * 2 + indexer
    rank = model.mla_kv_dim - model.rope_dim
    if read_as_newest(version) and (sm is None or sm < 100):  # scaled rows, counted as such
        return rank + rank // FP8_SCALE_BLOCK * 4 + model.rope_dim * 2 + indexer
    return model.mla_kv_dim + indexer


def sglang_dsa_fp8(model: ModelSpec, sm: int | None) -> bool:
    """Whether SGLang keeps a DSA model's KV cache in FP8 when --kv-cache-dtype is left alone: on SM100 and
    later, without attention sinks; BF16 elsewhere (0.5.11 server_args.py L1583-1590, 0.5.23
    arg_groups/overrides.py `_dsa_kv_cache_dtype_default`). A checkpoint that quantises it says FP8 itself."""
    return model.kv_cache_fp8 or (sm is not None and sm >= 100 and not model.attention_sinks)


# DeepSeek V4 (0.5.23 model_executor/pool_configurator.py DSV4PoolConfigurator; its model override sets
# --swa-full-tokens-ratio 0.1 and --page-size 256 when left alone, model_overrides/deepseek_v4.py): every
# layer keeps a window of FlashMLA-layout latents, padded to 576-byte rows per page; a layer compressing 4
# tokens into one also keeps an FP8 indexer key and, per window slot, an fp32 compression state.
DSV4_SWA_RATIO, DSV4_PAGE, DSV4_C4_PAGE, DSV4_C128_PAGE, DSV4_ROW = 0.1, 256, 64, 2, 576


def _dsv4_paged(kv: int, page: int) -> float:
    """Bytes per token of a page of `page` latents of `kv` bytes, rounded up to whole rows (kv_layout.py)."""
    return -(-page * kv // DSV4_ROW) * DSV4_ROW / page


def sglang_dsv4_bytes(model: ModelSpec, speculative: bool) -> float:
    """One token's cache over every layer of a DeepSeek V4 model on one rank, as SGLang 0.5.23 sizes it with
    its defaults (`_get_bytes_per_full_token`): the window's share of every layer's latents and of the
    4-to-1 layers' compression state, and each compressed layer's share of a latent (and indexer key)."""
    if not model.compress_ratios or not model.head_dim:
        return 0.0
    head, rope, index = model.head_dim, model.rope_dim, model.dsa_index_dim or 128
    kv = head - rope + rope * 2 + 8  # nope in FP8, rope in BF16, the scales
    c4 = [r for r in model.compress_ratios if r == 4]
    c128 = [r for r in model.compress_ratios if r == 128]
    ring = 16 if speculative else 8  # window slots per compression state (pool_configurator.py L1250-1256)
    state = ring / DSV4_PAGE * (2 * 2 * head * 4 + 2 * 2 * index * 4)  # fp32 states of the latent and indexer
    per_window_token = len(model.compress_ratios) * _dsv4_paged(kv, DSV4_PAGE) + len(c4) * state
    indexer = index + index // FP8_SCALE_BLOCK * 4
    compressed = (
        len(c4) * (_dsv4_paged(kv, DSV4_C4_PAGE) + indexer) / 4 + len(c128) * _dsv4_paged(kv, DSV4_C128_PAGE) / 128
    )
    total = DSV4_SWA_RATIO * per_window_token + compressed
    # with a draft, both shares grow by the draft's layer (pool_configurator.py L1250-1256)
    return total * (len(model.compress_ratios) + 1) / len(model.compress_ratios) if speculative else total


def sglang_pools_sliding(architecture: str, version: tuple[int, ...] | None) -> bool:
    """Whether SGLang `version` keeps this architecture's sliding layers in a pool of their own (None: the
    newest read; a version between the two read is taken as the older)."""
    return architecture in _table(version, SGLANG_SWA_0511, SGLANG_SWA_0523)


@dataclass(frozen=True)
class MemoryWishes:
    """What the command line sets that the heuristic reads (None: left to SGLang)."""

    tp: int = 1
    speculative: bool = False
    chunked_prefill_size: int | None = None  # -1: chunked prefill off (max_prefill_tokens then counts)
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None
    max_prefill_tokens: int = 16384  # SGLang's default
    dp_attention_size: int = 0  # --enable-dp-attention's --dp-size (0: off)


def gpu_defaults(gpu_mib: int, tp: int, new: bool) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks from the GPU's memory."""
    if gpu_mib < 20 * MIB_PER_GIB:
        return 2048, 8
    if gpu_mib < 35 * MIB_PER_GIB:  # A10, 4090, 5090: 0.5.23 doubled both
        return (4096, 48 if tp < 4 else 160) if new else (2048, 24 if tp < 4 else 80)
    if gpu_mib < 60 * MIB_PER_GIB:
        return 4096, 32 if tp < 4 else 160
    if gpu_mib < 160 * MIB_PER_GIB:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def sglang_chunked_prefill(version: tuple[int, ...], gpu_mib: int, wishes: MemoryWishes) -> int:
    """The tokens SGLang prefills in one step (--chunked-prefill-size, else its pick for this GPU; with
    chunking off, --max-prefill-tokens)."""
    chunked = wishes.chunked_prefill_size or gpu_defaults(gpu_mib, wishes.tp, version >= FIRST_HEURISTIC_REWRITE)[0]
    return chunked if chunked > 0 else wishes.max_prefill_tokens


def capture_sizes(max_tokens: int) -> list[int]:
    """The token counts SGLang captures prefill (0.5.11: piecewise) CUDA graphs for, up to `max_tokens`."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_tokens + 1, 512),
    ]
    return [s for s in sizes if s <= max_tokens]


def vlm_factor(vision: tuple[int, int]) -> float:
    """How much a vision tower lowers the fraction: 0.95, scaled by the tower's size against ViT-L/14's
    (layers x hidden size squared), between 0.8 and 1.05 (`adjust_mem_fraction_for_vlm`)."""
    layers, hidden = vision
    ratio = layers * hidden**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def sglang_mem_fraction(version: tuple[int, ...], gpu_mib: int, model: ModelSpec, wishes: MemoryWishes) -> float:
    """The mem_fraction_static SGLang `version` resolves on a GPU of `gpu_mib` for this model and command line."""
    new = version >= FIRST_HEURISTIC_REWRITE
    chunked, max_bs = gpu_defaults(gpu_mib, wishes.tp, new)
    chunked = wishes.chunked_prefill_size or chunked
    activation_tokens = max(chunked if chunked > 0 else wishes.max_prefill_tokens, 2048)
    if wishes.cuda_graph_max_bs is not None:
        max_bs = wishes.cuda_graph_max_bs
    elif new and wishes.max_running_requests is not None:  # 0.5.23 captures no more than it can run
        max_bs = min(max_bs, wishes.max_running_requests)
    reserved = 512 + activation_tokens * 1.5 + wishes.tp / 8 * 1024 + max_bs * 2
    if wishes.dp_attention_size:  # padding for DP attention, and much more for large decode graphs
        reserved += max_bs * wishes.dp_attention_size * (4.5 if max_bs > 300 else 3)
    if not new:
        piecewise = not (model.vision or model.architecture in PIECEWISE_OFF_ARCHS or wishes.dp_attention_size)
        if piecewise:  # its graphs' non-torch memory; an MLA model's backends take much more
            reserved += 1.5 * 1024 if model.mla else len(capture_sizes(chunked)) * 8
    if gpu_mib > 60 * MIB_PER_GIB:
        reserved = max(reserved, 10 * 1024)
    if not new and wishes.speculative:  # EAGLE/NEXTN draft models and their graphs
        reserved += 4 * 1024
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    return fraction * vlm_factor(model.vision) if model.vision else fraction
