"""What SGLang picks by itself for the settings fleet's rules may set (attention backend, mamba strategy,
MoE runner, FP4 GEMM backend), and which of its picks are known to fail, with the evidence. Pure.

A rule keyed on a setting (`Rule.keyed_on`) sets it only where the engine's own pick is known to fail on
that GPU and version, or is not known; elsewhere the engine's pick stands (a pin writes it down). The
picks come from the engine itself when its check on the host told them (the act step resolves the
command line without fleet's keyed flags and says what SGLang chose), else from `PICKS`: each row was
read from SGLang's own resolution on a fake GPU of that architecture, and tests/test_plan_matrix.py
holds every row to the real resolution of both pinned versions on every cell of the matrix. What
resolution leaves as `auto` is decided at model load by the quantisation method; `at_load` says what
that code picks, with its file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from fleet.model import ModelSpec
from fleet.plan.types import GpuSummary, Version, show_version

ATTENTION, MAMBA, MOE_RUNNER, FP4_GEMM = "attention", "mamba strategy", "MoE runner", "FP4 GEMM"
SETTINGS = (ATTENTION, MAMBA, MOE_RUNNER, FP4_GEMM)  # the names the engine's check reports them by
# the SGLang flags that set each (the mamba flag's spelling is the version's: fleet.plan.rules.spell)
FLAGS = {
    ATTENTION: ("--attention-backend",),
    MAMBA: ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
    MOE_RUNNER: ("--moe-runner-backend",),
    FP4_GEMM: ("--fp4-gemm-backend",),
}
MEASURED = "SGLang {v}'s resolution on {arch}"  # on a fake GPU; tests/test_plan_matrix.py checks each row


@dataclass(frozen=True)
class Pick:
    setting: str
    value: str  # what the engine's resolution leaves in its record
    source: str
    at_load: str = ""  # what `auto` becomes when the model loads, where code decides it then

    @property
    def effective(self) -> str:
        return self.at_load or self.value

    def describe(self) -> str:
        if self.at_load and self.at_load != self.value:
            return f"{self.value}, which becomes {self.at_load} at model load ({self.source})"
        return f"{self.value} ({self.source})"

    def where(self) -> str:
        """Where the pick comes from, for a line that already names its value."""
        if self.at_load and self.at_load != self.value:
            return f"{self.value} at resolution, {self.at_load} at model load: {self.source}"
        return self.source


def attention_kind(model: ModelSpec) -> str:
    """The model's kind as SGLang's default attention choice tells them apart (0.5.11 server_args.py
    `_get_default_attn_backend` and the model-specific adjustments before it)."""
    if model.mla:
        return "mla"
    if model.attention_sinks:
        return "sinks"
    return "hybrid" if model.hybrid else "mha"


@dataclass(frozen=True)
class PickRow:
    setting: str
    first: Version
    last: Version
    sm: tuple[int, int]  # compute capability range as 80..89, both ends included
    when: Callable[[ModelSpec, bool], bool]  # (model, speculative decoding on)
    value: str
    source: str
    at_load: str = ""


def _kind(*kinds: str) -> Callable[[ModelSpec, bool], bool]:
    return lambda m, spec: attention_kind(m) in kinds


V11, V23 = (0, 5, 11), (0, 5, 23)
AMPERE_ADA, HOPPER, SM100, SM120 = (80, 89), (90, 90), (100, 103), (120, 121)
ARCH_NAMES = {AMPERE_ADA: "SM80-SM89", HOPPER: "SM90", SM100: "SM100", SM120: "SM120", (80, 121): "SM80-SM121"}


def _measured(
    setting: str,
    versions: tuple[Version, ...],
    sm: tuple[int, int],
    when: Callable[[ModelSpec, bool], bool],
    value: str,
) -> list[PickRow]:
    return [
        PickRow(setting, v, v, sm, when, value, MEASURED.format(v=show_version(v), arch=ARCH_NAMES[sm]))
        for v in versions
    ]


BOTH = (V11, V23)


def _bf16_glm4_moe(m: ModelSpec, spec: bool) -> bool:
    return m.architecture == "Glm4MoeForCausalLM" and m.quantization == "bf16"


def _mxfp4_moe(m: ModelSpec, spec: bool) -> bool:
    return m.quantization == "mxfp4" and m.moe


PICKS: tuple[PickRow, ...] = (
    # attention: FA3 on Hopper and trtllm_mha on SM100 (0.5.11 server_args.py `_get_default_attn_backend`),
    # FlashInfer elsewhere, but triton for gpt-oss's attention sinks, which FlashInfer lacks; MLA models
    # trtllm_mla on SM100 and triton on SM120 (the model-specific adjustments); hybrid GDN models as MHA
    *_measured(ATTENTION, BOTH, HOPPER, _kind("mha", "hybrid", "sinks"), "fa3"),
    *_measured(ATTENTION, BOTH, SM100, _kind("mha", "hybrid", "sinks"), "trtllm_mha"),
    *_measured(ATTENTION, BOTH, AMPERE_ADA, _kind("mha", "hybrid"), "flashinfer"),
    *_measured(ATTENTION, BOTH, SM120, _kind("mha", "hybrid"), "flashinfer"),
    *_measured(ATTENTION, BOTH, AMPERE_ADA, _kind("sinks"), "triton"),
    *_measured(ATTENTION, BOTH, SM120, _kind("sinks"), "triton"),
    *_measured(ATTENTION, BOTH, SM100, _kind("mla"), "trtllm_mla"),
    *_measured(ATTENTION, BOTH, SM120, _kind("mla"), "triton"),
    # a hybrid model's mamba strategy: auto resolves to no_buffer up to 0.5.13 (engines.md §1.1), from
    # 0.5.14 to extra_buffer with the radix cache and the overlap scheduler on (engines.md §1.2)
    *_measured(MAMBA, (V11,), (80, 121), _kind("hybrid"), "no_buffer"),
    *_measured(MAMBA, (V23,), (80, 121), lambda m, spec: m.hybrid and spec, "extra_buffer"),
    # an NVFP4 checkpoint's MoE runner and FP4 GEMM backend on SM120: `auto` survives resolution (AT_LOAD)
    *_measured(MOE_RUNNER, BOTH, SM120, lambda m, spec: m.nvfp4 and m.moe, "auto"),
    *_measured(FP4_GEMM, BOTH, SM120, lambda m, spec: m.nvfp4, "auto"),
    # MoE runners an upgrade changes (fleet.plan.defaults): GLM-4.5's bf16 experts on SM100, gpt-oss's MXFP4
    # experts on SM120
    *_measured(MOE_RUNNER, (V11,), SM100, _bf16_glm4_moe, "auto"),
    *_measured(MOE_RUNNER, (V23,), SM100, _bf16_glm4_moe, "flashinfer_trtllm"),
    *_measured(MOE_RUNNER, (V11,), SM120, _mxfp4_moe, "triton_kernel"),
    *_measured(MOE_RUNNER, (V23,), SM120, _mxfp4_moe, "flashinfer_mxfp4"),
)


@dataclass(frozen=True)
class AtLoad:
    """What `auto` left by resolution becomes when the model loads, as the engine's code decides it."""

    setting: str
    first: Version
    last: Version
    sm: tuple[int, int]
    when: Callable[[ModelSpec], bool]
    value: str
    source: str


