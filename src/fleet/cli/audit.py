"""`fleet engine audit sglang==X`: an upgrade checked over the whole fleet before anything is installed
(fleet.control.audit)."""

from __future__ import annotations

import shlex
from dataclasses import asdict, replace
from typing import Any

import click

from fleet.cli.base import Invocation, each_host, emit_json, say
from fleet.cli.provision import engine
from fleet.errors import ConfigError
from fleet.terminal import safe_line

DETAILS = ("refusals", "removed", "renamed", "added", "changed", "defaults", "crashes")


@engine.command("audit")
@click.argument("spec")
@click.option("--host", "host_name", help="One inventory host or group (default: every host).")
@click.option(
    "--parser",
    help="A Python on this machine with that engine version (a CPU is enough), e.g. ~/sglang-0.5.23/bin/python: "
    "its own parser and resolution check every new command line.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per playbook and host.")
@click.pass_obj
def engine_audit(ctx: Invocation, spec: str, host_name: str | None, parser: str | None, as_json: bool) -> None:
    """Plan every playbook of the engine on every host with SPEC (sglang==0.5.23), and print one table:
    flags removed, renamed, added or changed, defaults that change, known crashes gained or lost, and
    what pre-flight refuses. Nothing is installed or changed on any host.

    With --parser, each new command line also goes through that version's own argument parser and
    resolution, on this machine, against a stand-in for the host's GPU and a copy of the model's
    config.json. Exits 4 when anything is refused or rejected, 1 when a host or a command line could not
    be audited.

    \b
    Example:
      fleet engine audit sglang==0.5.23 --parser ~/sglang-0.5.23/bin/python
    """
    from fleet.control import audit, placing
    from fleet.control.engines import parse_spec
    from fleet.control.gather import model_path, read_facts

    name, version = parse_spec(spec)
    command = _parser(parser, name, version) if parser is not None else None
    playbooks = audit.playbooks_of(ctx._playbooks, name)
    if not playbooks:
        raise ConfigError(f"no playbook in {ctx.playbooks_dir} runs {name}.", "Nothing to audit.")

    def on_host(t: Any, host: Any) -> list[audit.Audit]:
        if name not in host.settings.engines:
            return [audit.Audit(host.name, "-", "-", skipped=f"no {name} in its engines: nothing here to upgrade")]
        rows = []
        for pb in (p for p in playbooks if not p.spec.hosts):
            facts = read_facts(t, host, model=model_path(host, pb.spec.model), engine=name)
            now, then = (
                placing.place_and_plan(
                    host, pb, f, pb.name, None, replace=False, signatures=ctx.signatures, show_refusal=True
                ).result
                for f in (facts, audit.with_version(facts, name, version))
            )
            row = audit.compare(host.name, pb.name, now, then, ctx.signatures)
            if command and then.plan is not None and not then.errors:
                row = replace(row, parser=audit.parser_verdict(command, then.plan, then.gpus, facts.model))
            rows.append(row)
        return rows

    rows: list[audit.Audit] = []
    for host, found, error in each_host(ctx, host_name, True, on_host):
        rows += found if error is None else [audit.Audit(host, "-", "-", error=error.message)]
    chosen = {h.name for h in ctx.inventory.select([host_name])} if host_name else None
    for pb in playbooks:
        if pb.spec.hosts and (chosen is None or chosen & set(pb.spec.hosts)):
            rows += _group_rows(ctx, pb, name, version, command is not None)
    if command is None:
        say(f"warning: no command line went through {name} {version}'s own parser: give --parser PYTHON", err=True)
    if as_json:
        for r in rows:
            emit_json({"verdict": r.verdict, **asdict(r)})
    else:
        _table(rows, name, version, bool(command))
    verdicts = {r.verdict for r in rows}
    if "refused" in verdicts:
        raise click.exceptions.Exit(4)
    if "unknown" in verdicts:  # a host not reached, or a command line its parser could not check: not "same"
        raise click.exceptions.Exit(1)


def _group_rows(ctx: Invocation, pb: Any, engine: str, version: str, parser_asked: bool) -> list[Any]:
    """A group playbook's ranks on its own hosts; one row with the error where they cannot be planned."""
    from fleet.cli.groups import group_run
    from fleet.control import audit
    from fleet.errors import FleetError, PreflightError

    where = (",".join(pb.spec.hosts), f"{pb.name}[group]", "-")
    if not any(h in ctx.inventory.hosts for h in pb.spec.hosts):  # a group for other boxes: none runs here
        why = f"none of its hosts ({', '.join(pb.spec.hosts)}) is in the inventory: nothing here to upgrade"
        return [audit.Audit(*where, skipped=why)]
    try:
        return audit.audit_group(group_run(ctx, pb), engine, version, ctx.signatures or [], parser_asked)
    except PreflightError as exc:  # the group cannot be placed on its hosts as they are
        return [audit.Audit(*where, refusals=(exc.message,))]
    except FleetError as exc:
        return [audit.Audit(*where, error=exc.message)]


def _parser(parser: str, engine: str, version: str) -> list[str]:
    """--parser as a command ([env] [VAR=value ...] python), refused unless it is one and has `version`."""
    from fleet.control.audit import local_version

    usage = "Give [VAR=value ...] PYTHON: a Python on this machine with the engine installed."
    try:
        words = shlex.split(parser)
    except ValueError as exc:
        raise ConfigError(f"--parser {parser!r}: {exc}.", usage) from None
    words = words[1:] if words[:1] == ["env"] else words
    settings, python = words[:-1], words[-1:]
    if not python or any("=" not in w or w.startswith("=") for w in settings) or "=" in python[0]:
        raise ConfigError(f"--parser {parser!r} is not [VAR=value ...] PYTHON.", usage)
    have = local_version(words, engine)
    if have != version:
        raise ConfigError(
            f"--parser {parser}: it has {engine} {have or '(none)'}, not {version}.",
            f"Give a Python with {engine}=={version} installed (pip install {engine}=={version} in a virtualenv).",
        )
    return words


def _table(rows: list[Any], engine: str, version: str, checked: bool) -> None:
    say(f"{engine} -> {version}: {len(rows)} deployment(s) planned; nothing on any host was changed")
    width = max([len(f"{r.host}/{r.playbook}") for r in rows] + [10])
    say(f"{'DEPLOYMENT'.ljust(width)}  {'FROM':<8}  {'VERDICT':<8}  PARSER")
    for r in rows:  # every cell one line: a playbook's file name or a host's answer cannot forge a row
        parser = safe_line(r.parser) if checked else "not checked (--parser)"
        say(f"{safe_line(f'{r.host}/{r.playbook}').ljust(width)}  {r.now:<8}  {r.verdict:<8}  {parser}")
        if r.error or r.skipped:
            say(f"    {safe_line(r.error or r.skipped)}")
        for field in DETAILS:
            for line in getattr(r, field):
                say(f"    {field}: {safe_line(line)}")
