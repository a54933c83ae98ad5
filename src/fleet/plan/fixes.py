"""Applying a fix to a plan: set or remove flags and environment, or derive a value (spec steps, memory
fraction) from the plan itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from fleet.plan.rules import ALIASES, args_dict, spell
from fleet.plan.types import RESTART_WEIGHT_CACHE, EnvVar, Fix, Flag, LaunchPlan, Version

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


def _smaller_graphs(flags: list[Flag], version: Version | None) -> Derived:
    """CUDA-graph capture out of memory: a smaller memory fraction, and at most half the graphs' batch
    size (16 where none was set), never a larger one than the capture that failed."""
    words = _words(flags)  # the flag as this version spells it (SGLang 0.5.20 split it per phase)
    current = words.get(spell("--cuda-graph-max-bs", version)) or words.get("--cuda-graph-max-bs")
    size = max(1, int(current) // 2) if current and current.isdigit() else 16
    return [("--cuda-graph-max-bs", str(min(size, 16))), *_lower_mem_fraction(flags, version)[0]], []


def _no_change(flags: list[Flag], version: Version | None) -> Derived:
    return [], []


DERIVED_FIXES: dict[str, Callable[[list[Flag], Version | None], Derived]] = {
    "speculative_num_steps": _derive_spec_steps,
    "respell_renamed_flags": _respell,
    "raise_mem_fraction": _raise_mem_fraction,
    "lower_mem_fraction": _lower_mem_fraction,
    "smaller_graphs": _smaller_graphs,
    "sweep_port": _no_change,  # the relaunch itself stops stale engine servers holding the port first
    # the plan stays; the relaunch asks the act step to start the deployment's daemon again (control/deploy.py)
    RESTART_WEIGHT_CACHE: _no_change,
}


def learnable(fix: Fix) -> bool:
    """Whether a fix is worth applying before the crash the next time: one that changes the plan. A port
    swept or a daemon started again is asked of the relaunch itself; learned, it would be listed by `fleet
    fixes` as a fix that does nothing."""
    changes = fix.set_flags or fix.remove_flags or fix.set_env
    return bool(changes) or DERIVED_FIXES.get(fix.derive or "") not in (None, _no_change)


def set_flag(
    flags: list[Flag], name: str, value: str | None, rule: str, reason: str, source: str = "", replaces: str = ""
) -> list[Flag]:
    canon = ALIASES.get(name, name)
    kept = [f for f in flags if ALIASES.get(f.name, f.name) != canon]
    if len(kept) == len(flags):
        return [*flags, Flag(canon, value, rule, reason, source, replaces)]
    at = next(i for i, f in enumerate(flags) if ALIASES.get(f.name, f.name) == canon)
    kept.insert(at, Flag(canon, value, rule, reason, source, replaces))
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
        flags = set_flag(flags, spell(name, plan.engine_version), value, rule, reason)
    env = [e for e in plan.env if e.name not in dict(fix.set_env)]
    env += [EnvVar(n, v, rule, reason) for n, v in fix.set_env]
    if _words(flags) == _words(list(plan.flags)) and {(e.name, e.value) for e in env} == {
        (e.name, e.value) for e in plan.env
    }:
        return plan  # already in the plan: nothing to apply (and nothing to credit)
    return replace(plan, flags=tuple(flags), env=tuple(env), applied_fixes=(*plan.applied_fixes, rule))


# --- the planner ---------------------------------------------------------------------------------------
