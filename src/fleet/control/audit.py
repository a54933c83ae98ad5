"""An engine upgrade, audited over the whole fleet before anything is installed (`fleet engine audit
sglang==X`): every playbook of that engine planned on every host with the new version, what changes, and
that version's own argument parser and resolution on each new command line.

The plans are fleet's planner's, on each host's facts (one probe per playbook and host). The parser is a
local Python that has version X (on the operator's machine; a CPU is enough): fleet's engine check, the
one a deploy runs on the host before stopping anything, runs there against a stand-in for the host's GPU
(control/standin_gpu.py) and a copy of the model's config.json. Nothing is installed or changed on any host.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleet.crashes import Signature
from fleet.crashes.signatures import knowledge_diff
from fleet.facts import HostFacts, ModelFiles
from fleet.facts.parse import EngineInstall
from fleet.inventory import NamedPlaybook
from fleet.plan import GpuSummary, LaunchPlan, args_dict, parse_version, show_version, spell
from fleet.plan.build import PlanResult
from fleet.plan.container import PLACEMENT_ENV
from fleet.plan.defaults import plan_default_changes
from fleet.protocol import CheckRequest

if TYPE_CHECKING:
    from fleet.control.group import GroupRun

CHECK_TIMEOUT_S = 300


@dataclass(frozen=True)
class Audit:
    """One playbook on one host, today and with the new version."""

    host: str
    playbook: str
    now: str  # the version it plans with today ("-" when the host has none)
    removed: tuple[str, ...] = ()  # flags the new version's plan no longer has
    renamed: tuple[str, ...] = ()  # "old -> new": the same rule, another flag
    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # the same flag, another value; environment changes
    defaults: tuple[str, ...] = ()  # defaults that differ between the versions (fleet.plan.defaults)
    crashes: tuple[str, ...] = ()  # known crashes gained or lost (signatures' ranges, the plan's lint)
    refusals: tuple[str, ...] = ()  # what pre-flight refuses with the new version
    # the new version's own verdict on the new command line: "not checked" (no parser was asked for), "not
    # checked: why" (asked for, and this one could not be: unknown), accepted, rejected: ..., could_not_check
    parser: str = "not checked"
    error: str = ""  # the host could not be audited (unreachable, no model...)
    skipped: str = ""  # nothing to audit, and why (the host has no environment of the engine)

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "skipped"
        if self.error or self.parser.startswith(("could_not_check", "not checked:")):
            return "unknown"
        if self.refusals or self.parser.startswith("rejected"):
            return "refused"
        return "changes" if self.removed or self.renamed or self.added or self.changed else "same"


def with_version(facts: HostFacts, engine: str, version: str) -> HostFacts:
    """The host's facts as they would be with `version` of the engine installed."""
    install = facts.engines.get(engine) or EngineInstall(engine, "python3", None, {}, None)
    return replace(facts, engines={**facts.engines, engine: replace(install, version=version, error=None)})


def compare(
    host: str,
    playbook: str,
    now: PlanResult,
    then: PlanResult,
    signatures: Sequence[Signature],
) -> Audit:
    """Pure: what the upgrade changes in one deployment's plan."""
    before = now.plan
    shown = show_version(before.engine_version) if before else "-"
    refusals = tuple(v.message for v in then.errors)
    if then.plan is None or before is None:
        why = refusals or tuple(v.message for v in now.errors) or ("no plan",)
        return Audit(host, playbook, shown, refusals=why)
    old, new = {f.name: f for f in before.flags}, {f.name: f for f in then.plan.flags}
    gone = [f for n, f in old.items() if n not in new]
    came = [f for n, f in new.items() if n not in old]
    v = then.plan.engine_version
    renamed = [
        (a, b) for a in gone for b in came if a.value == b.value and (a.rule == b.rule or spell(a.name, v) == b.name)
    ]
    moved = {a.name for a, _ in renamed} | {b.name for _, b in renamed}
    env_old, env_new = {e.name: e.value for e in before.env}, {e.name: e.value for e in then.plan.env}
    engine = then.plan.engine
    lint_old = {v.message for v in before.verdicts if v.level == "crash"}
    lint_new = {v.message for v in then.plan.verdicts if v.level == "crash"}
    return Audit(
        host,
        playbook,
        shown,
        removed=tuple(" ".join(f.words()) + f"  ({f.rule})" for f in gone if f.name not in moved),
        renamed=tuple(f"{a.name} -> {b.name}  ({b.rule})" for a, b in renamed),
        added=tuple(" ".join(f.words()) + f"  ({f.rule}: {f.reason})" for f in came if f.name not in moved),
        changed=tuple(
            [
                f"{n} {old[n].value} -> {new[n].value}  ({new[n].rule})"
                for n in old
                if n in new and old[n].value != new[n].value
            ]
            + [
                f"env {n}={env_new.get(n, '(unset)')}"
                for n in sorted(env_old.keys() | env_new.keys())
                if env_old.get(n) != env_new.get(n)
            ]
        ),
        defaults=tuple(plan_default_changes(then.model, then.gpus, before, then.plan)),
        crashes=tuple(knowledge_diff(signatures, engine, before.engine_version, then.plan.engine_version))
        + tuple(f"+ {m}" for m in sorted(lint_new - lint_old))
        + tuple(f"- {m}" for m in sorted(lint_old - lint_new)),
        refusals=refusals,
    )


