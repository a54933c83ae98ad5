"""Commands on services (services/*.yaml: replicas of a playbook behind the SGLang router): up, down, and
the rolling restart behind `fleet restart SERVICE`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleet.cli import complete
from fleet.cli.base import Invocation, cli, emit_json, exit_for_failures, say, transport_for
from fleet.cli.report import print_result, progress_for, result_json

if TYPE_CHECKING:
    from fleet.control.outcomes import ServiceResult
    from fleet.control.service import ServiceRun


def service_run(ctx: Invocation, ref: str, *, as_json: bool = False, starting: bool = False) -> ServiceRun:
    """The service `ref` with its playbook; `starting` (up, restart): refused if it cannot be served."""
    from fleet.control.service import ServiceRun

    svc = ctx.service(ref)
    playbook = ctx.playbook(svc.spec.playbook)
    if starting:
        from fleet.secrets import read_secrets

        svc.check_playbook(playbook)
        # each replica reads them again as it deploys; a missing one is refused here, before the router
        # starts or a roll takes a replica out of it
        read_secrets(playbook.spec.secret_names, playbook.name)
    return ServiceRun(
        svc,
        ctx.inventory,
        playbook,
        lambda host: transport_for(ctx, host),
        lambda where: progress_for(where, as_json=as_json),
        ctx.signatures,
    )


def print_service(result: ServiceResult, as_json: bool) -> None:
    if as_json:
        emit_json(
            {
                "service": result.service,
                "ok": result.ok,
                "reason": result.reason,
                "endpoint": result.endpoint,
                "answer": result.answer,
                "replicas": [
                    {
                        "replica": o.name,
                        "url": o.url,
                        "ok": o.ok,
                        "result": result_json(o.result) if o.result else None,
                        "error": str(o.error) if o.error else o.note or None,
                    }
                    for o in result.replicas
                ],
            }
        )
    else:
        for o in result.replicas:
            if o.result is not None:
                print_result(o.result)
            else:
                say(f"{o.name}: {o.error or o.note}", err=True)
        state = "is up" if result.ok else "FAILED"
        say(f"service {result.service} {state} at {result.endpoint}: {result.reason}", err=not result.ok)
    if not result.ok:  # every replica refused before anything changed: a pre-flight refusal, as for a deploy
        raise click.exceptions.Exit(4 if result.refused else 7)


@cli.command()
@click.argument("service", shell_complete=complete.services)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON; progress as JSON lines on stderr.")
@click.pass_obj
def up(ctx: Invocation, service: str, as_json: bool) -> None:
    """Bring a service up: its router, every replica (each through the deploy loop, hosts in parallel),
    exactly the ready replicas registered in the router, and a request through the router proved.

    A replica already running its plan is left running. Exit 0 when every replica is up and the router
    answers the smoke prompt; 4 when every replica was refused before anything changed (pre-flight or the
    engine's own check); 7 otherwise (the ready replicas still serve).

    \b
    Example:
      fleet up qwen36
    """
    print_service(service_run(ctx, service, as_json=as_json, starting=True).up(), as_json)


@cli.command()
@click.argument("service", shell_complete=complete.services)
@click.pass_obj
def down(ctx: Invocation, service: str) -> None:
    """Take a service down: every worker out of its router, every replica stopped, the router stopped.

    \b
    Example:
      fleet down qwen36
    """
    from fleet.control.service_health import service_down

    done, failed = service_down(service_run(ctx, service))
    for line in done:
        say(f"service {service}: {line}", err=line.startswith("NOT") or ": NOT stopped" in line)
    exit_for_failures([e.exit_code for e in failed])


def restart_service(ctx: Invocation, service: str, rollback: bool, as_json: bool) -> None:
    """`fleet restart SERVICE`: the rolling restart (see `fleet restart --help`)."""
    print_service(service_run(ctx, service, as_json=as_json, starting=True).roll(rollback=rollback), as_json)


def services_here(ctx: Invocation) -> list[str]:
    """The services directory's services whose router host this inventory has: another inventory (`-i`)
    is another fleet, and its hosts' services are not this one's to list or check. A file that cannot be
    read is kept, so that its error is reported."""
    from fleet.errors import FleetError
    from fleet.inventory.services import service_names

    names = []
    for name in service_names(ctx.services_dir):
        try:
            router = ctx.service(name).spec.router.host
        except FleetError:
            names.append(name)
            continue
        if router in ctx.inventory.hosts or router in ctx.inventory.groups:
            names.append(name)
    return names


def service_status_rows(ctx: Invocation) -> list[dict[str, Any]]:
    """One row per service that is up (brought up by `fleet up`, not taken down): its router and each replica
    as the router sees it."""
    from fleet.errors import FleetError

    rows: list[dict[str, Any]] = []
    for name in services_here(ctx):
        try:
            run = service_run(ctx, name)
            with run.session() as t:
                router = run.router(t, {"do": "health"})[0]
                if not router.get("up"):  # never brought up, or taken down: not listed
                    continue
                states = run.states(t)[0] if router.get("health") == 200 else []
        except FleetError as exc:
            rows.append({"service": name, "error": str(exc)})
            continue
        rows.append(
            {
                "service": name,
                "router": run.endpoint,
                "router_up": router.get("health") == 200,
                "replicas": [
                    {
                        "replica": s.replica,
                        "url": s.url,
                        "status": s.status,
                        "registered": s.registered,
                        "healthy_in_router": s.healthy_in_router,
                        "circuit_open": s.circuit_open,
                        "serving": s.serving,
                        "router_says": s.in_router,
                    }
                    for s in states
                ],
            }
        )
    return rows


def print_service_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    for row in rows:
        if as_json:
            emit_json(row)
        elif row.get("error"):
            say(f"service {row['service']}: {row['error']}")
        else:
            serving = sum(1 for r in row["replicas"] if r["serving"])
            router = "up" if row["router_up"] else "DOWN"
            count = f"{serving}/{len(row['replicas'])} serving"
            say(f"service {row['service']}: router {router} at {row['router']}, {count}")
            for r in row["replicas"]:
                say(f"  {r['replica']:<28} {r['status']:<10} {r['url'] or '-':<28} router: {r['router_says']}")
