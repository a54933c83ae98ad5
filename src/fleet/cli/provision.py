"""Commands that put what a deployment needs onto hosts: `fleet pull` (the model's weights)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import click

from fleet import events
from fleet.cli import complete
from fleet.cli.base import Invocation, cli, emit_json, exit_for_failures, say, transport_for
from fleet.cli.complete import host_option
from fleet.cli.report import Reporter
from fleet.errors import ConfigError, FleetError, HostStepError
from fleet.terminal import safe_line, size

if TYPE_CHECKING:
    from fleet.control.pull import PullResult
    from fleet.inventory import Host, NamedPlaybook


@cli.command()
@click.argument("playbook", shell_complete=complete.playbooks)
@click.option(
    "--host",
    "-H",
    "host_names",
    multiple=True,
    shell_complete=complete.hosts,
    help="Inventory host or group; repeat for more (default: the playbook's).",
)
@click.option(
    "--from",
    "source",
    metavar="HOST|DIR",
    help="Push the model from this inventory host, or from this directory here (a path with a /), instead of "
    "the Hub: for hosts without internet.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_obj
def pull(ctx: Invocation, playbook: str, host_names: tuple[str, ...], source: str | None, as_json: bool) -> None:
    """Put the playbook's model (hf_repo: at revision:) onto the host, downloaded there by the engine's own
    Hugging Face client, and check it whole before it counts.

    Free disk is checked against the checkpoint's size first; a model already there is verified, not
    downloaded again; every file is checked against the Hub's size and checksum before the directory
    appears at the model's path. Ctrl-C stops the download where it is: the next pull resumes it.
    HF_TOKEN and HF_ENDPOINT are read from your environment; the token goes to the host on stdin only.

    With --from, the model is pushed instead, from a host that has it (at the playbook's model path there)
    or from a directory on this machine, through fleet's SSH connections: each file resumes where a cut
    push left it, and is checked by size and by the sha256 of what the source read. Several hosts are
    sent to at once from the one copy.

    \b
    Example:
      fleet pull qwen36-27b --host ct129
      fleet pull qwen36-27b --host gpu2 --host gpu3 --from gpu1
      fleet pull qwen36-27b --host gpu2 --from /data/models/Qwen3.6-27B
    """
    pb = ctx.playbook(playbook)
    hosts: list[Host]
    if host_names:
        hosts = ctx.inventory.select(list(host_names))
    elif not pb.spec.hosts:
        hosts = [ctx.host(None, pb)]
    else:  # one model over several hosts: every node needs its copy
        from fleet.inventory import check_playbook_host

        check_playbook_host(pb, ctx.inventory)
        hosts = ctx.inventory.select(pb.spec.hosts)
    with contextlib.ExitStack() as held:  # the source's connection, for as long as the hosts need it
        fetch = _pusher(ctx, pb, source, hosts, held) if source else _puller(ctx, pb)
        outcomes = _on_every_host(hosts, fetch)
    if as_json:
        emit_json([r.to_json() if r else {"host": h.name, "error": e.message if e else ""} for h, r, e in outcomes])
    for h, r, e in outcomes:
        if e is not None:
            if len(outcomes) == 1:
                raise e
            say(f"{h.name}: {e.message}", err=True)
        elif r is not None and not as_json:
            say(f"{h.name}: {_outcome(r, pb.spec.hf_repo)}")
    exit_for_failures([e.exit_code for _, _, e in outcomes if e is not None])


def _on_every_host(
    hosts: list[Host], fetch: Callable[[Host], PullResult]
) -> list[tuple[Host, PullResult | None, FleetError | None]]:
    outcomes: list[tuple[Host, PullResult | None, FleetError | None]] = [(h, None, None) for h in hosts]

    def run(i: int) -> None:
        try:
            outcomes[i] = (hosts[i], fetch(hosts[i]), None)
        except FleetError as exc:
            outcomes[i] = (hosts[i], None, exc)
        except Exception as exc:  # noqa: BLE001 - a host's odd answer fails that host, never passes as done
            failed = HostStepError(f"{hosts[i].name}: {type(exc).__name__}: {safe_line(str(exc))[:300]}", "")
            outcomes[i] = (hosts[i], None, failed)

    # daemon threads: Ctrl-C ends fleet at once, and each host's pull stops when its stdin closes with it
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(hosts))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return outcomes


def _puller(ctx: Invocation, pb: NamedPlaybook) -> Callable[[Host], PullResult]:
    from fleet.control.pull import HubAccess, pull_model

    hub = HubAccess.from_environment()

    def one(host: Host) -> PullResult:
        with transport_for(ctx, host) as t:
            progress = ProgressLines(host.name)
            try:
                return pull_model(t, host, pb, hub=hub, progress=progress)
            finally:
                progress.close()

    return one


def _pusher(
    ctx: Invocation, pb: NamedPlaybook, source: str, hosts: list[Host], held: contextlib.ExitStack
) -> Callable[[Host], PullResult]:
    """The source is listed (and refused if not whole) once, before any host is sent a byte."""
    from fleet.control.gather import model_path
    from fleet.control.push import Source, directory_here, list_source, push_model

    if "/" in source:  # a directory on this machine: host names never hold a slash
        import os

        if not os.path.isdir(source):
            raise ConfigError(
                f"--from {safe_line(source)}: no such directory here.", "Give the directory that holds the model."
            )
        origin = directory_here(source)
    else:
        [from_host] = ctx.inventory.select([source]) if source in ctx.inventory.hosts else [None]
        if from_host is None:
            raise ConfigError(
                f'--from {safe_line(source)}: no host named "{safe_line(source)}" in {ctx.inventory.path}.',
                "Name one inventory host, or a directory here with a / in it (./model).",
            )
        if from_host.name in {h.name for h in hosts}:
            raise ConfigError(f"--from {source} is also a host to push to.", "Leave it out of --host.")
        t = held.enter_context(transport_for(ctx, from_host))
        python = from_host.settings.engines.get(pb.spec.engine, "python3")
        origin = Source(from_host.name, t, python, model_path(from_host, pb.spec.model))
    listing = list_source(origin)

    def one(host: Host) -> PullResult:
        with transport_for(ctx, host) as t:
            progress = ProgressLines(host.name)
            try:
                return push_model(origin, listing, t, host, pb, progress=progress)
            finally:
                progress.close()

    return one


def _outcome(r: PullResult, repo: str | None) -> str:
    if r.outcome == "present-theirs":
        return (
            f"{safe_line(r.path)} is already there, and fleet did not make it: its {r.files} files have the sizes "
            f"{safe_line(r.source or '')} has (not compared byte for byte); fleet leaves it as it is, nothing sent."
        )
    if r.outcome == "present":
        checked = (
            f"{r.files} files as the Hub lists them, {r.checksums} checksums read again"
            if r.files is not None and r.source is None
            else f"{r.files} files as {safe_line(r.source)} has them"
            if r.source is not None
            else "its own files only: the Hub was not reached"
        )
        return f"{r.path} is already there and whole ({checked}, {size(r.bytes)}); nothing downloaded."
    if r.outcome == "pushed":
        resumed = f", {size(r.bytes - r.sent)} already there" if r.sent < r.bytes else ""
        return (
            f"pushed {safe_line(r.path)} from {safe_line(r.source or '')}: {r.files} files, {size(r.bytes)} "
            f"({size(r.sent)} sent in {r.seconds:.1f}s{resumed}), sizes and {r.checksums} checksums verified."
        )
    return (
        f"pulled {repo}@{(r.commit or '')[:12]} to {r.path}: {r.files} files, "
        f"{size(r.bytes)} in {r.seconds:.1f}s, sizes and {r.checksums} checksums verified."
    )


class ProgressLines(Reporter):
    """A pull's or push's progress as a deploy's: on a terminal a live bar per host (fleet.cli.live), else a
    line at each tenth; and in the structured log."""

    def __call__(self, event: events.Event) -> None:
        events.logged(self.host)(event)
        super().__call__(event)


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
@host_option(required=True, help="Inventory host.")
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
@host_option(required=True, help="Inventory host.")
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


@engine.command("pull")
@click.argument("image")
@host_option(required=True, help="Inventory host.")
@click.option(
    "--container",
    "cli_name",
    type=click.Choice(["podman", "docker"]),
    help="The host's container runtime (default: the inventory's runtime: for the host).",
)
@click.pass_obj
def engine_pull(ctx: Invocation, image: str, host_name: str, cli_name: str | None) -> None:
    """Pull an engine's container image onto the host (for runtime: container), its progress streamed, and
    read the engine version inside it, as a deploy will. The images the host already has stay: going
    back is naming the old image again in the playbook's (or inventory's) runtime: image:.

    \b
    Example:
      fleet engine pull lmsysorg/sglang:v0.5.23-cu129 --host blackwell
    """
    from fleet.control.engines import pull_engine_image
    from fleet.inventory.runtime import IMAGE_RE, Container

    host = ctx.host(host_name)
    runtime = host.settings.runtime
    cli: Literal["docker", "podman"] | None = (
        "podman" if cli_name == "podman" else "docker" if cli_name == "docker" else None
    ) or (runtime.container if isinstance(runtime, Container) else None)
    if cli is None:
        raise ConfigError(
            f"{host.name} has no runtime: container in {ctx.inventory.path}, so fleet does not know its runtime.",
            "Pass --container podman (or docker).",
        )
    if not IMAGE_RE.match(image):
        raise ConfigError(
            f"{safe_line(image)} is not an image reference.",
            "Give one such as lmsysorg/sglang:v0.5.23-cu129 (lower case, no spaces).",
        )

    def show(ev: events.Event) -> None:
        if isinstance(ev, events.Pulling):
            say(f"{host.name}: {safe_line(ev.line)}", err=True)

    with transport_for(ctx, host) as t:
        got = pull_engine_image(t, host, cli, image, show)
    inside = ", ".join(f"{e} {v}" for e, v in sorted(got.versions.items())) or f"no engine version read ({got.error})"
    say(
        f"{host.name}: {image} pulled with {cli} (image {(got.image_id or '?')[:19]}): {inside}. "
        "Name it in runtime: image: to run it, then fleet restart."
    )


@engine.command("list")
@host_option(required=True, help="Inventory host.")
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
        say(f"{host.name}: {safe_line(str(env['engine']))}=={safe_line(str(env['version']))}: {state}")  # host's names
    if not envs:
        say(f"{host.name}: no engine environments of fleet's (fleet engine install sglang==VERSION --host {host.name})")
