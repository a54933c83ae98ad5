"""How a deployment whose playbook leaves `gpus:` out uses the host: every free GPU, as one tensor-parallel
group, or as data-parallel replicas of a smaller one where the interconnect favours that. Pure.

A user who types `fleet deploy MODEL --host BOX` expects the box to serve, not half of it to idle (the
engines' own recipes use the whole box). `gpus: fit` still takes as few GPUs as the model needs, for
packing several deployments on one host (fleet.plan.fit).

- NVLink: one TP group over the largest power of two of the free GPUs that splits the attention heads;
  all-reduce is cheap there and a larger TP leaves more room for the KV cache.
- PCIe only, a dense model that a smaller TP holds: that TP, times as many data-parallel replicas as the
  free GPUs take. Each request's all-reduce stays within a small group (above two PCIe GPUs the engines
  turn custom all-reduce off) and the replicas answer requests side by side: SGLang's DP "replicates the
  entire model across multiple GPU sets ... throughput could be multiplied nearly linearly"
  (docs.sglang.io advanced_features/dp_dpa_smg_guide); vLLM's --data-parallel-size does the same.
- An embedding model or a cross-encoder, on any interconnect: the smallest TP that holds it, times as many
  data-parallel replicas as the free GPUs take. Such a server decodes nothing and keeps no KV cache
  between requests (each is one prefill), so a larger TP buys it no room, only an all-reduce per layer of
  every request; replicas multiply its throughput (the same SGLang guide, vLLM's pooling models likewise).
- PCIe only, a MoE or hybrid (Gated-DeltaNet/mamba) model: one TP group, as the engines' recipes run them
  (the motivating Qwen3.5-397B-NVFP4 at TP 8 on the 8x RTX PRO 6000 box). A replica per group would copy
  every expert, and expert-parallel or DP-attention layouts are the operator's call (extra_args).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.model import ModelSpec
from fleet.plan.fit import Fit
from fleet.plan.rules import largest_tp


@dataclass(frozen=True)
class Shape:
    tp: int
    dp: int  # data-parallel replicas, each a TP group of its own, behind the engine's one port
    why: str
    fits: bool = True

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


def whole_box(model: ModelSpec, free: int, nvlink: bool, fit: Fit) -> Shape:
    """`fit`: the smallest TP that holds the model, found among the `free` GPUs (fleet.plan.fit)."""
    whole = largest_tp(model, free)
    left = f"; {free - whole} of the {free} free GPUs stay free (no larger TP splits its heads)" if free > whole else ""
    if not fit.fits:
        return Shape(whole, 1, f"TP {whole} over the free GPUs: {fit.why}{left}", fits=False)
    smallest = fit.gpus
    pooling = not model.generates
    if (pooling or not nvlink) and smallest < whole and not model.moe and not model.hybrid:
        dp = free // smallest
        unused = free - dp * smallest
        rest = f"; {unused} GPU{'s' if unused > 1 else ''} stay free" if unused else ""
        kind = (
            "an embedding or reranker server only prefills, so replicas answer side by side"
            if pooling
            else f"PCIe only: each replica's all-reduce stays on {smallest} GPU{'s' if smallest > 1 else ''}"
        )
        return Shape(
            smallest,
            dp,
            f"the host's {free} free GPUs as TP {smallest} x {dp} data-parallel replicas ({kind}; {fit.why}){rest}",
        )
    if nvlink:
        kind = "NVLink"
    elif model.moe or model.hybrid:
        kind = f"PCIe only, but {'a MoE' if model.moe else 'a hybrid'} model runs as one TP group"
    else:
        kind = "PCIe only, and no smaller TP holds it"
    holds = (
        fit.why if smallest == whole else f"TP {smallest} would hold it; TP {whole} leaves more room for the KV cache"
    )
    return Shape(whole, 1, f"the host's {free} free GPUs as TP {whole} ({kind}; {holds}){left}")
