"""fleet's command line: parse arguments, build a transport per host, render, map errors to exit codes.

The only place that catches `FleetError`. Heavy modules (fabric, paramiko, rich) are imported inside
commands so `fleet --help` and cron runs start fast.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from fleet.errors import ConfigError, FleetError
from fleet.inventory import Host, Inventory, NamedPlaybook, check_playbook_host, load_inventory, load_playbook


class Context:
    def __init__(self, inventory: Path, playbooks: Path, debug: bool, accept_new_host_key: bool) -> None:
        self.inventory_path = inventory
        self.playbooks_dir = playbooks
        self.debug = debug
        self.accept_new_host_key = accept_new_host_key
        self._inventory: Inventory | None = None

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.inventory_path)
        return self._inventory

    def playbook(self, ref: str) -> NamedPlaybook:
        pb = load_playbook(ref, self.playbooks_dir)
        check_playbook_host(pb, self.inventory)
        return pb

    def host(self, name: str | None, playbook: NamedPlaybook | None = None) -> Host:
        name = name or (playbook.spec.default_host if playbook else None)
        if not name:
            raise ConfigError("no host given.", "Pass --host NAME (or set default_host: in the playbook).")
        hosts = self.inventory.select([name])
        if len(hosts) != 1:
            raise ConfigError(f'"{name}" is a group of {len(hosts)} hosts.', "Pass a single host with --host.")
        return hosts[0]

    def ssh_options(self) -> Any:
        from fleet.transport import SshOptions

        return SshOptions.from_env(self.accept_new_host_key)


@contextmanager
def transport_for(ctx: Context, host: Host) -> Iterator[Any]:
    from fleet.transport import connect

    t = connect(host, ctx.ssh_options())
    try:
        yield t
    finally:
        t.close()


def _default_path(env: str, relative: str) -> Path:
    return Path(os.environ.get(env, relative))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--inventory",
    "-i",
    type=click.Path(path_type=Path),
    default=None,
    help="Inventory file [env FLEET_INVENTORY; default inventory/hosts.yaml].",
)
@click.option(
    "--playbooks",
    type=click.Path(path_type=Path),
    default=None,
    help="Playbook directory [env FLEET_PLAYBOOKS; default playbooks/].",
)
@click.option(
    "--accept-new-host-key", is_flag=True, help="Record an unknown SSH host key (a changed key is always refused)."
)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(
    click_ctx: click.Context, inventory: Path | None, playbooks: Path | None, accept_new_host_key: bool, debug: bool
) -> None:
    """Deploy and keep alive LLM inference servers (SGLang, vLLM) on GPU hosts over SSH.

    \b
    Examples:
      fleet facts --host blackwell
      fleet plan qwen35-nvfp4 --host blackwell
      fleet deploy qwen35-nvfp4 --host blackwell
      fleet status
      fleet health --json
    """
    from fleet import log

    log.configure(verbose=debug)
    click_ctx.obj = Context(
        inventory or _default_path("FLEET_INVENTORY", "inventory/hosts.yaml"),
        playbooks or _default_path("FLEET_PLAYBOOKS", "playbooks"),
        debug,
        accept_new_host_key,
    )


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str, sort_keys=True))


@cli.command()
@click.option("--host", "-H", "host_name", required=True, help="Inventory host name.")
@click.option("--model", help="Also read this model directory (path on the host, or relative to models_dir).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw facts as JSON.")
@click.pass_obj
def facts(ctx: Context, host_name: str, model: str | None, as_json: bool) -> None:
    """Gather a host's facts (GPUs, holders, servers, engines, disk, state) in one SSH round trip.

    \b
    Example:
      fleet facts --host blackwell --json
    """
    from fleet.control.facts import read_facts

    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        f = read_facts(t, host, model=model)
    if as_json:
        _emit_json(f.raw | {"host": host.name, "round_trips": t.commands_run})
        return
    from fleet.render import render_facts

    render_facts(f)


@cli.command()
@click.argument("playbook")
@click.option("--host", "-H", "host_name", help="Inventory host (default: the playbook's default_host).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.pass_obj
def plan(ctx: Context, playbook: str, host_name: str | None, as_json: bool) -> None:
    """Show the exact command line and environment `fleet deploy` would run, each flag with its reason.

    Gathers the host's facts in one round trip; changes nothing on the host. Exits 4 when pre-flight
    refuses the deployment.

    \b
    Example:
      fleet plan qwen35-nvfp4 --host blackwell
    """
    from fleet.control.facts import model_path, read_facts
    from fleet.plan.build import build_plan

    pb = ctx.playbook(playbook)
    host = ctx.host(host_name, pb)
    path = model_path(host, pb.spec.model)
    with transport_for(ctx, host) as t:
        f = read_facts(t, host, model=path, engine=pb.spec.engine)
    result = build_plan(host, pb, f, path)
    if as_json:
        _emit_json(
            {
                "host": host.name,
                "playbook": pb.name,
                "model": result.model.describe() if result.model else None,
                "plan": result.plan.to_json() if result.plan else None,
                "verdicts": [vars(v) for v in result.verdicts],
            }
        )
    else:
        from fleet.render import render_plan

        render_plan(result, host.name, pb.name)
    if result.errors:
        raise click.exceptions.Exit(4)


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code (0 ok; see fleet.errors for the others)."""
    try:
        code = cli.main(args=argv, prog_name="fleet", standalone_mode=False)
    except FleetError as exc:
        click.echo(f"error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"       {exc.hint}", err=True)
        if "--debug" in (argv if argv is not None else sys.argv):
            raise
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    return code if isinstance(code, int) else 0
