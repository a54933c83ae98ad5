"""`fleet cron`: the crontab entry that runs `fleet health`; `remove` removes exactly what `install` wrote."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.base import CONTROL_CHARS, Invocation, cache_file, cli, writable_file
from fleet.errors import ConfigError, FleetError

if TYPE_CHECKING:  # the inventory types and the rest load only when a command needs them: cron starts fleet often
    pass


CRON_MARK = "# fleet health (managed by `fleet cron`)"


@cli.group()
def cron() -> None:
    """Manage the crontab entry that runs `fleet health` for the current user.

    \b
    Example:
      fleet cron install --schedule "*/5 * * * *" --heal
    """


def _run_crontab(argv: list[str], text: str | None = None) -> Any:
    import subprocess

    try:
        return subprocess.run(["crontab", *argv], input=text, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise ConfigError(
            "crontab is not installed on this machine.", "Install cron (Debian: apt-get install cron)."
        ) from exc


def _crontab() -> list[str]:
    p = _run_crontab(["-l"])
    return p.stdout.splitlines() if p.returncode == 0 else []


def _write_crontab(lines: list[str]) -> None:
    p = _run_crontab(["-"], "\n".join(lines) + "\n" if lines else "")
    if p.returncode != 0:
        raise FleetError(f"crontab: could not install the new table ({p.stderr.strip()}).", "Check `crontab -l`.")


def _managed(lines: list[str]) -> list[str]:
    return [line for i, line in enumerate(lines) if line == CRON_MARK or (i and lines[i - 1] == CRON_MARK)]


@cron.command("install")
@click.option("--schedule", default="*/5 * * * *", show_default=True, help="Cron schedule (five fields).")
@click.option("--heal", is_flag=True, help="Run with --heal.")
@click.option(
    "--log-file",
    type=click.Path(path_type=Path),
    default=None,
    callback=writable_file,
    help="Where cron runs log [default ~/.cache/fleet/health.log].",
)
@click.option(
    "--deadline",
    "deadline_s",
    type=click.FloatRange(1, 3600),
    default=None,
    help="Each run's --deadline [default: fleet health's]; with --heal, longer than a restart takes.",
)
@click.pass_obj
def cron_install(ctx: Invocation, schedule: str, heal: bool, log_file: Path | None, deadline_s: float | None) -> None:
    """Install (or replace) the entry. Example: fleet cron install --schedule "* * * * *" --heal"""
    import shlex

    fields = schedule.split()
    if len(fields) != 5 or not all(re.fullmatch(r"[0-9*/,\-]+", f) for f in fields):
        raise ConfigError(f'cron schedule "{schedule}" is not five cron fields.', 'Example: --schedule "*/5 * * * *".')
    log_path = (log_file or cache_file("health.log")).resolve()
    exe = shutil.which("fleet") or str(Path(sys.executable).parent / "fleet")
    env = [
        ("FLEET_INVENTORY", str(ctx.inventory_path.resolve())),
        ("FLEET_PLAYBOOKS", str(ctx.playbooks_dir.resolve())),
        ("FLEET_SERVICES", str(ctx.services_dir.resolve())),  # health checks and heals services too
        *((("FLEET_CRASHES", str(ctx.crashes_dir.resolve())),) if ctx.crashes_dir else ()),
        *((k, os.environ[k]) for k in ("FLEET_KNOWN_HOSTS", "FLEET_SSH_CONFIG", "PYTHONPATH") if k in os.environ),
    ]
    # Everything that reaches the line besides fixed text: a newline in any of them would add crontab lines
    # of its own (the schedule's fields are checked above, not the whitespace between them).
    for name, value in [("--schedule", schedule), ("fleet", exe), *env, ("--log-file", str(log_path))]:
        if CONTROL_CHARS.search(value):
            raise ConfigError(
                f"cron: {name}={value!r} contains a newline or another control character; the crontab was not changed.",
                "Use paths and variables without control characters.",
            )
    command = (
        " ".join(f"{k}={shlex.quote(v)}" for k, v in env)
        + f" {shlex.quote(exe)} health --quiet{' --heal' if heal else ''}"
        + (f" --deadline {deadline_s:g}" if deadline_s is not None else "")
        + f" --log-file {shlex.quote(str(log_path))} >> {shlex.quote(str(log_path))}.out 2>&1"
    )
    command = f"{schedule} " + command.replace("%", r"\%")  # cron reads an unescaped % as a newline
    log_path.parent.mkdir(parents=True, exist_ok=True)  # the shell's `>>` would fail on a missing directory
    current = _crontab()
    lines = [line for line in current if line not in _managed(current)]
    _write_crontab([*lines, CRON_MARK, command])
    click.echo(f"installed: {command}")


@cron.command("show")
def cron_show() -> None:
    """Print fleet's entry. Example: fleet cron show"""
    managed = _managed(_crontab())
    click.echo("\n".join(managed) if managed else "no fleet entry in this user's crontab")


@cron.command("remove")
def cron_remove() -> None:
    """Remove fleet's entry, keeping every other line. Example: fleet cron remove"""
    lines = _crontab()
    managed = _managed(lines)
    _write_crontab([line for line in lines if line not in managed])
    click.echo("removed" if managed else "no fleet entry to remove")
