"""SGLang's weight cache daemon under a deployment (playbook `weight_cache: true`): which plans may use it,
and the daemon's own command line.

The daemon (`python -m sglang.srt.weight_cache.daemon`, SGLang 0.5.23) loads the model once, one process
per TP rank, and hands the loaded, sharded weights to each engine started with `--weight-cache-mode
client` over CUDA IPC, after checking that the engine's configuration equals its own (its CacheConfig:
model, TP/PP/EP sizes, quantisation, dtype, revision, GPU capability, torch version). fleet starts it
with the engine's flags but those that only decide how the engine serves (RUNTIME_ONLY), so that a fix
to one of those (the CUDA-graph batch, the memory fraction) relaunches the engine against the same
daemon; its `key` says when it must be started again.
"""

from __future__ import annotations

import hashlib
import json

from fleet.model import ModelSpec
from fleet.plan.types import LaunchPlan, Verdict, Version, show_version

DAEMON_MODULE = "sglang.srt.weight_cache.daemon"
FIRST_VERSION: Version = (0, 5, 23)
RULE = "weight-cache"
# The engine flags that only decide how the engine serves, never how the weights are loaded and prepared:
# left out of the daemon's command line and its key, so a fix to one of them (the CUDA-graph batch, the
# memory fraction, a mamba strategy, NCCL's all-reduce) relaunches against the same daemon. Every other
# flag goes to the daemon as SGLang's own daemon mode passes the whole ServerArgs: a backend can change
# how the weights are post-processed (DeepGEMM's MoE runner requantises block-FP8 scales, aiter shuffles).
RUNTIME_ONLY = frozenset(
    {
        "--host",
        "--port",
        "--nccl-port",
        "--served-model-name",
        "--api-key",
        "--mem-fraction-static",
        "--max-running-requests",
        "--max-total-tokens",
        "--max-prefill-tokens",
        "--chunked-prefill-size",
        "--context-length",
        "--cuda-graph-max-bs",
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
        "--disable-cuda-graph",
        "--disable-piecewise-cuda-graph",
        "--disable-radix-cache",
        "--disable-overlap-schedule",
        "--disable-custom-all-reduce",
        "--mamba-scheduler-strategy",
        "--mamba-radix-cache-strategy",
        "--mamba-track-interval",
        "--reasoning-parser",
        "--tool-call-parser",
        "--enable-metrics",
        "--skip-server-warmup",
        "--watchdog-timeout",
        "--log-level",
        "--random-seed",
        "--weight-cache-mode",
        "--weight-cache-socket",
        "--weight-cache-timeout",
    }
)
# The environment that decides which GPUs the daemon loads on, and SGLang's own switches
DAEMON_ENV = ("CUDA_VISIBLE_DEVICES",)
DAEMON_ENV_PREFIX = "SGLANG_"


def daemon_argv(plan: LaunchPlan) -> list[str]:
    words = [plan.python, "-m", DAEMON_MODULE]
    for f in plan.flags:
        if f.name not in RUNTIME_ONLY:
            words += f.words()
    return words


def daemon_key(plan: LaunchPlan) -> str:
    """What a running daemon must have been started with for an engine of `plan` to use it: its command
    line, its GPUs and SGLang's variables, and the engine's version (a new torch or SGLang is a
    CacheConfig mismatch)."""
    env = {e.name: e.value for e in plan.env if e.name in DAEMON_ENV or e.name.startswith(DAEMON_ENV_PREFIX)}
    text = json.dumps([daemon_argv(plan), env, show_version(plan.engine_version)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ranks(plan: LaunchPlan) -> int:
    """The daemon's processes: one per pipeline and tensor rank, each on its own GPU."""
    counts = [int(f.value) for f in plan.flags if f.name in ("--tp-size", "--pp-size") and f.value]
    return max(1, counts[0] * (counts[1] if len(counts) > 1 else 1)) if counts else 1


def _ipc_quantisation(model: ModelSpec, plan: LaunchPlan) -> str | None:
    """Why the daemon cannot share this model's weights (None: it can). SGLang verifies unquantised and
    block-wise FP8 weights only and refuses any other method at load (protocol.py IPC_QUANT_ALLOWLIST)."""
    told = plan.flag("--quantization")
    method = told.value if told is not None else model.sglang_quantization
    if method is None:
        return None
    if method == "fp8" and told is None and model.fp8_blocks:
        return None
    kind = "per-tensor FP8" if method == "fp8" else repr(method)
    return f"its weights are {kind}; SGLang shares unquantised and block-wise FP8 weights only"


def refusals(where: str, model: ModelSpec, plan: LaunchPlan) -> list[Verdict]:
    """Why `plan` cannot run against a weight cache daemon, each with what to do; none when it can."""
    why: list[str] = []
    version = plan.engine_version
    if plan.engine != "sglang":
        why.append(f"{plan.engine} has no weight cache daemon")
    elif version is not None and version < FIRST_VERSION:
        why.append(f"SGLang {show_version(version)} has no weight cache daemon (0.5.23 has): upgrade the engine")
    if plan.flag("--speculative-algorithm") is not None:
        why.append("SGLang refuses it with speculative decoding (the daemon does not export the draft model's weights)")
    dp = plan.flag("--dp-size")
    if dp is not None and dp.value not in (None, "1"):
        why.append("its daemon serves one TP group; this plan runs data-parallel replicas")
    if plan.flag("--nnodes") is not None:
        why.append("fleet runs it on one host; this plan spans several")
    if plan.container is not None:
        why.append("fleet runs it beside a server process, not in a container")
    quant = _ipc_quantisation(model, plan)
    if quant:
        why.append(quant)
    return [
        Verdict("error", RULE, f"{where}: weight_cache: is not possible here: {w}. Leave weight_cache: out.")
        for w in why
    ]
