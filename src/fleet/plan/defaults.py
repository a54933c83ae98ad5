"""What each engine version does with a setting left alone (its default, or what became of the setting),
as data with the source of each entry: an upgrade preview says which of these change between two
versions, besides the flags fleet itself sets. Only versions the sources cover are listed; a version
outside every entry of a setting says nothing about it. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.plan.types import Version

OPEN = (9, 9, 9)  # no upper end known


@dataclass(frozen=True)
class EngineDefault:
    engine: str
    setting: str  # a flag or an environment variable
    first: Version  # the versions it holds for, both ends included
    last: Version
    does: str  # what the engine does when the setting is left alone (or what became of it)
    source: str


DEFAULTS: tuple[EngineDefault, ...] = (
    EngineDefault(
        "sglang",
        "mamba strategy (--mamba-scheduler-strategy, later --mamba-radix-cache-strategy)",
        (0, 5, 9),
        (0, 5, 13),
        "auto resolves to no_buffer: speculative decoding on a hybrid model is refused with the radix cache",
        "engines.md §1.1 (0.5.11 server_args.py L1079-1082), §2",
    ),
    EngineDefault(
        "sglang",
        "mamba strategy (--mamba-scheduler-strategy, later --mamba-radix-cache-strategy)",
        (0, 5, 14),
        OPEN,
        "auto resolves to extra_buffer with speculative decoding on a hybrid model",
        "engines.md §1.2, §2 (0.5.14-0.5.23)",
    ),
    EngineDefault(
        "sglang",
        "SGLANG_ENABLE_SPEC_V2",
        (0, 5, 0),
        (0, 5, 10),
        "False: speculative decoding runs without the overlap scheduler (spec v1)",
        "engines.md §1.9 (environ.py EnvBool(False))",
    ),
    EngineDefault(
        "sglang",
        "SGLANG_ENABLE_SPEC_V2",
        (0, 5, 11),
        (0, 5, 13),
        "True: speculative decoding keeps the overlap scheduler (spec v2)",
        "engines.md §1.9 (0.5.11 environ.py L459)",
    ),
    EngineDefault(
        "sglang",
        "SGLANG_ENABLE_SPEC_V2",
        (0, 5, 14),
        OPEN,
        "not read any more: setting it changes nothing",
        "engines.md §1.1, §1.9 (removed from environ.py in 0.5.14)",
    ),
    EngineDefault(
        "sglang",
        "--cuda-graph-max-bs",
        (0, 5, 5),
        (0, 5, 13),
        "a flag of its own (left alone: picked from GPU memory)",
        "engines.md §1.1, §1.8",
    ),
    EngineDefault(
        "sglang",
        "--cuda-graph-max-bs",
        (0, 5, 14),
        (0, 5, 19),
        "a deprecated alias of --cuda-graph-max-bs-decode",
        "engines.md §1.1 (0.5.14 server_args.py L6350-6365)",
    ),
    EngineDefault(
        "sglang",
        "--cuda-graph-max-bs",
        (0, 5, 20),
        OPEN,
        "removed: the parser calls it ambiguous (--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill)",
        "engines.md §1.1",
    ),
    EngineDefault(
        "sglang",
        "--fp4-gemm-backend",
        (0, 5, 11),
        (0, 5, 11),
        "auto selects flashinfer_cudnn on SM120, flashinfer_cutlass otherwise",
        "engines.md §1.5 (0.5.11 server_args.py L5344)",
    ),
    EngineDefault(
        "sglang",
        "--fp4-gemm-backend",
        (0, 5, 23),
        (0, 5, 23),
        "auto selects flashinfer_cutedsl on SM100, marlin on SM80-SM90, flashinfer_cutlass otherwise (SM120 too)",
        "engines.md §1.5 (0.5.23 fields/exec_.py L282)",
    ),
    EngineDefault(
        "sglang",
        "--disable-cuda-graph",
        (0, 5, 11),
        (0, 5, 11),
        "a flag of its own",
        "engines.md §1.8 (0.5.11 server_args.py L5999)",
    ),
    EngineDefault(
        "sglang",
        "--disable-cuda-graph",
        (0, 5, 23),
        (0, 5, 23),
        "deprecated: use --cuda-graph-backend-decode/--cuda-graph-backend-prefill=disabled",
        "engines.md §1.8 (0.5.23 server_args.py L411)",
    ),
)


def _held(engine: str, setting: str, version: Version | None) -> EngineDefault | None:
    if version is None:
        return None
    return next(
        (d for d in DEFAULTS if d.engine == engine and d.setting == setting and d.first <= version <= d.last), None
    )


def default_changes(engine: str, now: Version | None, then: Version | None) -> list[str]:
    """Lines for an upgrade preview: each setting whose default (or fate) differs between the two versions
    where both are covered by the data."""
    out = []
    for setting in dict.fromkeys(d.setting for d in DEFAULTS if d.engine == engine):
        a, b = _held(engine, setting, now), _held(engine, setting, then)
        if a is not None and b is not None and a.does != b.does:
            out.append(f"~ default {setting}: {a.does} -> {b.does}  ({b.source})")
    return out
