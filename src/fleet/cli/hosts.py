"""Commands that look at or change what runs on hosts: facts, deploy, restart, stop, status (plan: plan_view)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleet.cli import complete
from fleet.cli.base import (
    Invocation,
    cli,
    each_host,
    emit_json,
    exit_for_failures,
    multi_host_options,
    parse_gpus,
    say,
    split_deployment,
    transport_for,
)
from fleet.cli.complete import host_option
from fleet.cli.report import (
    describe_host_stop,
    print_result,
    progress_for,
    result_json,
)
from fleet.errors import DeployFailed

if TYPE_CHECKING:  # the inventory types and the rest load only when a command needs them: cron starts fleet often
    from fleet.inventory import Host


@cli.command()
@host_option(required=True, help="Inventory host name.")
@click.option("--model", help="Also read this model directory (path on the host, or relative to models_dir).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw facts as JSON.")
@click.pass_obj
def facts(ctx: Invocation, host_name: str, model: str | None, as_json: bool) -> None:
    """Gather a host's facts (GPUs, holders, servers, engines, disk, state) in one SSH round trip.

    \b
    Example:
      fleet facts --host blackwell --json
    """
    from fleet.control.gather import read_facts
    from fleet.facts import gpu_mismatches

    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        f = read_facts(t, host, model=model)
    warnings = [m.message for m in gpu_mismatches(host.settings.expected_gpus, f.gpus)]
    warnings += [f"fleet's state on the host is unreadable: {e}" for e in f.remote.errors]
    if as_json:
        from fleet.plan.placement import gpu_owners

        held = {str(i): who for i, who in sorted(gpu_owners(f).items())}
        emit_json(f.raw | {"host": host.name, "round_trips": t.commands_run, "warnings": warnings, "gpu_holders": held})
        return
    from fleet.render import render_facts

    render_facts(f, warnings)


@cli.command()
@click.argument("playbook", shell_complete=complete.playbooks)
@host_option(help="Inventory host (default: the playbook's default_host).")
@click.option(
    "--force",
    is_flag=True,
    help=(
        "Also kill foreign GPU and port holders (other users' processes, non-engines); lists them. "
        "GPU daemons and tools are never killed."
    ),
)
@click.option("--no-engine-check", is_flag=True, help="Skip the engine's own argument check before stopping anything.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON; progress as JSON lines on stderr.")
@click.option("--show-log", is_flag=True, help="Print every engine log line as it arrives.")
@click.option("--name", "deployment", help="The deployment's name on the host (default: the playbook's).")
@click.option("--gpus", help="Place it: a count (4) or GPU indices (6,7; one as device=3). Overrides gpus:.")
@click.option("--replace", is_flag=True, help="Stop other deployments on those GPUs first.")
@click.option("--no-pull", is_flag=True, help="Refuse a model missing on the host instead of pulling it (hf_repo:).")
@click.pass_obj
def deploy(
    ctx: Invocation,
    playbook: str,
    host_name: str | None,
    force: bool,
    no_engine_check: bool,
    as_json: bool,
    show_log: bool,
    deployment: str | None,
    gpus: str | None,
    replace: bool,
    no_pull: bool,
) -> None:
    """Deploy a playbook to a host: plan, pre-flight, stop stale servers, free GPUs, launch, watch, prove.

    A model missing on the host is pulled first (see fleet pull) when the playbook has hf_repo:, unless
    --no-pull.

    Known crashes are diagnosed and relaunched with their fix (each fix at most once, bounded attempts);
    unknown ones fail fast with the traceback. Exit 0 when the server answers the smoke prompt correctly.
    A server already running exactly this plan is checked (health, models, the smoke prompt) and left
    running; `fleet restart` restarts it (e.g. after a secret changed).

    A deployment runs on its own GPUs (gpus: in the playbook, or --gpus) with its own state and lock;
    other deployments on the host are left running. Placing one on GPUs another holds is refused unless
    --replace.

    \b
    A playbook with hosts: (one model over several hosts) is deployed as one group: every rank launched at
    once, rank 0 proved with the smoke prompt, the others by their /health; when one rank fails the whole
    group is stopped, diagnosed and relaunched (or given up, every rank stopped).

    \b
    Examples:
      fleet deploy qwen35-nvfp4 --host blackwell
      fleet deploy qwen36-27b --host blackwell --gpus 6,7 --name small
      fleet deploy qwen35-two-nodes
    """
    host_name, deployment = split_deployment(host_name, deployment)
    placement = parse_gpus(gpus)
    pb = ctx.playbook(playbook)
    if pb.spec.hosts:  # one model over several hosts, launched and kept as one group
        from fleet.cli.groups import deploy_group, refuse_single_host_options

        refuse_single_host_options(host=host_name, name=deployment, gpus=gpus, replace=replace)
        deploy_group(ctx, pb, force=force, engine_check=not no_engine_check, as_json=as_json, show_log=show_log)
        return
    host = ctx.host(host_name, pb)
    from fleet.control.naming import deployment_name

    deployment_name(deployment, pb)  # refused before the host is asked anything
    with transport_for(ctx, host) as t:
        from fleet.control.gather import started_ahead

        with started_ahead(t, host, pb):  # the host probes and starts the act while the deploy loop is imported
            from fleet.control import ops
            from fleet.control.pull import HubAccess

            result = ops.deploy(
                t,
                host,
                pb,
                force=force,
                engine_check=not no_engine_check,
                progress=progress_for(host.name, as_json=as_json, show_log=show_log),
                signatures=ctx.signatures,
                name=deployment,
                gpus=placement,
                replace=replace,
                hub=None if no_pull else HubAccess.from_environment(),
            )
    if as_json:
        emit_json(result_json(result))
    else:
        print_result(result)
    if not result.ok:
        raise click.exceptions.Exit(4 if result.refused_before_stopping else 7)


@cli.command()
@click.argument("service", required=False, shell_complete=complete.services)
@multi_host_options
@click.option(
    "--rollback", is_flag=True, help="With SERVICE: redeploy each replica not serving from its last good plan."
)
@click.option("--json", "as_json", is_flag=True, help="With SERVICE: print the outcome as JSON.")
@click.pass_obj
def restart(
    ctx: Invocation,
    service: str | None,
    host_name: str | None,
    deployment: str | None,
    all_hosts: bool,
    force: bool,
    rollback: bool,
    as_json: bool,
) -> None:
    """Redeploy the plan recorded for a deployment (every one on the host without --name), on the GPUs it
    was placed on, with learned fixes, through the same loop.

    With SERVICE (services/SERVICE.yaml): a rolling restart of its replicas with the playbook as it is now,
    one at a time -- out of the router, drained, redeployed, proved, back in -- stopping at the first
    that fails while the others serve; never taking out the last serving replica. --rollback then
    returns each replica that is not serving to its last good plan.

    \b
    Examples:
      fleet restart --host blackwell
      fleet restart --host blackwell/qwen36-27b
      fleet restart qwen36
      fleet restart qwen36 --rollback
    """
    from fleet.control import ops
    from fleet.control.gather import read_facts

    if service is not None:
        if host_name or deployment or all_hosts or force:
            raise click.UsageError(
                "a service is restarted as a whole: give SERVICE without --host/--name/--all/--force"
            )
        from fleet.cli.services import restart_service

        restart_service(ctx, service, rollback, as_json)
        return
    if rollback or as_json:
        raise click.UsageError("--rollback and --json are for a service: fleet restart SERVICE --rollback")
    host_name, deployment = split_deployment(host_name, deployment)

    def each(t: Any, h: Host) -> list[Any]:
        names: list[str | None] = [deployment] if deployment else [*ops.restartable(read_facts(t, h))] or [None]
        return [
            ops.restart(t, h, force=force, progress=progress_for(h.name), signatures=ctx.signatures, name=n)
            for n in names
        ]

    failures = []
    for name, results, err in each_host(ctx, host_name, all_hosts, each):
        if err:
            say(f"{name}: error: {err}", err=True)
            failures.append(err.exit_code)
            continue
        for r in results:
            print_result(r)
            if not r.ok:
                failures.append(DeployFailed.exit_code)
    exit_for_failures(failures)


@cli.command()
@click.argument("playbook", required=False, shell_complete=complete.playbooks)
@multi_host_options
@click.pass_obj
def stop(
    ctx: Invocation, playbook: str | None, host_name: str | None, deployment: str | None, all_hosts: bool, force: bool
) -> None:
    """Stop a deployment's server (every deployment's, and any stale inference server, without --name),
    free its GPUs; its state becomes "stopped". Other deployments are left running.

    With PLAYBOOK (one whose hosts: spread a model over several hosts): every rank of the group.

    \b
    Examples:
      fleet stop --host ct129
      fleet stop --host blackwell --name qwen36-27b
      fleet stop qwen35-two-nodes
    """
    from fleet.control import ops

    if playbook is not None:
        from fleet.cli.groups import refuse_single_host_options, stop_group

        pb = ctx.playbook(playbook)
        if not pb.spec.hosts:
            raise click.UsageError(f"{playbook} runs on one host: fleet stop --host HOST --name {pb.name} stops it.")
        refuse_single_host_options(host=host_name, name=deployment, all=all_hosts)
        stop_group(ctx, pb, force)
        return
    host_name, deployment = split_deployment(host_name, deployment)
    failures = []
    for name, out, err in each_host(
        ctx, host_name, all_hosts, lambda t, h: ops.stop(t, h, force=force, name=deployment)
    ):
        if err:
            say(f"{name}: error: {err}", err=True)
            failures.append(err.exit_code)
            continue
        say(describe_host_stop(name, out))
    exit_for_failures(failures)


@cli.command()
@host_option(help="Inventory host or group (default: all).")
@click.option("--all", "show_stopped", is_flag=True, help="Stopped deployments too (`fleet forget` removes one).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per deployment per line.")
@click.pass_obj
def status(ctx: Invocation, host_name: str | None, show_stopped: bool, as_json: bool) -> None:
    """A table of deployments: host/name, status, GPUs, playbook, engine and version, the engine's pid,
    port, uptime, attempts, and notes (its container, group rank, the fixes it runs with). Stopped
    deployments are left out unless --all.

    \b
    Example:
      fleet status
    """
    from fleet.cli.status_table import status_lines, without_stopped
    from fleet.control.gather import read_facts
    from fleet.control.status_rows import status_rows

    rows: list[dict[str, Any]] = []
    failures: list[int] = []
    for name, found, err in each_host(ctx, host_name, True, lambda t, h: status_rows(h, read_facts(t, h))):
        rows += found if found else [{"host": name, "status": "unreachable", "error": str(err)}]
        failures += [err.exit_code] if err else []
    if not show_stopped:
        rows = without_stopped(rows)
    services: list[dict[str, Any]] = []
    if not host_name:  # the whole fleet: the services too, as their routers see them
        from fleet.cli.services import service_status_rows

        services = service_status_rows(ctx)
        failures += [1 for s in services if s.get("error")]
    if as_json:
        for r in rows:
            emit_json(r)
    elif rows:
        for text in status_lines(rows):
            say(text)
    if services:
        from fleet.cli.services import print_service_rows

        print_service_rows(services, as_json)
    exit_for_failures(failures)
