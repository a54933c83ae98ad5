"""ModelSpec × host GPUs × engine version × playbook wishes × learned fixes → LaunchPlan. Pure.

Rules are data (`SGLANG_RULES`, `VLLM_RULES`, `KNOWN_CRASHES`): each has an id, a condition, what
it emits and why, with the engines.md section or public issue it comes from. The planner never
imports the transport or performs I/O; pre-flight verdicts are values, the caller decides.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from fleet.model import ModelSpec

Version = tuple[int, int, int]


def parse_version(text: str | None) -> Version | None:
    if not text:
        return None
    parts: list[int] = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    if not parts:
        return None
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def show_version(v: Version | None) -> str:
    return "unknown" if v is None else ".".join(map(str, v))


@dataclass(frozen=True)
class GpuSummary:
    name: str
    count: int
    sm: int  # compute capability as 120 (SM120), 100 (SM100), 86 (SM86)
    memory_mib: int  # per GPU
    nvlink: bool

    @property
    def blackwell(self) -> bool:
        return self.sm >= 100

    @property
    def consumer_blackwell(self) -> bool:
        """SM120/SM121 (RTX PRO 6000, RTX 5090, GB10): no tcgen05, no trtllm-gen kernels."""
        return 120 <= self.sm < 130


@dataclass(frozen=True)
class Wishes:
    """The playbook's part of the plan."""

    engine: str
    served_name: str
    port: int
    bind_address: str = "0.0.0.0"
    speculative: bool = False
    speculative_steps: int = 1
    speculative_topk: int = 1
    context_length: int | None = None
    mem_fraction: float | None = None
    tp: int | None = None
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    secret_env: tuple[str, ...] = ()
    literal: bool = False


@dataclass(frozen=True)
class Flag:
    name: str
    value: str | None  # None for a store_true flag
    rule: str
    reason: str
    source: str = ""

    def words(self) -> list[str]:
        return [self.name] if self.value is None else [self.name, self.value]


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    rule: str
    reason: str


@dataclass(frozen=True)
class Verdict:
    level: str  # "error" (refuse to deploy), "crash" (a flag the rules know will fail), "warning", "info"
    rule: str
    message: str