def parser_verdict(parser: Sequence[str], plan: LaunchPlan, gpus: GpuSummary | None, m: ModelFiles | None) -> str:
    """The new version's own parser and resolution on the plan's command line, run in the local Python
    `parser` (a command: a Python, or `env VAR=... python`) against a stand-in for the host's GPU."""
    from fleet.host.check import engine_check, fleet_text

    if m is None or not isinstance(m.config, dict) or gpus is None:
        return "not checked: the host has no model config or GPU to stand in for"
    if m.config.get("auto_map"):
        return "not checked: the model ships its own code (auto_map), which fleet never runs on this machine"
    with tempfile.TemporaryDirectory(prefix="fleet-audit-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(without_code(m.config), f)
        if isinstance(m.quant_config, dict):
            with open(os.path.join(model_dir, "hf_quant_config.json"), "w") as f:
                json.dump(m.quant_config, f)
        args = _local_args(plan.engine_args(), model_dir)
        major, minor = divmod(gpus.sm, 10)
        standin = {
            "major": major,
            "minor": minor,
            "name": gpus.name,
            "memory_mib": gpus.memory_mib,
            "count": gpus.count,
        }
        # fleet's own Python path is not the parser's: only what --parser sets
        env = {
            "FLEET_STANDIN_GPU": json.dumps(standin),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONPATH": "",
        }
        env.update(_settings(parser))
        check: CheckRequest = {
            "engine": plan.engine,
            "python": parser[-1],
            "args": args,
            "env": {**env, **{e.name: e.value for e in plan.env if e.name not in PLACEMENT_ENV}},
            "prelude": fleet_text("control/standin_gpu.py") + "\n",
            "timeout_s": CHECK_TIMEOUT_S,
        }
        said = engine_check(check, lambda: False)
    if said["verdict"] == "accepted":
        return "accepted"
    lines = [line for line in str(said.get("output") or "").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return f"{said['verdict']}: {(errors or lines or ['no output'])[-1][:300]}"


def without_code(config: dict[str, object]) -> dict[str, object]:
    """The host's config.json as this machine may read it: a host is not trusted to name code for this
    machine to run (auto_map names modules transformers imports, from a path or the Hub's cache)."""
    return {k: v for k, v in config.items() if k != "auto_map"}


def _settings(parser: Sequence[str]) -> dict[str, str]:
    """The VAR=value words before the parser's Python."""
    return dict(w.split("=", 1) for w in parser[:-1] if "=" in w)


def _local_args(args: list[str], model_dir: str) -> list[str]:
    """The command line with the model at `model_dir` (its config only), CUDA as the device, and no
    --trust-remote-code: the model's own code is the host's, never run on this machine."""
    out = [w for w in args if w != "--trust-remote-code"]
    for flag in ("--model-path", "--model"):
        if flag in out[:-1]:
            out[out.index(flag) + 1] = model_dir
    return out + (["--device", "cuda"] if "--device" not in args_dict(out) else [])


def local_version(parser: Sequence[str], engine: str) -> str | None:
    """The engine version the local parser Python has, or None."""
    import subprocess

    env = dict(os.environ, **_settings(parser))
    code = f"import importlib.metadata as m; print(m.version({engine!r}))"
    try:
        out = subprocess.run([parser[-1], "-c", code], capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return show_version(parse_version(text)) if out.returncode == 0 and text else None


def playbooks_of(playbooks: Sequence[NamedPlaybook], engine: str) -> list[NamedPlaybook]:
    """The playbooks of `engine`: single-host ones are audited on every host, a group's on its own hosts."""
    return [pb for pb in playbooks if pb.spec.engine == engine]


def audit_group(
    run: GroupRun, engine: str, version: str, signatures: Sequence[Signature], parser_asked: bool = False
) -> list[Audit]:
    """A group's ranks, each planned today and with `version`, the group's pre-flight on the new plans
    refusing for all of them. The new version's parser is not run on a rank: a rank's command line is
    resolved against the other hosts of its group, which the stand-in GPU does not know; where a parser
    was asked for, the rank says so (and is unknown, not the same)."""
    now, _ = run.plan()
    then, problems = run.plan(lambda f: with_version(f, engine, version))
    rows = []
    for i, (host, today, upgraded) in enumerate(zip(run.hosts, now, then, strict=True)):
        row = compare(host.name, f"{run.playbook.name}[rank {i}]", today, upgraded, signatures)
        extra = tuple(p for p in problems if p not in row.refusals)
        parser = "not checked: a rank of a group" if parser_asked else row.parser
        rows.append(replace(row, refusals=row.refusals + extra, parser=parser))
    return rows
