"""Command lines known to crash (`KNOWN_CRASHES`): the flags fleet's rules know will fail, each with why and
where that was seen. A user's own flags are still passed; `lint` flags them in the plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fleet.plan.rules import (
    GRAPH_NEW,
    GRAPH_OLD,
    MAMBA_NEW,
    MAMBA_OLD,
    OLD_NAMES_REMOVED,
    RENAMED,
    PlanInput,
    args_dict,
)
from fleet.plan.types import Flag, Verdict


@dataclass(frozen=True)
class KnownCrash:
    id: str
    engine: str
    when: Callable[[PlanInput, dict[str, str | None]], bool]
    message: str


def _has(args: dict[str, str | None], name: str) -> bool:
    return name in args


def _spec_on(args: dict[str, str | None]) -> bool:
    return (args.get("--speculative-algorithm") or "").upper() in ("NEXTN", "EAGLE", "EAGLE3")


KNOWN_CRASHES: tuple[KnownCrash, ...] = (
    KnownCrash(
        "spec-params-incomplete",
        "sglang",
        lambda i, a: (
            _spec_on(a)
            and not _has(a, "--speculative-num-steps")
            and (_has(a, "--speculative-eagle-topk") or _has(a, "--speculative-num-draft-tokens"))
        ),
        "draft-tokens/topk without --speculative-num-steps: bare AssertionError at startup (engines.md §2.1)",
    ),
    KnownCrash(
        "hybrid-spec-no-buffer",
        "sglang",
        lambda i, a: (
            _spec_on(a)
            and i.model.hybrid
            and i.v_in((0, 5, 10), (0, 5, 13))
            and a.get(MAMBA_OLD) != "extra_buffer"
            and not _has(a, "--disable-radix-cache")
        ),
        "NEXTN on a hybrid GDN model without --mamba-scheduler-strategy extra_buffer: ValueError at startup on "
        "0.5.10-0.5.13 (engines.md §2.1)",
    ),
    KnownCrash(
        "old-mamba-flag",
        "sglang",
        lambda i, a: _has(a, MAMBA_OLD) and i.version is not None and i.version >= OLD_NAMES_REMOVED,
        f"{MAMBA_OLD} was removed in 0.5.20: 'unrecognized arguments' (use {MAMBA_NEW})",
    ),
    KnownCrash(
        "new-mamba-flag-too-early",
        "sglang",
        lambda i, a: _has(a, MAMBA_NEW) and i.version is not None and i.version < RENAMED,
        f"{MAMBA_NEW} exists only from 0.5.14: 'unrecognized arguments' (use {MAMBA_OLD})",
    ),
    KnownCrash(
        "ambiguous-cuda-graph-flag",
        "sglang",
        lambda i, a: _has(a, GRAPH_OLD) and i.version is not None and i.version >= OLD_NAMES_REMOVED,
        f"{GRAPH_OLD} is ambiguous from 0.5.20 (use {GRAPH_NEW})",
    ),
    KnownCrash(
        "sm120-nvfp4-trtllm-moe",
        "sglang",
        lambda i, a: (
            i.model.nvfp4
            and i.model.moe
            and i.gpus.consumer_blackwell
            and a.get("--moe-runner-backend", "auto") in ("auto", "flashinfer_trtllm", None)
        ),
        "SM120 NVFP4 MoE with the auto/flashinfer_trtllm runner: no trtllm-gen kernels for SM120 (engines.md §1.4)",
    ),
    KnownCrash(
        "sm120-nvfp4-cutedsl-garbage",
        "sglang",
        lambda i, a: (
            i.model.nvfp4
            and i.model.moe
            and i.gpus.consumer_blackwell
            and a.get("--moe-runner-backend") == "flashinfer_cutedsl"
        ),
        "flashinfer_cutedsl NVFP4 MoE on SM120 produces garbage output (flashinfer #2723)",
    ),
    KnownCrash(
        "spec-extra-buffer-runtime-typeerror",
        "sglang",
        lambda i, a: (
            _spec_on(a)
            and i.model.hybrid
            and i.v_in((0, 5, 13), (0, 5, 14))
            and "extra_buffer" in (a.get(MAMBA_OLD), a.get(MAMBA_NEW))
        ),
        "extra_buffer + spec v2 crashes at runtime on 0.5.13-0.5.14 (TypeError in "
        "set_mamba_track_indices_from_reqs, sglang #28484); no flag fixes it: use 0.5.12 or >= 0.5.15, or "
        "turn speculative decoding off",
    ),
)


def lint(i: PlanInput, flags: tuple[Flag, ...]) -> list[Verdict]:
    words = [w for f in flags for w in f.words()]
    a = args_dict(words)
    return [Verdict("crash", k.id, k.message) for k in KNOWN_CRASHES if k.engine == i.wishes.engine and k.when(i, a)]