AT_LOAD: tuple[AtLoad, ...] = (
    AtLoad(MOE_RUNNER, (0, 5, 11), V23, (100, 121), lambda m: m.nvfp4 and m.moe, "flashinfer_trtllm",
           "ModelOptNvFp4FusedMoEMethod.create_moe_runner maps auto to FLASHINFER_TRTLLM from SM100 up, SM120 "
           "included (0.5.11 modelopt_quant.py L1984, 0.5.23 L3117; engines.md §1.4)"),
    AtLoad(FP4_GEMM, V11, V11, SM120, lambda m: m.nvfp4, "flashinfer_cudnn",
           "auto selects flashinfer_cudnn on SM120 (0.5.11 server_args.py L5344; engines.md §1.5)"),
    AtLoad(FP4_GEMM, V23, V23, SM120, lambda m: m.nvfp4, "flashinfer_cutlass",
           "auto selects flashinfer_cutlass on SM120 (0.5.23 fields/exec_.py L282; engines.md §1.5)"),
)  # fmt: skip


@dataclass(frozen=True)
class Failing:
    setting: str
    values: frozenset[str]  # effective picks (Pick.effective)
    when: Callable[[ModelSpec, GpuSummary, Version | None, bool], bool]  # model, GPUs, version, spec on
    evidence: str


