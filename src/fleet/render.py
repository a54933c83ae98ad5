"""Human-readable output (rich). Imported only by commands that print tables."""

from __future__ import annotations

import functools
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fleet.facts import HostFacts, one_line
from fleet.secrets import hide
from fleet.terminal import safe_text


@functools.cache
def console() -> Console:
    """Made on first use, for the stdout of the run (a pool-forked run gets its own after the fork).
    A long line stays one line, and a table as wide as its cells, where the output is not a terminal
    (grep, pipes, files): rich would otherwise fold both at 80 columns."""
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 1000)


def _host(value: object) -> str:
    """A value the host reported (a command line, a GPU or model name, a path): printed as text, never as
    terminal controls or rich markup. Anyone on the host can name a process `\x1b]0;…` or `[link=…]`."""
    return escape(safe_text(hide(str(value))))


def mib(value: int | None) -> str:
    return "?" if value is None else f"{value / 1024:.1f} GiB"


def render_facts(f: HostFacts, warnings: list[str]) -> None:
    console().print(
        f"[bold]{f.host}[/] ({_host(f.hostname)}, user {_host(f.user)}) — GPUs via {_host(f.gpu_source)}, "
        f"driver {_host(f.driver_version or '?')}, CUDA {_host(f.cuda_version or '?')}"
    )
    if f.gpu_error:
        console().print(f"  [yellow]GPU query problem:[/] {_host(f.gpu_error)}")
    for w in warnings:
        console().print(f"  [yellow]warning:[/] {_host(w)}")
    from fleet.plan.placement import gpu_owners

    owners = gpu_owners(f)
    t = Table("GPU", "name", "CC", "memory used / total", "temp", "processes", "held by")
    for g in f.gpus:
        procs = ", ".join(f"{p.pid} ({mib(p.used_mib)})" for p in g.processes) or "-"
        t.add_row(
            str(g.index),
            _host(g.name),
            _host(g.compute_capability),
            f"{mib(g.memory_used_mib)} / {mib(g.memory_total_mib)}",
            f"{g.temperature_c}°C" if g.temperature_c is not None else "?",
            procs,
            _host(owners.get(g.index, "-")),
        )
    console().print(t)
    for name, e in sorted(f.engines.items()):
        console().print(
            f"  engine {name}: {_host(e.version or 'not installed')} ({_host(e.python)})"
            f"{' — ' + _host(e.error) if e.error else ''}"
        )
    for env in f.raw.get("managed_engines") or []:  # fleet engine install: one environment per version
        state = ("current" if env.get("current") else "installed") if env.get("whole") else "unfinished, not used"
        console().print(f"  fleet's {_host(str(env.get('engine')))} {_host(str(env.get('version')))}: {state}")
    if f.holders:
        console().print("  GPU device holders:")
        for p in f.holders:
            console().print(f"    pid {p.pid} user {_host(p.user)}: {_host(one_line(p.cmdline)[:120])}")
    if f.servers:
        console().print("  inference servers:")
        for p in f.servers:
            ports = ",".join(map(str, p.ports)) or "-"
            box = next((c for c in f.containers if c.id == p.container), None)
            where = f" in container {_host(box.name)} ({_host(box.image)})" if box else ""
            console().print(f"    pid {p.pid} (pgid {p.pgid}) ports {ports}{where}: {_host(one_line(p.cmdline)[:120])}")
    if f.containers:
        console().print("  containers:")
        for c in f.containers:
            mine = f"fleet deployment {_host(c.deployment)}" if c.deployment else "not fleet's"
            console().print(f"    {_host(c.name)} ({_host(c.image)}): {_host(c.state)}, {mine}")
    for d in f.disks:
        console().print(f"  disk {_host(d.path)}: {mib((d.free_bytes or 0) >> 20)} free")
    if f.model:
        m = f.model
        size = f"{m.weights_bytes / 1e9:.1f} GB" if m.weights_bytes else "size unknown"
        console().print(f"  model {_host(m.path)}: {'present' if m.exists else 'MISSING'}, {size}")


def render_plan(result: "PlanResult", host: str, playbook: str) -> None:  # noqa: UP037 - lazy import below
    import shlex

    plan = result.plan
    if result.model:
        console().print(f"[bold]{playbook}[/] on [bold]{host}[/]: {_host(result.model.describe())}")
    if result.gpus:
        g = result.gpus
        console().print(
            f"  GPUs: {g.count}x {_host(g.name)} (SM{g.sm}, {g.memory_mib / 1024:.0f} GiB, "
            f"{'NVLink' if g.nvlink else 'PCIe only'})"
        )
    if plan:
        console().print(f"  engine: {plan.engine} {'.'.join(map(str, plan.engine_version or ()))}")
        groups: dict[tuple[str, str, str, str], list[str]] = {}
        for f in plan.flags:  # one line per rule: its flags, then why (and the engine default it replaces)
            groups.setdefault((f.rule, f.reason, f.source, f.replaces), []).append(" ".join(f.words()))
        for (rule, reason, source, replaces), words in groups.items():
            console().print(f"  {'  '.join(words)}", markup=False)
            console().print(
                f"      [{rule}] {reason}{' (' + source + ')' if source else ''}",
                style="dim",
                markup=False,
            )
            if replaces:
                console().print(f"      replaces {replaces}", style="dim", markup=False)
        engine = {"sglang": "SGLang", "vllm": "vLLM"}.get(plan.engine, plan.engine)
        for p in plan.left_to_engine:  # what fleet does not set, and what the engine picks itself there
            console().print(f"  {p.setting}: {p.effective}", markup=False)
            console().print(f"      left to {engine}: its own pick ({p.where()})", style="dim", markup=False)
        for e in plan.env:
            console().print(f"  env {e.name}={e.value}  [{e.rule}] {e.reason}", markup=False)
        for name in plan.secret_env:
            console().print(f"  env {name}=<secret, sent through a 0600 file>")
        if plan.applied_fixes:
            console().print(f"  learned fixes applied: {', '.join(plan.applied_fixes)}")
        if plan.container is not None:
            c = plan.container
            console().print(f"\n[bold]container ({c.cli}, image {_host(c.image)}):[/]")
            for option in c.options_for(plan):
                console().print(f"  {shlex.join(option.words)}", markup=False)
                console().print(f"      {option.reason}", style="dim", markup=False)
            console().print("\n[bold]command:[/]")
            console().print(shlex.join(c.run_argv(plan)), markup=False)
        else:
            env = " ".join(f"{e.name}={shlex.quote(e.value)}" for e in plan.env)
            if plan.flag("--weight-cache-mode") is not None:  # started first, kept while its settings hold
                console().print("\n[bold]weight cache daemon (fleet.plan.weight_cache):[/]")
                console().print(f"{env} {shlex.join(weight_cache.daemon_argv(plan))}", markup=False)
            console().print("\n[bold]command:[/]")
            console().print(f"{env} {shlex.join(plan.argv())}", markup=False)
    style = {"error": "red", "crash": "red", "warning": "yellow", "info": "cyan"}
    for v in result.verdicts:
        console().print(f"{v.level} [{v.rule}] {v.message}", style=style.get(v.level), markup=False)


from fleet.plan import weight_cache  # noqa: E402
from fleet.plan.build import PlanResult  # noqa: E402 - only for the annotation above
