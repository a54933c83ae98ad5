"""What changes in a deployment's plan between two engine versions (`fleet plan --engine sglang==X`): the
flags and environment added, removed or changed, each with the rule and reason that now decides it, and
the verdicts only one side has. Pure: two plans in, lines out."""

from __future__ import annotations

from fleet.plan.types import Flag, LaunchPlan, show_version


def plan_diff(now: LaunchPlan, then: LaunchPlan) -> list[str]:
    """Lines of `then` against `now`: "- " only in now, "+ " only in then, "~ " changed."""
    out: list[str] = []
    before, after = _flags(now), _flags(then)
    for name in sorted(before.keys() | after.keys()):
        a, b = before.get(name), after.get(name)
        if a is not None and b is None:
            out.append(f"- {' '.join(a.words())}  ({a.rule} no longer applies)")
        elif a is None and b is not None:
            out.append(f"+ {' '.join(b.words())}  ({b.rule}: {b.reason})")
        elif a is not None and b is not None and a.words() != b.words():
            out.append(f"~ {' '.join(a.words())} -> {' '.join(b.words())}  ({b.rule}: {b.reason})")
    env_a, env_b = {e.name: e for e in now.env}, {e.name: e for e in then.env}
    for name in sorted(env_a.keys() | env_b.keys()):
        x, y = env_a.get(name), env_b.get(name)
        if x is not None and y is None:
            out.append(f"- env {name}={x.value}  ({x.rule} no longer applies)")
        elif y is not None and (x is None or x.value != y.value):
            out.append(f"{'+' if x is None else '~'} env {name}={y.value}  ({y.rule}: {y.reason})")
    said = {(v.level, v.message) for v in now.verdicts}
    heard = {(v.level, v.message) for v in then.verdicts}
    out += [f"- {level}: {message}" for level, message in sorted(said - heard)]
    out += [f"+ {level}: {message}" for level, message in sorted(heard - said)]
    return out


def versions(now: LaunchPlan, then: LaunchPlan) -> str:
    return f"{now.engine} {show_version(now.engine_version)} -> {show_version(then.engine_version)}"


def _flags(plan: LaunchPlan) -> dict[str, Flag]:
    return {f.name: f for f in plan.flags}
