"""Shell completion of the names an operator types: hosts and groups (`--host`), playbooks, services, and
HOST/ for a deployment. `eval "$(_FLEET_COMPLETE=bash_source fleet)"` (zsh_source, fish_source) turns it on.

Completion reads only local files (the inventory, the playbook and service directories, as the command
line or environment names them): a deployment's name would need a round trip to its host, so HOST/NAME
completes the host part. A file that cannot be read completes nothing, silently."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem


def _path(ctx: click.Context, param: str, env: str, default: str) -> Path:
    given = ctx.find_root().params.get(param)
    return Path(given or os.environ.get(env) or default)


def _stems(directory: Path, prefix: str) -> list[CompletionItem]:
    try:
        names = sorted(p.stem for p in directory.glob("*.yaml"))
    except OSError:
        return []
    return [CompletionItem(n) for n in names if n.startswith(prefix)]


def _host_names(ctx: click.Context) -> list[str]:
    from fleet.errors import FleetError
    from fleet.inventory import load_inventory

    try:
        inventory = load_inventory(_path(ctx, "inventory", "FLEET_INVENTORY", "inventory/hosts.yaml"))
    except (FleetError, OSError, ValueError):
        return []
    return sorted({*inventory.hosts, *inventory.groups})


def hosts(ctx: click.Context, _param: click.Parameter, prefix: str) -> list[CompletionItem]:
    return [CompletionItem(n) for n in _host_names(ctx) if n.startswith(prefix)]


def deployment_hosts(ctx: click.Context, _param: click.Parameter, prefix: str) -> list[CompletionItem]:
    """HOST/ for a HOST/NAME argument: the deployment's name is the host's to say (fleet status lists them)."""
    return [CompletionItem(f"{n}/") for n in _host_names(ctx) if n.startswith(prefix)]


def playbooks(ctx: click.Context, _param: click.Parameter, prefix: str) -> list[CompletionItem]:
    return _stems(_path(ctx, "playbooks", "FLEET_PLAYBOOKS", "playbooks"), prefix)


def services(ctx: click.Context, _param: click.Parameter, prefix: str) -> list[CompletionItem]:
    return _stems(_path(ctx, "services", "FLEET_SERVICES", "services"), prefix)


Completer = Callable[[click.Context, click.Parameter, str], list[CompletionItem]]


def host_option(*extra: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """`--host/-H` (into `host_name`), completing the inventory's host and group names."""
    return click.option("--host", "-H", "host_name", *extra, shell_complete=hosts, **kwargs)
