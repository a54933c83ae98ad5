"""How `fleet logs` shows what it reads: one log's lines as they are, several logs' lines each prefixed
with HOST/DEPLOYMENT; what fleet itself says (a restart switched the log, lines skipped, a log missing) on
stderr, so it never mixes into a log piped on; secrets redacted, terminal controls made harmless."""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

import click

from fleet.cli.base import Invocation, split_deployment, transport_for
from fleet.errors import ConfigError, FleetError
from fleet.secrets import hide, redact
from fleet.terminal import safe_line, safe_text

if TYPE_CHECKING:
    from fleet.inventory import Host
    from fleet.protocol import LogsEvent

Targets = list[tuple["Host", list[str | None]]]  # each host once, with the deployments read there (None: newest)


def log_targets(ctx: Invocation, given: tuple[str, ...], deployment: str | None) -> Targets:
    """The hosts and deployments `--host` names: hosts, groups (each member), HOST/DEPLOYMENT."""
    if deployment and len(given) > 1:
        raise ConfigError("--name goes with a single --host.", "Name each one as HOST/DEPLOYMENT instead.")
    chosen: dict[str, tuple[Host, list[str | None]]] = {}
    for target in given:
        host_name, name = split_deployment(target, deployment)
        for host in ctx.inventory.select([str(host_name)]):
            names = chosen.setdefault(host.name, (host, []))[1]
            if name not in names:
                names.append(name)
    return list(chosen.values())


READER_GONE = 141  # as a command the shell's pipe closed on (SIGPIPE): `tail -f | head` ends so


class LogsView:
    def __init__(self, secrets: dict[str, str], *, raw: bool, several: bool) -> None:
        self.secrets, self.raw, self.several = secrets, raw, several
        self.out_lock = threading.Lock()
        self.stop = threading.Event()
        self.failures: list[int] = []
        self.missing: set[str] = set()
        self.reader_gone = False  # whoever read the lines stopped (`fleet logs | head`)

    def shown(self, text: str) -> str:
        return hide(redact(text if self.raw else safe_text(text), self.secrets))

    def on_event(self, host: Host, asked: str | None, event: LogsEvent) -> bool:
        # the deployment's name as the host says it: one plain line, never a terminal control
        where = safe_line(f"{host.name}/{event.get('d') or asked or ''}".rstrip("/"))
        kind = event["e"]
        with self.out_lock:
            if kind == "line":
                prefix = f"{where} | " if self.several else ""
                try:
                    sys.stdout.write(f"{prefix}{self.shown(event['text'])}\n")
                    sys.stdout.flush()
                except BrokenPipeError:  # `| head` has what it wanted: stop reading, end as `tail` does
                    self.reader_gone = True
                    self.stop.set()
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more goes there
                    return False
            elif kind == "switch":  # a restart (or heal) linked a new attempt's log: said, then read from its start
                click.echo(f"fleet: {where} restarted; following its new log {safe_text(event['log'])}", err=True)
            elif kind == "reset":  # the file was cut short or put back under its name: followed from its start
                click.echo(f"fleet: {where}: its log was {safe_line(str(event.get('why')))}; following on", err=True)
            elif kind == "skipped":
                click.echo(f"fleet: {host.name}: {event['lines']} lines not shown (read too slowly)", err=True)
            elif kind == "missing":
                from fleet.control.logs import no_log_error

                name = event.get("d") or asked
                error = no_log_error(host, safe_line(str(name)) if name else None)
                if not self.several:
                    raise error
                if where not in self.missing:  # said once, however often a host repeats it
                    self.missing.add(where)
                    click.echo(f"{error}", err=True)
                    self.failures.append(error.exit_code)
        return not self.stop.is_set()

    def read_host(self, ctx: Invocation, host: Host, names: list[str | None], lines: int, follow: bool) -> int:
        from fleet.control.logs import read_logs

        asked = names[0] if len(names) == 1 else None
        with transport_for(ctx, host) as t:
            return read_logs(
                t, host, names=names, lines=lines, follow=follow, on_event=lambda e: self.on_event(host, asked, e)
            )

    def run(self, ctx: Invocation, targets: Targets, *, lines: int, follow: bool) -> None:
        if len(targets) == 1:  # one host: read here, its errors raised as they are
            host, names = targets[0]
            try:
                code = self.read_host(ctx, host, names, lines, follow)
            except (Exception, KeyboardInterrupt):
                if not self.reader_gone:
                    raise
                code = -1  # `| head` had what it wanted: how the stream then wound down is nobody's concern
            if self.reader_gone:
                raise click.exceptions.Exit(READER_GONE)
            if code not in (0, -1):
                raise click.exceptions.Exit(code)
            if self.failures:
                raise click.exceptions.Exit(self.failures[0])
            return

        def one(host: Host, names: list[str | None]) -> None:
            try:
                code = self.read_host(ctx, host, names, lines, follow)
                if code not in (0, -1):
                    self.failures.append(code)
            except Exception as exc:
                if self.reader_gone:  # as above: the reader went away, so did the reason to read
                    return
                if not isinstance(exc, FleetError):
                    raise
                with self.out_lock:  # one host failing leaves the others followed
                    click.echo(f"{host.name}: error: {safe_text(str(exc))}", err=True)
                self.failures.append(exc.exit_code)

        threads = [threading.Thread(target=one, args=t, daemon=True) for t in targets]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.5)  # in slices: Ctrl-C reaches the main thread
        finally:
            self.stop.set()
        if self.reader_gone:
            raise click.exceptions.Exit(READER_GONE)
        if self.failures:
            raise click.exceptions.Exit(self.failures[0] if len(set(self.failures)) == 1 else 1)
