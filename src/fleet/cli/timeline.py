"""`fleet timeline HOST/NAME`: a deployment's last starts phase by phase, from the host's own history, so an
operator sees where the minutes go and whether a change (a fix, an engine version, other GPUs) helped."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import click

from fleet.cli import complete
from fleet.cli.base import Invocation, cli, emit_json, say, split_deployment, transport_for
from fleet.errors import ConfigError
from fleet.startup import PHASES, key_parts, typical_startup, well_formed
from fleet.terminal import safe_line


@cli.command()
@click.argument("target", metavar="HOST/NAME", shell_complete=complete.deployment_hosts)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per start.")
@click.pass_obj
def timeline(ctx: Invocation, target: str, as_json: bool) -> None:
    """A deployment's last starts on its host, phase by phase (HOST alone: every deployment there).

    \b
    The starts of the same model under another engine version or on other GPUs are shown too, each under
    its own heading: the comparison a change is judged by. The host keeps the last 10 of each.

    \b
    Examples:
      fleet timeline blackwell/qwen36-27b
      fleet timeline blackwell --json
    """
    from fleet.control.gather import read_facts

    host_name, deployment = split_deployment(target, None)
    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        facts = read_facts(t, host)
    known = sorted(facts.remote.deployments)
    if deployment is not None and deployment not in known:
        raise ConfigError(
            f"{host.name}: no deployment named {deployment} (deployments there: {', '.join(known) or 'none'}).",
            f"`fleet status --host {host.name}` lists them.",
        )
    for name in [deployment] if deployment else known:
        record = facts.remote.deployment(name)
        own = record.recorded.startup_key
        if not record.starts:
            if not as_json:
                say(f"{host.name}/{name}: no start recorded on this host yet")
            continue
        for key in sorted(record.starts, key=lambda k: (k != own, k)):  # its own history first
            if as_json:
                for start in record.starts[key]:
                    emit_json(start_json(host.name, name, key, key == own, start))
            else:
                for line in history_lines(f"{host.name}/{name}", key, key == own, list(record.starts[key])):
                    say(line)


def start_json(host: str, deployment: str, key: str, current: bool, start: Mapping[str, object]) -> dict[str, Any]:
    model, engine, gpus = key_parts(key)
    shown = {k: start.get(k) for k in ("at", "outcome", "ready_s", "phases", "order", "fixes")}
    return {"host": host, "deployment": deployment, "model": model, "engine": engine, "gpus": gpus,
            "current": current, "well_formed": well_formed(start), **shown}  # fmt: skip


def history_lines(where: str, key: str, current: bool, starts: list[dict[str, Any]]) -> list[str]:
    """One heading, then a table: a row per start (oldest first), a column per phase it went through, and
    the median of the starts that reached ready (what the ETA and the stall bounds are made of)."""
    model, engine, gpus = key_parts(key)
    good = [s for s in starts if well_formed(s)]
    whose = "this deployment's" if current else "an earlier setting"
    lines = [
        f"{where}: {safe_line(model)}, {safe_line(engine)} on GPUs {safe_line(gpus)} ({whose}; {len(good)} starts)"
    ]
    phases = [p for p in PHASES if any(p in s["phases"] for s in good)]
    header = ["when", "outcome", "total", *phases, "fixes"]
    rows = [[_when(s.get("at")), safe_line(str(s.get("outcome")))[:14], _secs(s["ready_s"]),
             *(_secs(s["phases"].get(p)) for p in phases), _fixes(s.get("fixes"))] for s in good]  # fmt: skip
    typical = typical_startup(good)
    if typical is not None:
        rows.append(
            [f"median of {typical['starts']}", "ready", _secs(typical["ready_s"])]
            + [_secs(typical["phases"].get(p)) for p in phases]
            + [""]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines += [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]
    ]
    if len(good) < len(starts):
        lines.append(f"  ({len(starts) - len(good)} kept entries not shown: not in the shape fleet writes)")
    return lines


def _when(at: Any) -> str:
    if not isinstance(at, int | float) or isinstance(at, bool):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _secs(value: Any) -> str:
    return "-" if value is None else f"{float(value):.1f}s"


def _fixes(fixes: Any) -> str:
    if not isinstance(fixes, list) or not fixes:
        return "-"
    return safe_line(",".join(str(f) for f in fixes))[:80]
