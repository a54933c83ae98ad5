"""`fleet forget HOST/NAME`: take a stopped deployment's record off its host (fleet.control.forget)."""

from __future__ import annotations

import click

from fleet.cli import complete
from fleet.cli.base import Invocation, cli, say, split_deployment, transport_for


@cli.command()
@click.argument("target", metavar="HOST/NAME", shell_complete=complete.deployment_hosts)
@click.pass_obj
def forget(ctx: Invocation, target: str) -> None:
    """Forget a deployment that no longer runs: its record leaves the host, and `fleet status` with it.

    Refused while its server runs (fleet stop it first). The host's start-up history and the logs stay.

    \b
    Example:
      fleet forget blackwell/qwen35-nvfp4-handwritten
    """
    from fleet.control.forget import forget as forget_deployment

    host_name, deployment = split_deployment(target, None)
    if deployment is None:
        raise click.UsageError("name one deployment: fleet forget HOST/NAME (fleet status lists them)")
    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        forget_deployment(t, host, deployment)
    say(f"{host.name}: forgot deployment {deployment}")
