"""What each engine version does with a setting left alone (its default, or what became of the setting),
as data with the source of each entry: an upgrade preview says which of these change between two
versions, besides the flags fleet itself sets. Only versions the sources cover are listed; a version
outside every entry of a setting says nothing about it. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from fleet.model import ModelSpec
from fleet.plan import picks
from fleet.plan.memory import gpu_defaults, read_as_newest, sglang_mem_fraction
from fleet.plan.preflight import memory_wishes, tp_of
from fleet.plan.types import GpuSummary, LaunchPlan, Version, show_version

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


def plan_default_changes(
    model: ModelSpec | None, gpus: GpuSummary | None, now: LaunchPlan, then: LaunchPlan
) -> list[str]:
    """`default_changes`, and what changes for this plan on its GPU (where the model and GPUs are known)
    among the settings both command lines leave to SGLang: its memory fraction, prefill chunk and CUDA-graph
    batch, and its backend picks."""
    out = default_changes(then.engine, now.engine_version, then.engine_version)
    a, b = now.engine_version, then.engine_version
    if then.engine != "sglang" or a is None or b is None or a == b or model is None or gpus is None:
        return out

    def left(*flags: str) -> bool:
        return all(p.flag(f) is None for p in (now, then) for f in flags)

    source = f"SGLang {show_version(a)} -> {show_version(b)} on {gpus.name}, fleet.plan.memory"
    if left("--mem-fraction-static"):
        was, will = (
            sglang_mem_fraction(v, gpus.memory_mib, model, memory_wishes(p, tp_of(p))) for v, p in ((a, now), (b, then))
        )
        if round(was, 3) != round(will, 3):
            out.append(f"~ default memory fraction: {was:.3f} -> {will:.3f} of each GPU  ({source})")
    sizes = [gpu_defaults(gpus.memory_mib, tp_of(p), read_as_newest(v)) for v, p in ((a, now), (b, then))]
    for i, (name, flags) in enumerate(
        (
            ("chunked prefill", ("--chunked-prefill-size",)),
            ("CUDA graph max batch", ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")),
        )
    ):
        if left(*flags) and sizes[0][i] != sizes[1][i]:
            out.append(f"~ default {name}: {sizes[0][i]} -> {sizes[1][i]}  ({source})")
    spec = then.flag("--speculative-algorithm") is not None
    for setting in picks.SETTINGS:
        if not picks.relevant(setting, model) or not left(*picks.FLAGS[setting]):
            continue
        # followed to what `auto` becomes at load where fleet knows that, else as resolution leaves it
        was_pick, pick = (
            picks.engine_pick(setting, model, gpus, v, spec, {}) or picks.resolved_pick(setting, model, gpus, v, spec)
            for v in (a, b)
        )
        if (
            was_pick is not None
            and pick is not None
            and (was_pick.value, was_pick.effective) != (pick.value, pick.effective)
        ):
            out.append(f"~ SGLang picks {setting}: {was_pick.describe()} -> {pick.describe()}")
    return out