FAILING: tuple[Failing, ...] = (
    Failing(
        ATTENTION,
        frozenset({"trtllm_mha", "fa4", "fa3"}),
        lambda m, g, v, spec: m.hybrid and g.consumer_blackwell,
        "trtllm_mha's prefill exists only on SM100 and FlashInfer's trtllm-gen FMHA raises 'Unsupported "
        "architecture' on SM120; fa4 is outside the SM120 allow-list for hybrid GDN models; fa3 is built for SM90 "
        "(engines.md §1.6; sglang #9140, #24633)",
    ),
    Failing(
        MAMBA,
        frozenset({"no_buffer"}),
        lambda m, g, v, spec: m.hybrid and spec,
        "no_buffer refuses NEXTN with the radix cache: ValueError at start-up (engines.md §2.1; sglang #27418)",
    ),
    Failing(
        MAMBA,
        frozenset({"no_buffer"}),
        lambda m, g, v, spec: m.hybrid and not spec,
        "no_buffer turns the overlap scheduler off ('Disabling overlap schedule since mamba no_buffer is not "
        "compatible', engines.md §1.2); extra_buffer keeps it",
    ),
    Failing(
        MOE_RUNNER,
        frozenset({"flashinfer_trtllm", "flashinfer_trtllm_routed"}),
        lambda m, g, v, spec: m.nvfp4 and m.moe and g.consumer_blackwell,
        "FlashInfer's trtllm-gen FP4 MoE kernels exist only for SM100/SM103/SM110 (engines.md §1.4; flashinfer "
        "#3670, sglang PR #39807)",
    ),
    Failing(
        MOE_RUNNER,
        frozenset({"flashinfer_cutedsl"}),
        lambda m, g, v, spec: m.nvfp4 and m.moe and g.consumer_blackwell,
        "flashinfer_cutedsl's NVFP4 MoE produces garbage output on SM120 (flashinfer #2723)",
    ),
)


def resolved_pick(setting: str, model: ModelSpec, gpus: GpuSummary, version: Version | None, spec: bool) -> Pick | None:
    """What the engine's resolution leaves in its record for `setting` (an `auto` not followed), by the table."""
    row = next(
        (
            r
            for r in PICKS
            if version is not None and r.setting == setting and r.first <= version <= r.last
            and r.sm[0] <= gpus.sm <= r.sm[1] and r.when(model, spec)
        ),
        None,
    )  # fmt: skip
    return None if row is None else Pick(setting, row.value, row.source)


def engine_pick(
    setting: str, model: ModelSpec, gpus: GpuSummary, version: Version | None, spec: bool, told: Mapping[str, str]
) -> Pick | None:
    """What the engine picks for `setting` when fleet leaves it alone: as the engine told (its check on this
    host), else the table's row for this version and GPU, else None (not known). An `auto` is followed to
    what the engine's code picks at model load; where fleet does not know that, the pick is not known."""
    if setting in told:
        pick: Pick | None = Pick(setting, told[setting], f"told by SGLang {show_version(version)}'s check on this host")
    else:
        pick = resolved_pick(setting, model, gpus, version, spec)
    if pick is None or pick.value != "auto":
        return pick
    load = next(
        (
            a
            for a in AT_LOAD
            if version is not None and a.setting == setting and a.first <= version <= a.last
            and a.sm[0] <= gpus.sm <= a.sm[1] and a.when(model)
        ),
        None,
    )  # fmt: skip
    if load is None:  # `auto` is decided at load by code fleet has not read for this version: not known
        return None
    return replace(pick, at_load=load.value, source=f"{pick.source}; {load.source}")


def failing(pick: Pick, model: ModelSpec, gpus: GpuSummary, version: Version | None, spec: bool) -> Failing | None:
    """The known failure of the engine's pick on these GPUs, or None where none is known."""
    return next(
        (
            f
            for f in FAILING
            if f.setting == pick.setting and pick.effective in f.values and f.when(model, gpus, version, spec)
        ),
        None,
    )


PICK_WORD = re.compile(r"[\w.-]{1,40}")  # a backend's name: "refused: ..." and anything odd are not picks


def told_picks(said: object) -> dict[str, str]:
    """The engine's own picks as a host said them (its check's answer, or the record fleet left there):
    only the settings keyed rules decide on, each a plain word. A setting the engine refused to resolve
    without fleet's flags ("refused: ...") says only that they are needed, and is left out."""
    if not isinstance(said, dict):
        return {}
    return {k: v for k, v in said.items() if k in SETTINGS and isinstance(v, str) and PICK_WORD.fullmatch(v)}


def relevant(setting: str, model: ModelSpec) -> bool:
    """Whether the setting means anything for this model (shown among what fleet leaves to the engine)."""
    if setting == MAMBA:
        return model.hybrid
    if setting == MOE_RUNNER:
        return model.moe
    if setting == FP4_GEMM:
        return model.nvfp4
    return True
