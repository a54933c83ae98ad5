"""How many GPUs a model needs (playbook `gpus: fit`): the smallest tensor-parallel size whose share of the
weights and the KV cache for one request of the whole context fit in each GPU, so the host's other GPUs
stay free for other deployments or a service's replicas. Pure.

The budget is pre-flight's (fleet.plan.build): the playbook's mem_fraction less 2 GiB, else SGLang's own
mem_fraction_static at each TP (fleet.plan.memory), else 85% of each GPU.
The TP is one the planner would choose (it splits the attention and KV heads: fleet.plan.rules.tp_splits).
The KV cache is counted as the engine allocates it (kv_bytes_per_token): full-attention layers for the
whole context; sliding-window and chunked layers as the engine pools them; MLA as one latent per token and
layer on every rank; Gated-DeltaNet/mamba layers keep a fixed-size state and are not counted. KV heads are
split over the ranks and replicated when there are fewer heads than ranks, in the checkpoint's dtype (FP8
when it quantises the KV cache). With speculative decoding on the model's own MTP heads, the draft keeps a
KV cache of its own for the same tokens: one full-attention layer per head (SGLang's draft worker and
vLLM's MTP proposer each allocate one); its weights are in the checkpoint already. A model that does not
say its head size is fitted by its weights alone, and the reason says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.model import ModelSpec
from fleet.plan.memory import (
    MemoryWishes,
    read_as_newest,
    sglang_chunked_prefill,
    sglang_dsa_bytes,
    sglang_dsa_fp8,
    sglang_dsv4_bytes,
    sglang_mem_fraction,
    sglang_pools_sliding,
    sglang_swa_ratio,
)
from fleet.plan.rules import tp_splits

WEIGHTS_AND_KV_MAX_SHARE = 0.85  # when no fraction is known (vLLM): the rest is activations and CUDA graphs
GIB = 1 << 30


@dataclass(frozen=True)
class Fit:
    gpus: int
    why: str
    fits: bool = True  # False: nothing up to the host's GPUs holds it; the largest TP is taken


def kv_bytes_per_token(
    model: ModelSpec,
    tp: int,
    context: int | None = None,
    draft_layers: int = 0,
    engine: str = "sglang",
    version: tuple[int, ...] | None = None,
    sm: int | None = None,
) -> int | None:
    """One token's keys and values on one of `tp` ranks, as `engine` sizes its cache, averaged over
    `context` tokens, with `draft_layers` layers of a speculative draft, on GPUs of compute capability `sm`;
    None when the config does not say enough.

    - MLA caches one latent (kv_lora_rank + qk_rope_head_dim) per token and layer, whole on every rank;
      SGLang adds DeepSeek sparse attention's indexer key and picks the KV dtype by GPU for those models
      (fleet.plan.memory.sglang_dsa_bytes), and sizes DeepSeek V4's compressed cache its own way.
    - SGLang `version` keeps the sliding layers of the architectures it pools apart at
      swa_full_tokens_ratio of the full layers' tokens (all of them when no layer is full), and every other
      layer for the whole context (model_executor/pool_configurator.py, 0.5.11 and 0.5.23); vLLM keeps a
      sliding or chunked layer's window only."""
    dtype_bytes = 1 if model.kv_cache_fp8 else 2
    attention_layers = model.num_layers - len(model.linear_attention_layers)
    if (
        engine == "sglang"
        and read_as_newest(version)
        and model.compress_ratios
        and model.architecture.startswith("DeepseekV4")
    ):
        v4 = sglang_dsv4_bytes(model, draft_layers > 0)
        return round(v4) if v4 else None  # without a head size the config does not say enough
    if model.mla_kv_dim and model.num_layers:
        dsa = sglang_dsa_bytes(model, version, sm, sglang_dsa_fp8(model, sm)) if engine == "sglang" else 0
        return (attention_layers + draft_layers) * (dsa or model.mla_kv_dim * dtype_bytes)
    if not model.head_dim or not model.num_layers:
        return None
    heads = model.num_kv_heads or model.num_attention_heads
    if not heads:
        return None

    def layer(kv_heads: int, head_dim: int) -> int:
        return 2 * -(-kv_heads // tp) * head_dim * dtype_bytes  # heads replicated when fewer than ranks

    per_layer = layer(heads, model.head_dim)
    sliding_layer = layer(model.swa_kv_heads or heads, model.swa_head_dim or model.head_dim)
    if engine == "sglang":
        sliding = model.sliding_window_layers if sglang_pools_sliding(model.architecture, version) else 0
        # with no full layer there is one sliding pool, of the full token count (pool_configurator.py)
        share = sglang_swa_ratio(model.architecture, version) if sliding < attention_layers else 1.0
    else:
        sliding = model.sliding_window_layers if model.sliding_window else 0
        share = min(1.0, (model.sliding_window or 0) / context) if context else 1.0
    return round(per_layer * (attention_layers - sliding + draft_layers) + sliding_layer * sliding * share)


@dataclass(frozen=True)
class Budget:
    """What weights and the KV cache may take on each GPU at one TP, and the rule that says so."""

    bytes: float
    rule: str
    # tokens whose KV cache must fit beside the weights whatever the context: fleet's margin, one prefill
    # step. SGLang itself stops at load only when no token fits ("Not enough memory"), and counts its
    # fraction of the memory free after its CUDA context and NCCL buffers, which fleet does not know: the
    # step stands for what that leaves out. 0 for a budget given outright
    prefill_tokens: int = 0


def budget(
    model: ModelSpec,
    memory_mib: int,
    mem_fraction: float | None,
    engine: str,
    version: tuple[int, ...] | None,
    wishes: MemoryWishes,
) -> Budget:
    """The playbook's mem_fraction less 2 GiB; else SGLang's own mem_fraction_static for this GPU, TP and
    model (fleet.plan.memory); else 85% of each GPU (vLLM, or an engine version not known yet)."""
    if mem_fraction:
        return Budget((memory_mib * mem_fraction - 2048) * (1 << 20), f"mem_fraction {mem_fraction} less 2 GiB")
    if engine == "sglang" and version is not None:
        fraction = sglang_mem_fraction(version, memory_mib, model, wishes)
        shown = ".".join(map(str, version))
        rule = f"SGLang {shown}'s own mem_fraction_static {fraction:.3f}"
        return Budget(memory_mib * fraction * (1 << 20), rule, sglang_chunked_prefill(version, memory_mib, wishes))
    return Budget(memory_mib * (1 << 20) * WEIGHTS_AND_KV_MAX_SHARE, f"{WEIGHTS_AND_KV_MAX_SHARE:.0%} of each GPU")


def fit_gpus(
    model: ModelSpec,
    memory_mib: int,
    available: int,
    context_length: int | None,
    mem_fraction: float | None = None,
    speculative: bool = False,
    engine: str = "sglang",
    version: tuple[int, ...] | None = None,
    sm: int | None = None,
) -> Fit:
    """The smallest power-of-two GPU count up to `available` that holds the model at a TP the planner
    would choose; else the largest such TP, marked as not fitting (the plan warns). `speculative`: the
    playbook asks for speculative decoding on the model's MTP heads (the draft's KV cache is counted).
    `version`: the engine's, whose own memory budget counts (fleet.plan.memory)."""

    def at(n: int) -> Budget:
        return budget(model, memory_mib, mem_fraction, engine, version, MemoryWishes(tp=n, speculative=speculative))

    context = context_length or model.context_length
    usable = [n for n in (1 << i for i in range(7)) if n <= available and tp_splits(model, n)] or [1]
    draft = model.mtp_layers if speculative else 0
    if not model.weights_bytes:
        return Fit(usable[-1], f"the weights' size is unknown (no safetensors index): TP {usable[-1]}", fits=False)
    for n in usable:
        weights = model.weights_bytes / n
        per_token = kv_bytes_per_token(model, n, context, draft, engine, version, sm)
        room = at(n)  # with SGLang's own budget, one prefill step's cache too, as pre-flight asks
        kv = per_token * max(context or 0, room.prefill_tokens) if per_token is not None else 0
        if weights + kv <= room.bytes:
            return Fit(n, _why(n, weights, kv, room, context, per_token is None, usable, draft))
    need = weights + kv  # those of the largest TP, the last tried
    return Fit(
        n,
        f"no TP up to {n} holds the weights and the KV cache of {context} tokens: at TP {n} they need "
        f"{need / GIB:.2f} GiB per GPU, more than {room.bytes / GIB:.2f} GiB ({room.rule}): TP {n}; "
        + what_would_fit(weights, per_token, room),
        fits=False,
    )


def what_would_fit(weights: float, per_token: int | None, room: Budget) -> str:
    """What to change when the largest TP does not hold the model. A shorter context only where the weights
    leave room for more than the cache the engine needs whatever the context (one prefill step under
    SGLang's own budget): the context does not change SGLang's mem_fraction_static."""
    least = weights + (per_token or 0) * room.prefill_tokens
    if least > room.bytes:
        step = (
            f" and one prefill step's cache ({room.prefill_tokens} tokens)" if per_token and room.prefill_tokens else ""
        )
        return (
            f"the weights{step} alone need {least / GIB:.2f} GiB: more or bigger GPUs would, a shorter "
            "context_length: would not"
        )
    if per_token:
        return f"a context_length: of at most {int((room.bytes - weights) // per_token)} tokens would, or bigger GPUs"
    return "bigger GPUs would"


def _why(
    n: int,
    weights: float,
    kv: float,
    room: Budget,
    context: int | None,
    no_kv: bool,
    usable: list[int],
    draft: int,
) -> str:
    held = f"weights {weights / GIB:.1f} GiB per GPU"
    if no_kv:
        note = " (its KV cache is not counted: the config does not give its head size)"
    elif not context:
        note = " (no context length known: the KV cache is not counted)"
    else:
        drafts = " (with the MTP draft's)" if draft else ""
        held += f" and the KV cache for {context} tokens{drafts} {kv / GIB:.1f} GiB"
        note = ""
    smaller = [u for u in usable if u < n]
    return f"{n} GPU{'s' if n > 1 else ''} (TP {n}): {held} fit in {room.bytes / GIB:.1f} GiB ({room.rule}){note}" + (
        f"; TP {smaller[-1]} would not" if smaller else ""
    )
