"""How many GPUs a model needs (playbook `gpus: fit`): the smallest tensor-parallel size whose share of the
weights and the KV cache for one request of the whole context fit in each GPU, so the host's other GPUs
stay free for other deployments or a service's replicas. Pure.

The KV cache counts the full-attention layers only (Gated-DeltaNet/mamba layers keep a fixed-size state),
with the KV heads split over the ranks and replicated when there are fewer heads than ranks, in the
checkpoint's dtype (FP8 when it quantises the KV cache). A model that does not say its head size (MLA
models such as DeepSeek-V3 compress their cache) is fitted by its weights alone, and the reason says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.model import ModelSpec

WEIGHTS_AND_KV_MAX_SHARE = 0.85  # as pre-flight's fit check: the rest is activations and CUDA graphs
GIB = 1 << 30


@dataclass(frozen=True)
class Fit:
    gpus: int
    why: str


def kv_bytes_per_token(model: ModelSpec, tp: int) -> int | None:
    """One token's keys and values on one of `tp` ranks, or None when the config does not say enough."""
    if not model.head_dim or not model.num_kv_heads or not model.num_layers:
        return None
    full_attention = model.num_layers - len(model.linear_attention_layers)
    heads_per_rank = -(-model.num_kv_heads // tp)  # replicated when fewer heads than ranks
    dtype_bytes = 1 if model.kv_cache_quant and "FP8" in model.kv_cache_quant.upper() else 2
    return 2 * full_attention * heads_per_rank * model.head_dim * dtype_bytes


def fit_gpus(model: ModelSpec, memory_mib: int, available: int, context_length: int | None) -> Fit:
    """The smallest power-of-two GPU count up to `available` that holds the model (its TP dividing the
    attention heads); `available` when none does (pre-flight then says why it does not fit)."""
    budget = memory_mib * (1 << 20) * WEIGHTS_AND_KV_MAX_SHARE
    context = context_length or model.context_length
    n = 1
    while n <= available:
        heads_ok = not model.num_attention_heads or model.num_attention_heads % n == 0
        weights = (model.weights_bytes or 0) / n
        per_token = kv_bytes_per_token(model, n)
        kv = per_token * context if per_token is not None and context else 0
        if heads_ok and weights + kv <= budget:
            return Fit(n, _why(n, weights, kv, budget, context, per_token is None))
        n *= 2
    return Fit(available, f"no power-of-two TP up to {available} holds it: all {available} GPUs")


def _why(n: int, weights: float, kv: float, budget: float, context: int | None, no_kv: bool) -> str:
    held = f"weights {weights / GIB:.1f} GiB per GPU"
    if no_kv:
        note = " (its KV cache is not counted: the config does not give its head size)"
    elif not context:
        note = " (no context length known: the KV cache is not counted)"
    else:
        held += f" and the KV cache for {context} tokens {kv / GIB:.1f} GiB"
        note = ""
    return (
        f"{n} GPU{'s' if n > 1 else ''} (TP {n}): {held} fit in {budget / GIB:.1f} GiB "
        f"({WEIGHTS_AND_KV_MAX_SHARE:.0%} of each GPU){note}" + ("" if n == 1 else f"; TP {n // 2} would not")
    )
