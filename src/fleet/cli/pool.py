"""`fleet pool`: start, serve, inspect and stop the local connection pool."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.base import cache_file, cli, emit_json
from fleet.errors import FleetError
from fleet.paths import pool_socket, warm_socket

if TYPE_CHECKING:  # the inventory types and the rest load only when a command needs them: cron starts fleet often
    from fleet.transport.pool import PoolRequest

    pass


@cli.group()
def pool() -> None:
    """Keep SSH connections and a warm fleet process between runs (cron's `fleet health` gets fast).

    While the pool runs, every fleet command reaches SSH hosts through it, and runs in a process
    forked from one that has already imported fleet. It closes connections idle for its timeout,
    then exits. Host keys are checked exactly as without it; after upgrading or editing fleet,
    commands run in their own process again until the pool is restarted.

    \b
    Example:
      fleet pool start --idle-timeout 900
      fleet pool status
      fleet pool stop
    """


def _ask_pool(request: PoolRequest) -> dict[str, Any] | None:
    from fleet.frames import read_frame
    from fleet.transport.pool import ask_pool, raise_error_frame

    sock = ask_pool(pool_socket(), request)
    if sock is None:
        return None
    with sock:
        answer = read_frame(sock)
    if "error" in answer:
        raise_error_frame(answer)
    return answer


IDLE_TIMEOUT = click.option(
    "--idle-timeout",
    "idle_timeout_s",
    default=600.0,
    show_default=True,
    type=click.FloatRange(1, 7 * 24 * 3600),
    help="Seconds a connection stays open unused; the pool exits when none is left.",
)


@pool.command("start")
@IDLE_TIMEOUT
def pool_start(idle_timeout_s: float) -> None:
    """Start the pool in the background. Example: fleet pool start"""
    import subprocess

    if (running := _ask_pool({"op": "status"})) is not None:
        click.echo(f"connection pool already running (pid {running['pid']}) at {pool_socket()}")
        return
    log_path = cache_file("pool.log")
    log_path.touch()  # the background shell may open it only after we first look
    start_offset = log_path.stat().st_size
    # The shell starts the pool in the background and exits: the pool is nobody's child, in its own
    # session, and outlives this run and the terminal it was started from.
    subprocess.run(
        ["/bin/sh", "-c", '"$@" </dev/null >>"$FLEET_POOL_LOG" 2>&1 &', "sh", sys.executable, "-m", "fleet"]
        + ["pool", "serve", "--idle-timeout", str(idle_timeout_s)],
        env={**os.environ, "FLEET_POOL_LOG": str(log_path)},
        start_new_session=True,
        check=True,
    )
    deadline = time.monotonic() + 10
    while (running := _ask_pool({"op": "status"})) is None:
        with open(log_path, "rb") as log:
            log.seek(start_offset)
            written = log.read().decode(errors="replace").strip().splitlines()
        if any(line.startswith("error:") for line in written) or time.monotonic() > deadline:
            raise FleetError("the connection pool did not start.", f"Its log ({log_path}): {' | '.join(written[-3:])}")
        time.sleep(0.02)
    while not warm_socket().exists() and time.monotonic() < deadline:  # its imports take a moment
        time.sleep(0.02)
    click.echo(
        f"connection pool started (pid {running['pid']}) at {pool_socket()}; "
        f"connections close after {idle_timeout_s:.0f} s unused (log {log_path})"
    )


@pool.command("serve")
@IDLE_TIMEOUT
def pool_serve(idle_timeout_s: float) -> None:
    """Run the pool in the foreground (for a systemd user service). Example: fleet pool serve"""
    from fleet.transport.pool_server import serve

    cache_file("pool.sock")  # its directory
    serve(pool_socket(), idle_timeout_s)


@pool.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the pool's state as JSON.")
def pool_status(as_json: bool) -> None:
    """Show the pool and the connections it holds; exit 1 if it is not running. Example: fleet pool status"""
    state = _ask_pool({"op": "status"})
    if as_json:
        emit_json(state or {"running": False})
    elif state is None:
        click.echo("no connection pool running")
    else:
        click.echo(f"connection pool pid {state['pid']}, idle timeout {state['idle_timeout_s']:.0f} s")
        for c in state["connections"]:
            since = time.strftime("%H:%M:%S", time.localtime(c["opened_at"]))
            click.echo(
                f"  {c['host']:<12} {c['where']:<28} open since {since}, {c['commands']} commands, "
                f"idle {c['idle_s']:.0f} s{'' if c['open'] else ' (closed)'}"
            )
    if state is None:
        raise click.exceptions.Exit(1)


@pool.command("stop")
def pool_stop() -> None:
    """Stop the pool, closing its connections. Example: fleet pool stop"""

    state = _ask_pool({"op": "status"})
    if state is None:
        click.echo("no connection pool running")
        return
    _ask_pool({"op": "stop"})
    deadline = time.monotonic() + 10
    while pool_socket().exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    click.echo(f"connection pool stopped (pid {state['pid']})")
