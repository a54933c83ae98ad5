"""Commands that read what runs: logs, diagnose, health (and its healing)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.base import (
    Invocation,
    cache_file,
    cli,
    emit_json,
    replaceable_file,
    say,
    split_deployment,
    transport_for,
    writable_file,
)
from fleet.cli.complete import host_option
from fleet.errors import ConfigError, FleetError
from fleet.paths import pool_socket
from fleet.terminal import safe_line

if TYPE_CHECKING:  # the inventory types and the rest load only when a command needs them: cron starts fleet often
    from fleet.control.sweep import HealthOptions
    from fleet.inventory import Host


@cli.command()
@host_option(
    required=True,
    multiple=True,
    help="Inventory host or group, or HOST/DEPLOYMENT; give it again for more (each line is then prefixed).",
)
@click.option("--name", "deployment", help="The deployment whose log to show (default: the newest log there).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines as they are written, across restarts.")
@click.option(
    "-n",
    "lines",
    default=100,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="How many lines of the end to print first.",
)
@click.option("--raw", is_flag=True, help="Keep terminal control sequences from the log (secrets are still redacted).")
@click.pass_obj
def logs(
    ctx: Invocation, host_name: tuple[str, ...], deployment: str | None, follow: bool, lines: int, raw: bool
) -> None:
    """Print (or follow) deployments' server logs over SSH (a host's newest without a deployment named).
    Following, a restart's new log is followed on, with a line on stderr that says so.

    \b
    Examples:
      fleet logs --host blackwell -n 50 -f
      fleet logs --host blackwell/qwen36-27b
      fleet logs -H blackwell/qwen35-nvfp4 -H ct129/qwen36-27b -f
    """
    from fleet.cli.logs_view import LogsView, log_targets

    targets = log_targets(ctx, host_name, deployment)
    view = LogsView(ctx.secrets, raw=raw, several=sum(len(names) for _, names in targets) > 1)
    if not follow:
        view.run(ctx, targets, lines=lines, follow=False)
        return
    from fleet.cli.prompt_end import ends_promptly_when_interrupted

    with ends_promptly_when_interrupted(show_stacks=ctx.debug):
        view.run(ctx, targets, lines=lines, follow=True)


DIAGNOSE_LINES = 5000  # the end of a log diagnosed: a crash's traceback and what led to it
DIAGNOSE_BYTES = 16 << 20  # and at most this much of it in memory (a server log grows to gigabytes)


def _log_end(stream: Any) -> str:
    """The last DIAGNOSE_LINES lines of a binary stream, never more than ~DIAGNOSE_BYTES held or read from a
    file."""
    from collections import deque

    kept: deque[bytes] = deque()
    held = 0
    if stream.seekable():  # a file: only its end is read (a pipe is read through, keeping its end)
        size = stream.seek(0, 2)
        stream.seek(max(0, size - DIAGNOSE_BYTES))
        if size > DIAGNOSE_BYTES:
            stream.readline(1 << 20)  # the line cut by the seek, or its first MiB
    while line := stream.readline(1 << 20):  # a line without an end arrives in pieces
        kept.append(line)
        held += len(line)
        while len(kept) > DIAGNOSE_LINES or held > DIAGNOSE_BYTES:
            held -= len(kept.popleft())
    return b"".join(kept).decode("utf-8", "replace")


@cli.command()
@click.argument("source", required=False)
@host_option(help="Diagnose the host's current server log instead of a file.")
@click.option("--name", "deployment", help="With --host: that deployment's log (default: the newest there).")
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), help="Engine the log comes from (narrows signatures).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
def diagnose(
    ctx: Invocation,
    source: str | None,
    host_name: str | None,
    deployment: str | None,
    engine: str | None,
    as_json: bool,
) -> None:
    """Classify an engine log (a file, - for stdin, or a host's current log) with the crash knowledge base.

    \b
    Examples:
      fleet diagnose server.log --json
      docker logs sglang 2>&1 | fleet diagnose -
      fleet diagnose --host blackwell
    """
    from fleet.crashes import LogContext, diagnose as run_diagnosis
    from fleet.protocol import log_lines

    if host_name:
        from fleet.control.logs import log_text

        host_name, deployment = split_deployment(host_name, deployment)
        host = ctx.host(host_name)
        with transport_for(ctx, host) as t:
            text = log_text(t, host, deployment, DIAGNOSE_LINES)
    elif source in (None, "-"):
        text = _log_end(sys.stdin.buffer)
    else:
        path = Path(source)
        try:
            with open(path, "rb") as log:
                if path.is_file():  # seek to the end rather than read a huge log through
                    log.seek(max(0, os.fstat(log.fileno()).st_size - DIAGNOSE_BYTES))
                text = _log_end(log)
        except OSError as exc:
            raise ConfigError(
                f"{source}: cannot read ({exc.strerror}).", "Give a log file, - for stdin, or --host."
            ) from exc
    if host_name:  # the engine may have echoed a secret into its log
        from fleet.secrets import redact

        text = redact(text, ctx.secrets)
    d = run_diagnosis(log_lines(text), LogContext(engine=engine), ctx.signatures)
    if as_json:
        emit_json(d.to_json())
        return
    say(f"{d.category}{' (' + d.signature + ')' if d.signature else ''}: {d.explanation}")
    say(f"basis: {d.basis or 'the log shows no failure'}")
    if d.fix:
        say(f"fix: {d.fix.describe()}")
    for line in d.evidence:
        say(f"evidence: {safe_line(line)}")


@cli.command()
@host_option(help="Inventory host or group (default: all hosts), or HOST/DEPLOYMENT.")
@click.option("--name", "deployment", help="Only this deployment's checks (and its host's).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host per line.")
@click.option(
    "--textfile",
    type=click.Path(path_type=Path),
    callback=replaceable_file,
    help="Also write Prometheus text format here (atomic).",
)
@click.option("--heal", is_flag=True, help="Restart unhealthy servers through the deploy loop (rate-limited).")
@click.option(
    "--max-heals-per-hour",
    default=3,
    show_default=True,
    type=click.IntRange(0, 60),
    help="Per host, before it counts as crash-looping.",
)
@click.option("--skip-generation", is_flag=True, help="Do not send the smoke prompt.")
@click.option(
    "--deadline",
    "deadline_s",
    default=55.0,
    show_default=True,
    type=click.FloatRange(1, 3600),
    help="Whole-run deadline in seconds.",
)
@click.option(
    "--unreachable",
    "unreachable_status",
    type=click.Choice(["unknown", "critical", "warning"]),
    default="unknown",
    show_default=True,
    help="Status of a host that cannot be reached.",
)
@click.option("--quiet", "-q", is_flag=True, help="Print nothing when every host is OK (for cron).")
@click.option(
    "--log-file", type=click.Path(path_type=Path), callback=writable_file, help="Append structured (JSON) logs here."
)
@click.option(
    "--lock-file",
    type=click.Path(path_type=Path),
    callback=writable_file,
    help="Overlap lock [default ~/.cache/fleet/health.lock].",
)
@click.pass_obj
def health(
    ctx: Invocation,
    host_name: str | None,
    deployment: str | None,
    as_json: bool,
    textfile: Path | None,
    heal: bool,
    max_heals_per_hour: int,
    skip_generation: bool,
    deadline_s: float,
    unreachable_status: str,
    quiet: bool,
    log_file: Path | None,
    lock_file: Path | None,
) -> None:
    """Check every host (SSH, server, /health, a real generation, GPUs, Xid, ECC, crash logs); Nagios exit codes.

    Exit 0 all OK, 1 warning, 2 critical, 3 unknown (also bad inventory or arguments). One SSH round trip
    per host plus the heal, all hosts in parallel; a second run while one is in progress exits 3 at once.

    \b
    Examples:
      fleet health
      fleet health --json --textfile /var/lib/node_exporter/textfile/fleet.prom
      fleet health --heal --quiet --log-file ~/.cache/fleet/health.log
      fleet health --host blackwell/qwen36-27b
    """
    import fcntl

    host_name, deployment = split_deployment(host_name, deployment)
    from fleet import log
    from fleet.health import EXIT_CODE

    if log_file:
        log.configure(json_file=log_file)
    logger = log.get(command="health")
    lock_path = lock_file or cache_file("health.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)  # a --lock-file's missing directories
    with _lock_file(lock_path) as lock_fd:  # held for the whole run: overlapping cron runs do not pile up
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_fd.seek(0)
            other = lock_fd.read().strip() or "?"
            click.echo(f"fleet health: another run is in progress ({other}); not starting a second one.", err=True)
            logger.warning("health_skipped_overlap", other=other)
            raise click.exceptions.Exit(3) from None
        lock_fd.seek(0)
        lock_fd.truncate()
        lock_fd.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        lock_fd.flush()
        from fleet.control.sweep import HealthOptions

        options = HealthOptions(
            skip_generation=skip_generation,
            heal=heal,
            max_heals_per_hour=max_heals_per_hour,
            unreachable_status=unreachable_status,
            signatures=ctx.signatures,
            secrets=ctx.secrets,
            api_keys=ctx.api_keys,
            heal_by=time.monotonic() + deadline_s,  # as the sweep's own deadline, begun a moment later
        )
        overall = _health_run(ctx, host_name, deployment, options, as_json, textfile, deadline_s, quiet, logger)
    raise click.exceptions.Exit(EXIT_CODE[overall])


def _service_health(ctx: Invocation, options: HealthOptions) -> list[Any]:
    """Each service that is up (in the services directory, brought up by `fleet up`) as one result named
    service/NAME (router, replicas serving through it, a request through it); with --heal, a dead router is
    started and a ready replica the router lost is registered again."""
    from fleet.cli.services import service_run, services_here
    from fleet.control.service_health import service_health
    from fleet.health import UNKNOWN, HostHealth
    from fleet.health.checks import Check

    out = []
    for name in services_here(ctx):
        try:
            h = service_health(service_run(ctx, name), heal=options.heal, ask=not options.skip_generation)
        except FleetError as exc:
            out.append(HostHealth(f"service/{name}", UNKNOWN, (Check("service", UNKNOWN, exc.message),)))
            continue
        if h is None:  # a service file never brought up is not checked
            continue
        heal = "; ".join(h.heal) or None
        out.append(HostHealth(f"service/{name}", h.status, tuple(h.checks), h.status == "ok", name, heal=heal))
    return out


def _lock_file(path: Path) -> Any:
    """The health lock, opened as a regular file of its own: not through a link (another user's, in a
    shared directory, to a file fleet's user may write), nor a FIFO (opening one would wait for good)."""
    import stat

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise ConfigError(f"the health lock {path} cannot be opened ({exc.strerror or exc}).", _LOCK_HINT) from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"the health lock {path} is not a regular file.", _LOCK_HINT)
    return os.fdopen(fd, "a+")


_LOCK_HINT = "Give --lock-file a path of a plain file (or none: fleet keeps its own under ~/.cache/fleet)."


def _write_textfile(textfile: Path, text: str) -> None:
    """Prometheus' node exporter reads the file whole: it is replaced at once, never seen half written.
    The file written first is made new (a name nobody could have put a link at)."""
    import tempfile

    textfile.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{textfile.name}.", suffix=".tmp", dir=textfile.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # the node exporter reads it, as it read the file written before
    os.replace(tmp, textfile)


def _health_run(
    ctx: Invocation,
    host_name: str | None,
    deployment: str | None,
    options: HealthOptions,
    as_json: bool,
    textfile: Path | None,
    deadline_s: float,
    quiet: bool,
    logger: Any,
) -> str:
    import threading

    from fleet.control import sweep as control
    from fleet.health import SEVERITY, prometheus_text, worst

    hosts = ctx.inventory.select([host_name] if host_name else None)

    def one(host: Host) -> Any:
        with transport_for(ctx, host) as t:
            result = control.check_host(t, host, options)
            if deployment is not None and result.checks and result.checks[0].status == "ok":
                result = result.only(deployment)  # (a host that could not be checked says so as it is)
            if options.heal and result.healable:
                from fleet import events
                from fleet.control import ops  # the deploy loop: only a heal needs it

                result = control.heal_host(
                    t,
                    host,
                    result,
                    options,
                    lambda name: ops.restart(
                        t,
                        host,
                        force=False,
                        progress=events.logged(host.name),
                        signatures=options.signatures,
                        name=name,
                        heal=True,
                    ),
                )
            return result

    started = time.monotonic()
    processes = 1
    if not pool_socket().exists():  # connecting from scratch: the handshakes' CPU is spread over processes
        processes = control.sweep_processes(len(hosts), control.usable_cpus(), threading.active_count() - 1)
    results = control.sweep_in_processes(hosts, one, deadline_s, options.unreachable_status, processes)
    logger.info("hosts_swept", hosts=len(hosts), processes=processes, seconds=round(time.monotonic() - started, 3))
    if not host_name:  # the whole fleet: each service and group as a whole too, after their hosts were checked
        from fleet.cli.groups import group_health

        results += _service_health(ctx, options)
        results += group_health(ctx, options.heal, results)
    results.sort(key=lambda r: (-SEVERITY[r.status], r.host))
    for r in results:
        logger.info(
            "host_checked",
            host=r.host,
            status=r.status,
            heal=r.heal,
            problems=[f"{c.label}: {c.detail}" for c in r.problems()],
        )
    if textfile:
        _write_textfile(textfile, prometheus_text(results, time.time()))
    overall = worst([r.status for r in results])
    if as_json:
        for r in results:
            emit_json(r.to_json())
    elif not (quiet and overall == "ok"):
        for r in results:
            problems = [c for c in r.problems() if c.name != "heal"]  # the heal has a line of its own
            summary = "; ".join(f"{c.label}: {c.detail}" for c in problems[:3]) or "all checks ok"
            # one line each: what a host said (a record's reason, an answer's body, another user's command
            # line) must not start a line that reads as fleet's own
            say(safe_line(f"{r.host:<12} {r.status.upper():<9} {r.playbook or '-':<18} {summary}"))
            if r.heal:
                say(safe_line(f"{'':<12} heal: {r.heal}"))
    return overall