@dataclass(frozen=True)
class Fix:
    """A change to a plan that a crash signature (or a learned fix) prescribes."""

    set_flags: tuple[tuple[str, str | None], ...] = ()
    remove_flags: tuple[str, ...] = ()
    set_env: tuple[tuple[str, str], ...] = ()
    derive: str | None = None  # a named computed fix, see DERIVED_FIXES

    def describe(self) -> str:
        parts = [f"{n} {v}" if v is not None else n for n, v in self.set_flags]
        parts += [f"drop {n}" for n in self.remove_flags]
        parts += [f"{n}={v}" for n, v in self.set_env]
        if self.derive:
            parts.append(DERIVED_FIX_TEXT.get(self.derive, self.derive))
        return ", ".join(parts) or "(no change)"

    def to_json(self) -> dict[str, object]:
        return {
            "set_flags": [list(x) for x in self.set_flags],
            "remove_flags": list(self.remove_flags),
            "set_env": [list(x) for x in self.set_env],
            "derive": self.derive,
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> Fix:
        def pairs(key: str) -> tuple[tuple[str, str | None], ...]:
            raw = d.get(key) or []
            assert isinstance(raw, list)
            return tuple((str(p[0]), None if p[1] is None else str(p[1])) for p in raw)

        env = tuple((n, v or "") for n, v in pairs("set_env"))
        removes = d.get("remove_flags") or []
        assert isinstance(removes, list)
        derive = d.get("derive")
        return cls(pairs("set_flags"), tuple(str(x) for x in removes), env, str(derive) if derive else None)


@dataclass(frozen=True)
class LearnedFix:
    signature: str
    fix: Fix
    learned_at: str


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    engine_version: Version | None
    python: str
    model_path: str
    served_name: str
    port: int
    check_address: str  # where a check on the host reaches the server
    flags: tuple[Flag, ...]
    env: tuple[EnvVar, ...]
    secret_env: tuple[str, ...]
    verdicts: tuple[Verdict, ...]
    applied_fixes: tuple[str, ...] = ()  # signature ids of fixes applied (learned or this deploy)

    def module(self) -> str:
        return "sglang.launch_server" if self.engine == "sglang" else "vllm.entrypoints.openai.api_server"

    def argv(self) -> list[str]:
        words = [self.python, "-m", self.module()]
        for f in self.flags:
            words += f.words()
        return words

    def engine_args(self) -> list[str]:
        return self.argv()[3:]

    def flag(self, name: str) -> Flag | None:
        return next((f for f in self.flags if f.name == name), None)

    @property
    def errors(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.level == "error"]

    def to_json(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "engine_version": show_version(self.engine_version),
            "argv": self.argv(),
            "flags": [
                {"flag": f.name, "value": f.value, "rule": f.rule, "reason": f.reason, "source": f.source}
                for f in self.flags
            ],
            "env": [{"name": e.name, "value": e.value, "rule": e.rule, "reason": e.reason} for e in self.env],
            "secret_env": list(self.secret_env),  # names only: values never leave the operator's machine in plans
            "verdicts": [{"level": v.level, "rule": v.rule, "message": v.message} for v in self.verdicts],
            "applied_fixes": list(self.applied_fixes),
            "port": self.port,
            "served_name": self.served_name,
        }


# --- version-dependent spellings (engines.md §1.1) -------------------------------------------------------

RENAMED: Version = (0, 5, 14)
OLD_NAMES_REMOVED: Version = (0, 5, 20)
MAMBA_OLD, MAMBA_NEW = "--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"
GRAPH_OLD, GRAPH_NEW = "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"
ALIASES = {
    "--tp": "--tp-size",
    "--model": "--model-path",
    "--speculative-draft-model": "--speculative-draft-model-path",
    "-tp": "--tensor-parallel-size",
    "-sc": "--speculative-config",
    "--dp": "--dp-size",
    "--ep": "--ep-size",
}


def spell(flag: str, version: Version | None) -> str:
    """The spelling of a renamed SGLang flag that `version` accepts."""
    if version is None:
        return flag
    new = version >= RENAMED
    if flag in (MAMBA_OLD, MAMBA_NEW):
        return MAMBA_NEW if new else MAMBA_OLD
    if flag in (GRAPH_OLD, GRAPH_NEW):
        return GRAPH_NEW if new else GRAPH_OLD
    return flag


# --- the inputs every rule sees --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanInput:
    model: ModelSpec
    gpus: GpuSummary
    version: Version | None
    wishes: Wishes

    @property
    def spec_wanted(self) -> bool:
        return self.wishes.speculative and self.model.mtp_layers > 0

    def v_in(self, lo: Version, hi: Version) -> bool:
        """lo <= version <= hi (an unknown version matches nothing)."""
        return self.version is not None and lo <= self.version <= hi


def choose_tp(model: ModelSpec, gpus: GpuSummary, wanted: int | None) -> int:
    """Largest power-of-two TP <= GPU count that divides the attention heads (KV heads replicate when fewer)."""
    if wanted:
        return wanted
    tp = 1
    candidate = 1
    while candidate <= gpus.count:
        heads_ok = model.num_attention_heads == 0 or model.num_attention_heads % candidate == 0
        kv = model.num_kv_heads or 1
        kv_ok = kv % candidate == 0 or candidate % kv == 0
        if heads_ok and kv_ok:
            tp = candidate
        candidate *= 2
    return tp


@dataclass(frozen=True)
class Rule:
    id: str
    when: Callable[[PlanInput], bool]
    flags: Callable[[PlanInput], list[tuple[str, str | None]]]
    reason: str
    source: str = ""
    env: Callable[[PlanInput], list[tuple[str, str]]] = field(default=lambda i: [])


def _spec_flags(i: PlanInput) -> list[tuple[str, str | None]]:
    steps, topk = i.wishes.speculative_steps, i.wishes.speculative_topk
    draft = steps + 1 if topk == 1 else max(steps + 1, topk * steps)
    return [
        ("--speculative-algorithm", "NEXTN"),
        ("--speculative-num-steps", str(steps)),
        ("--speculative-eagle-topk", str(topk)),
        ("--speculative-num-draft-tokens", str(draft)),
    ]


SGLANG_RULES: tuple[Rule, ...] = (
    Rule(
        "tensor-parallel",
        lambda i: True,
        lambda i: [("--tp-size", str(choose_tp(i.model, i.gpus, i.wishes.tp)))],
        "largest power of two <= GPU count dividing the attention heads (playbook tp: wins)",
    ),
    Rule(
        "speculative-mtp",
        lambda i: i.spec_wanted,
        _spec_flags,
        "NEXTN with the model's own MTP head; all three of steps/topk/draft-tokens or none (a subset is a bare "
        "AssertionError in every version; draft = steps + 1 when topk = 1)",
        "engines.md §1.3, §2.1",
    ),
    Rule(
        "hybrid-spec-extra-buffer-old",
        lambda i: i.spec_wanted and i.model.hybrid and i.v_in((0, 5, 9), (0, 5, 13)),
        lambda i: [(MAMBA_OLD, "extra_buffer")],
        "NEXTN on a hybrid GDN model: no_buffer (the default) rejects speculative decoding with radix cache on "
        "0.5.10-0.5.13",
        "engines.md §2.1; sglang issue #27418",
        env=lambda i: [("SGLANG_ENABLE_SPEC_V2", "1")] if i.v_in((0, 5, 9), (0, 5, 10)) else [],
    ),
    Rule(
        "hybrid-spec-extra-buffer",
        lambda i: i.spec_wanted and i.model.hybrid and i.v_in(RENAMED, (9, 9, 9)),
        lambda i: [(MAMBA_NEW, "extra_buffer")],
        "hybrid GDN + NEXTN: extra_buffer (auto already picks it from 0.5.14; explicit for reproducibility; the "
        "flag was renamed in 0.5.14 and the old name removed in 0.5.20)",
        "engines.md §1.1, §1.2",
    ),
    Rule(
        "sm120-nvfp4-moe-runner",
        lambda i: i.model.nvfp4 and i.model.moe and i.gpus.consumer_blackwell,
        lambda i: [("--moe-runner-backend", "flashinfer_cutlass")],
        "SM120 NVFP4 MoE: `auto` picks flashinfer_trtllm whose kernels exist only for SM100-family; "
        "flashinfer_cutedsl gives garbage output",
        "engines.md §1.4; sglang PR #39807; flashinfer #2723",
    ),
    Rule(
        "sm120-nvfp4-fp4-gemm",
        lambda i: i.model.nvfp4 and i.gpus.consumer_blackwell,
        lambda i: [("--fp4-gemm-backend", "flashinfer_cudnn")],
        "explicit FP4 GEMM backend: the SM120 default changed between versions; flashinfer_cudnn worked on the "
        "8x RTX PRO 6000 box",
        "engines.md §1.5",
    ),
    Rule(
        "hybrid-blackwell-attention",
        lambda i: i.model.hybrid and i.gpus.blackwell,
        lambda i: [("--attention-backend", "flashinfer" if i.gpus.consumer_blackwell else "triton")],
        "hybrid GDN models on Blackwell accept only an allow-list of attention backends",
        "engines.md §1.6; #35080",
    ),
    Rule(
        "pcie-custom-all-reduce",
        lambda i: not i.gpus.nvlink and choose_tp(i.model, i.gpus, i.wishes.tp) > 2,
        lambda i: [("--disable-custom-all-reduce", None)],
        "PCIe-only with more than two GPUs: custom all-reduce is off anyway; explicit silences the warning",
        "engines.md §1.8",
    ),
    Rule(
        "context-length",
        lambda i: i.wishes.context_length is not None,
        lambda i: [("--context-length", str(i.wishes.context_length))],
        "playbook context_length",
    ),
    Rule(
        "mem-fraction",
        lambda i: i.wishes.mem_fraction is not None,
        lambda i: [("--mem-fraction-static", str(i.wishes.mem_fraction))],
        "playbook mem_fraction",
    ),
)

VLLM_RULES: tuple[Rule, ...] = (
    Rule(
        "tensor-parallel",
        lambda i: True,
        lambda i: [("--tensor-parallel-size", str(choose_tp(i.model, i.gpus, i.wishes.tp)))],
        "largest power of two <= GPU count dividing the attention heads (playbook tp: wins)",
    ),
    Rule(
        "speculative-mtp",
        lambda i: i.spec_wanted,
        lambda i: [
            (
                "--speculative-config",
                json.dumps(
                    {"method": "mtp", "num_speculative_tokens": i.wishes.speculative_steps}, separators=(",", ":")
                ),
            )
        ],
        "vLLM MTP with the model's own heads (model-specific *_mtp methods are deprecated aliases of mtp)",
        "engines.md §6.1",
    ),
    Rule(
        "sm120-nvfp4-moe-backend",
        lambda i: i.model.nvfp4 and i.model.moe and i.gpus.consumer_blackwell and i.v_in((0, 32, 0), (9, 9, 9)),
        lambda i: [("--moe-backend", "flashinfer_b12x")],
        "SM120 NVFP4 MoE: flashinfer_b12x is vLLM's native SM12x path but opt-in (auto does not pick it; "
        "flashinfer_cutlass's device check covers SM100 only). In the parsers of 0.32 and 0.33; older "
        "versions are not checked, so nothing is added there",
        "engines.md §6.2; vllm issues #31085, #33416",
    ),
    Rule(
        "pcie-custom-all-reduce",
        lambda i: not i.gpus.nvlink and choose_tp(i.model, i.gpus, i.wishes.tp) > 2,
        lambda i: [("--disable-custom-all-reduce", None)],
        "PCIe-only with more than two GPUs: custom all-reduce cannot work",
        "engines.md §6.2",
    ),
    Rule(
        "context-length",
        lambda i: i.wishes.context_length is not None,
        lambda i: [("--max-model-len", str(i.wishes.context_length))],
        "playbook context_length",
    ),
    Rule(
        "mem-fraction",
        lambda i: i.wishes.mem_fraction is not None,
        lambda i: [("--gpu-memory-utilization", str(i.wishes.mem_fraction))],
        "playbook mem_fraction",
    ),
)


# --- flags the rules know will fail (user flags are passed, but flagged) --------------------------------


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


def args_dict(words: list[str]) -> dict[str, str | None]:
    """`--flag value` / `--flag` words → {canonical flag: value or None}; later words win."""
    out: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-"):
            name, eq, inline = w.partition("=")
            name = ALIASES.get(name, name)
            if eq:
                out[name] = inline
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[name] = words[i + 1]
                i += 1
            else:
                out[name] = None
        i += 1
    return out


def lint(i: PlanInput, flags: tuple[Flag, ...]) -> list[Verdict]:
    words = [w for f in flags for w in f.words()]
    a = args_dict(words)
    return [Verdict("crash", k.id, k.message) for k in KNOWN_CRASHES if k.engine == i.wishes.engine and k.when(i, a)]


# --- fixes ---------------------------------------------------------------------------------------------


Derived = tuple[list[tuple[str, str | None]], list[str]]  # (flags to set, flags to remove)


def _words(flags: list[Flag]) -> dict[str, str | None]:
    return args_dict([w for f in flags for w in f.words()])


def _derive_spec_steps(flags: list[Flag], version: Version | None) -> Derived:
    draft = _words(flags).get("--speculative-num-draft-tokens")
    steps = max(1, int(draft) - 1) if draft and draft.isdigit() else 1
    return [("--speculative-num-steps", str(steps))], []


def _respell(flags: list[Flag], version: Version | None) -> Derived:
    """Renamed flags (0.5.14) spelled for this version, values kept."""
    sets: list[tuple[str, str | None]] = []
    removes: list[str] = []
    for f in flags:
        right = spell(f.name, version)
        if right != f.name:
            sets.append((right, f.value))
            removes.append(f.name)
    return sets, removes


def _mem_fraction_flag(flags: list[Flag]) -> tuple[str, float | None]:
    for name in ("--mem-fraction-static", "--gpu-memory-utilization"):
        value = _words(flags).get(name)
        if name in _words(flags):
            return name, float(value) if value else None
    return (
        "--mem-fraction-static" if any(f.name == "--model-path" for f in flags) else "--gpu-memory-utilization",
        None,
    )


def _raise_mem_fraction(flags: list[Flag], version: Version | None) -> Derived:
    name, current = _mem_fraction_flag(flags)
    return [(name, f"{min(0.95, (current or 0.85) + 0.04):.2f}")], []


def _lower_mem_fraction(flags: list[Flag], version: Version | None) -> Derived:
    name, current = _mem_fraction_flag(flags)
    return [(name, f"{max(0.5, (current or 0.85) - 0.05):.2f}")], []


def _no_change(flags: list[Flag], version: Version | None) -> Derived:
    return [], []


DERIVED_FIXES: dict[str, Callable[[list[Flag], Version | None], Derived]] = {
    "speculative_num_steps": _derive_spec_steps,
    "respell_renamed_flags": _respell,
    "raise_mem_fraction": _raise_mem_fraction,
    "lower_mem_fraction": _lower_mem_fraction,
    "sweep_port": _no_change,  # the relaunch itself stops stale engine servers holding the port first
}
DERIVED_FIX_TEXT = {
    "speculative_num_steps": "--speculative-num-steps (draft tokens - 1)",
    "respell_renamed_flags": "renamed flags spelled for this engine version",
    "raise_mem_fraction": "memory fraction +0.04",
    "lower_mem_fraction": "memory fraction -0.05",
    "sweep_port": "stop stale engine servers on the port, then relaunch",
}


def _set_flag(flags: list[Flag], name: str, value: str | None, rule: str, reason: str, source: str = "") -> list[Flag]:
    canon = ALIASES.get(name, name)
    kept = [f for f in flags if ALIASES.get(f.name, f.name) != canon]
    if len(kept) == len(flags):
        return [*flags, Flag(canon, value, rule, reason, source)]
    at = next(i for i, f in enumerate(flags) if ALIASES.get(f.name, f.name) == canon)
    kept.insert(at, Flag(canon, value, rule, reason, source))
    return kept


def apply_fix(plan: LaunchPlan, fix: Fix, rule: str, reason: str) -> LaunchPlan:
    removes = set(fix.remove_flags)
    sets = list(fix.set_flags)
    if fix.derive:
        derived_sets, derived_removes = DERIVED_FIXES[fix.derive](list(plan.flags), plan.engine_version)
        sets += derived_sets
        removes |= set(derived_removes)
    flags = [f for f in plan.flags if f.name not in removes]
    for name, value in sets:
        flags = _set_flag(flags, spell(name, plan.engine_version), value, rule, reason)
    env = [e for e in plan.env if e.name not in dict(fix.set_env)]
    env += [EnvVar(n, v, rule, reason) for n, v in fix.set_env]
    if _words(flags) == _words(list(plan.flags)) and {(e.name, e.value) for e in env} == {
        (e.name, e.value) for e in plan.env
    }:
        return plan  # already in the plan: nothing to apply (and nothing to credit)
    return replace(plan, flags=tuple(flags), env=tuple(env), applied_fixes=(*plan.applied_fixes, rule))


# --- the planner ---------------------------------------------------------------------------------------


def plan_launch(
    *,
    model: ModelSpec,
    gpus: GpuSummary,
    engine_version: Version | None,
    python: str,
    wishes: Wishes,
    learned: tuple[LearnedFix, ...] = (),
) -> LaunchPlan:
    i = PlanInput(model, gpus, engine_version, wishes)
    check_address = "127.0.0.1" if wishes.bind_address in ("0.0.0.0", "::") else wishes.bind_address
    model_flag = "--model-path" if wishes.engine == "sglang" else "--model"
    flags: list[Flag] = [
        Flag(model_flag, model.path, "model", "playbook model, on the host"),
        Flag("--served-model-name", wishes.served_name, "served-name", "playbook served_name (/v1/models id)"),
        Flag("--host", wishes.bind_address, "bind-address", "inventory bind_address"),
        Flag("--port", str(wishes.port), "port", "playbook port"),
    ]
    env: list[EnvVar] = [EnvVar("PYTHONUNBUFFERED", "1", "unbuffered-log", "log lines reach the file as written")]
    verdicts: list[Verdict] = []
    if not wishes.literal:
        for rule in SGLANG_RULES if wishes.engine == "sglang" else VLLM_RULES:
            if rule.when(i):
                for name, value in rule.flags(i):
                    flags = _set_flag(flags, name, value, rule.id, rule.reason, rule.source)
                env += [EnvVar(n, v, rule.id, rule.reason) for n, v in rule.env(i)]
        if wishes.speculative and model.mtp_layers == 0:
            verdicts.append(
                Verdict(
                    "warning", "speculative-mtp", f"{model.architecture} has no MTP heads: speculative decoding skipped"
                )
            )
    else:
        verdicts.append(
            Verdict(
                "info",
                "literal",
                "literal playbook: only the playbook's own flags are passed; the rules below only warn",
            )
        )
    for name, value in args_dict(list(wishes.extra_args)).items():
        flags = _set_flag(flags, name, value, "playbook-extra-args", "written in the playbook (wins over rules)")
    env = [e for e in env if e.name not in dict(wishes.env)]
    env += [EnvVar(n, v, "playbook-env", "written in the playbook") for n, v in wishes.env]
    if model.sglang_quantization and wishes.engine == "sglang":
        verdicts.append(
            Verdict(
                "info",
                "quantization",
                f"{model.quantization.upper()} checkpoint: the engine detects "
                f"{model.sglang_quantization} from the model files",
            )
        )
    if wishes.engine == "sglang" and i.spec_wanted and model.hybrid and i.v_in((0, 5, 5), (0, 5, 8)):
        verdicts.append(
            Verdict(
                "warning",
                "hybrid-spec-old-version",
                f"SGLang {show_version(engine_version)} has no "
                "mamba extra_buffer: speculative decoding on a hybrid model may be unsupported",
            )
        )
    plan = LaunchPlan(
        engine=wishes.engine,
        engine_version=engine_version,
        python=python,
        model_path=model.path,
        served_name=wishes.served_name,
        port=wishes.port,
        check_address=check_address,
        flags=tuple(flags),
        env=tuple(env),
        secret_env=wishes.secret_env,
        verdicts=tuple(verdicts),
    )
    for lf in learned:
        plan = apply_fix(plan, lf.fix, lf.signature, f"learned fix ({lf.signature}, learned {lf.learned_at})")
    return replace(plan, verdicts=(*plan.verdicts, *lint(i, plan.flags)))


def relint(plan: LaunchPlan, model: ModelSpec, gpus: GpuSummary, wishes: Wishes) -> LaunchPlan:
    """Recompute the known-crash verdicts after fixes changed the flags."""
    i = PlanInput(model, gpus, plan.engine_version, wishes)
    kept = tuple(v for v in plan.verdicts if v.level != "crash")
    return replace(plan, verdicts=(*kept, *lint(i, plan.flags)))
