"""fleet's command line: parse arguments, build a transport per host, render, map errors to exit codes.

The only place that catches `FleetError`. Heavy modules (fabric, paramiko, rich) are imported inside
commands so `fleet --help` and cron runs start fast.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType

import click

from fleet.cli import audit, cron, fixes, forget, hosts, observe, plan_view, pool, provision, services, timeline  # noqa: F401 - each registers
from fleet.cli.base import cli, say
from fleet.errors import FleetError

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code (0 ok; see fleet.errors for the others)."""
    from fleet.launch import command_word

    args = argv if argv is not None else sys.argv[1:]
    # Nagios: a check that could not run (bad inventory or arguments, say) is "unknown", not "critical".
    could_not_run = 3 if command_word(args) == "health" else None
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a cron timeout, `kill`, the pool when fleet's own process died) unwinds like Ctrl-C, so
        # a deploy can leave the host unlocked and its half-checked server recorded on the way out.
        signal.signal(signal.SIGTERM, _interrupted)
    try:
        code = cli.main(args=argv, prog_name="fleet", standalone_mode=False)
    except FleetError as exc:
        say(f"error: {exc.message}", err=True)
        if exc.hint:
            say(f"       {exc.hint}", err=True)
        if "--debug" in args:
            if getattr(exc, "remote_traceback", ""):
                say("the host said:\n" + exc.remote_traceback, err=True)  # type: ignore[attr-defined]
            _hide_in(exc)
            raise
        return could_not_run or exc.exit_code
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return could_not_run or 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    return code if isinstance(code, int) else 0


def _hide_in(exc: FleetError) -> None:
    """--debug's traceback prints `exc`: its words with every secret hidden, as `say` shows them."""
    from fleet.secrets import hide

    exc.message, exc.hint = hide(exc.message), hide(exc.hint)
    exc.args = tuple(hide(a) if isinstance(a, str) else a for a in exc.args)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
