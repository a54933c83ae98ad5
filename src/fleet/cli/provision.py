"""Commands that put what a deployment needs onto hosts: `fleet pull` (the model's weights)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import click

from fleet import events
from fleet.cli.base import Invocation, cli, emit_json, say, transport_for
from fleet.cli.report import PullShown, size
from fleet.errors import FleetError

if TYPE_CHECKING:
    from fleet.inventory import Host


@cli.command()
@click.argument("playbook")
@click.option("--host", "-H", "host_name", help="Inventory host (default: the playbook's hosts: or default_host).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def pull(ctx: Invocation, playbook: str, host_name: str | None, as_json: bool) -> None:
    """Put the playbook's model (hf_repo: at revision:) onto the host, downloaded there by the engine's own
    Hugging Face client, and check it whole before it counts.

    Free disk is checked against the checkpoint's size first; a model already there is verified, not
    downloaded again; every file is checked against the Hub's size and checksum before the directory
    appears at the model's path. Ctrl-C stops the download where it is: the next pull resumes it.
    HF_TOKEN and HF_ENDPOINT are read from your environment; the token goes to the host on stdin only.

    \b
    Example:
      fleet pull qwen36-27b --host ct129
    """
    pb = ctx.playbook(playbook)
    hosts: list[Host]
    if host_name or not pb.spec.hosts:
        hosts = [ctx.host(host_name, pb)]
    else:  # one model over several hosts: every node needs its copy
        from fleet.inventory import check_playbook_host

        check_playbook_host(pb, ctx.inventory)
        hosts = ctx.inventory.select(pb.spec.hosts)
    from fleet.control.pull import HubAccess, pull_model

    hub = HubAccess.from_environment()

    def one(host: Host) -> Any:
        with transport_for(ctx, host) as t:
            return pull_model(t, host, pb, hub=hub, progress=ProgressLines(host.name))

    outcomes: list[tuple[Host, Any, FleetError | None]] = [(h, None, None) for h in hosts]

    def run(i: int) -> None:
        try:
            outcomes[i] = (hosts[i], one(hosts[i]), None)
        except FleetError as exc:
            outcomes[i] = (hosts[i], None, exc)

    # daemon threads: Ctrl-C ends fleet at once, and each host's pull stops when its stdin closes with it
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(hosts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if as_json:
        emit_json([r.to_json() if r else {"host": h.name, "error": e.message if e else ""} for h, r, e in outcomes])
    for h, r, e in outcomes:
        if e is not None:
            if len(outcomes) == 1:
                raise e
            say(f"{h.name}: {e.message}", err=True)
        elif not as_json and r.outcome == "present":
            checked = (
                f"{r.files} files as the Hub lists them, {r.checksums} checksums read again"
                if r.files is not None
                else "its own files only: the Hub was not reached"
            )
            say(f"{h.name}: {r.path} is already there and whole ({checked}, {size(r.bytes)}); nothing downloaded.")
        elif not as_json:
            say(
                f"{h.name}: pulled {pb.spec.hf_repo}@{(r.commit or '')[:12]} to {r.path}: {r.files} files, "
                f"{size(r.bytes)} in {r.seconds:.1f}s, sizes and {r.checksums} checksums verified."
            )
    failed = [e for _, _, e in outcomes if e is not None]
    if failed:
        raise click.exceptions.Exit(max(e.exit_code for e in failed))


class ProgressLines:
    """A pull's progress on stderr, and in the structured log."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.shown = PullShown()

    def __call__(self, ev: events.Event) -> None:
        events.logged(self.host)(ev)
        for line in self.shown.lines(ev):
            say(f"{self.host}: {line}", err=True)


@cli.group()
def engine() -> None:
    """fleet's own engine environments on a host: one virtual environment per version, switched in one step.

    \b
    In the inventory, engines: {sglang: fleet} runs the version `fleet engine use` made current, and
    engines: {sglang: "fleet==0.5.23"} that version's environment.

    \b
    Example:
      fleet engine install sglang==0.5.23 --host blackwell
      fleet engine use sglang==0.5.23 --host blackwell
    """


@engine.command("install")
@click.argument("spec")
@click.option("--host", "-H", "host_name", required=True, help="Inventory host.")
@click.option("--python", help="The host's Python to make the environment with (default: python3).")
@click.option("--pip-arg", "pip_args", multiple=True, help="One more argument for pip or uv (an index URL, say).")
@click.pass_obj
def engine_install(ctx: Invocation, spec: str, host_name: str, python: str | None, pip_args: tuple[str, ...]) -> None:
    """Install SPEC (sglang==0.5.23) into an environment of its own on the host; the others stay.

    uv is used where the host has it (with --prerelease=allow for SGLang), pip otherwise. The version
    the engine's own metadata reports must be SPEC's, or the environment is not used.

    \b
    Example:
      fleet engine install sglang==0.5.23 --host blackwell
    """
    from fleet.control.engines import engine_step

    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        show = lambda line: say(f"  | {line}", err=True)  # noqa: E731 - the installer's output, as it comes
        out = engine_step(t, host, "install", spec, python=python, pip_args=pip_args, on_line=show)
    done = "was already installed" if out["e"] == "present" else f"is installed ({out.get('installer')})"
    say(f"{host.name}: {spec} {done}; fleet engine use {spec} --host {host.name} makes it current.")


@engine.command("use")
@click.argument("spec")
@click.option("--host", "-H", "host_name", required=True, help="Inventory host.")
@click.pass_obj
def engine_use(ctx: Invocation, spec: str, host_name: str) -> None:
    """Make SPEC's environment the current one (engines: {ENGINE: fleet}); running servers keep theirs
    until they are restarted (`fleet restart`, or a service's rolling restart).

    \b
    Example:
      fleet engine use sglang==0.5.11 --host blackwell
    """
    from fleet.control.engines import engine_step

    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        out = engine_step(t, host, "use", spec)
    was = f" (was {out['previous']})" if out.get("previous") else ""
    say(f"{host.name}: {spec} is current{was}.")


@engine.command("list")
@click.option("--host", "-H", "host_name", required=True, help="Inventory host.")
@click.option("--json", "as_json", is_flag=True, help="Print them as JSON.")
@click.pass_obj
def engine_list(ctx: Invocation, host_name: str, as_json: bool) -> None:
    """fleet's engine environments on the host: each version, whole or not, and the current one.

    \b
    Example:
      fleet engine list --host blackwell
    """
    from fleet.control.gather import read_facts

    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        envs = read_facts(t, host).raw.get("managed_engines") or []
    if as_json:
        emit_json(envs)
        return
    for env in envs:
        state = ("current" if env["current"] else "installed") if env["whole"] else "unfinished, not used"
        say(f"{host.name}: {env['engine']}=={env['version']}: {state}")
    if not envs:
        say(f"{host.name}: no engine environments of fleet's (fleet engine install sglang==VERSION --host {host.name})")
