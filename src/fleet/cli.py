"""fleet's command line: parse arguments, build a transport per host, render, map errors to exit codes.

The only place that catches `FleetError`. Heavy modules (fabric, paramiko, rich) are imported inside
commands so `fleet --help` and cron runs start fast.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleet.errors import ConfigError, DeployFailed, FleetError
from fleet.paths import cache_dir, pool_socket, warm_socket
from fleet.terminal import safe_line, safe_text

if TYPE_CHECKING:  # the inventory types and the rest load only when a command needs them: cron starts fleet often
    from fleet.control.health import HealthOptions
    from fleet.crashes import Signature
    from fleet.inventory import Host, Inventory, NamedPlaybook


class Context:
    def __init__(
        self, inventory: Path, playbooks: Path, debug: bool, accept_new_host_key: bool, accept_new_jump_host_key: bool
    ) -> None:
        self.inventory_path = inventory
        self.playbooks_dir = playbooks
        self.debug = debug
        self.accept_new_host_key = accept_new_host_key
        self.accept_new_jump_host_key = accept_new_jump_host_key
        self._inventory: Inventory | None = None

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            from fleet.inventory import load_inventory

            self._inventory = load_inventory(self.inventory_path)
        return self._inventory

    @functools.cached_property
    def signatures(self) -> tuple[Signature, ...]:
        """The crash knowledge base: the user's crashes/*.yaml (project directory) before the built-in one."""
        from fleet.crashes import load_signatures

        user_dir = Path("crashes")
        try:
            return load_signatures([user_dir] if user_dir.is_dir() else [])
        except (ValueError, OSError) as exc:
            raise ConfigError(
                str(exc), "Fix or remove the file under crashes/ (see signatures.yaml for the schema)."
            ) from exc

    @functools.cached_property
    def secrets(self) -> dict[str, str]:
        """The values of every secret_env a playbook names and this shell has set: an engine may echo one
        into its log, so they are redacted from all host text fleet prints."""
        from fleet.inventory import load_playbook

        names: set[str] = set()
        for path in sorted(self.playbooks_dir.glob("*.yaml")) if self.playbooks_dir.is_dir() else []:
            try:
                names |= set(load_playbook(str(path), self.playbooks_dir).spec.secret_env)
            except FleetError:
                continue  # a broken playbook is reported when it is used, not by `fleet logs`
        return {n: os.environ[n] for n in sorted(names) if n in os.environ}

    def playbook(self, ref: str) -> NamedPlaybook:
        from fleet.inventory import load_playbook

        return load_playbook(ref, self.playbooks_dir)

    def host(self, name: str | None, playbook: NamedPlaybook | None = None) -> Host:
        if not name and playbook is not None:
            # Checked only when used: a playbook shared between inventories names one of them in default_host.
            from fleet.inventory import check_playbook_host

            check_playbook_host(playbook, self.inventory)
            name = playbook.spec.default_host
        if not name:
            raise ConfigError("no host given.", "Pass --host NAME (or set default_host: in the playbook).")
        hosts = self.inventory.select([name])
        if len(hosts) != 1:
            raise ConfigError(f'"{name}" is a group of {len(hosts)} hosts.', "Pass a single host with --host.")
        return hosts[0]

    def ssh_options(self) -> Any:
        from fleet.transport import SshOptions

        return SshOptions.from_env(self.accept_new_host_key, self.accept_new_jump_host_key)


@contextmanager
def transport_for(ctx: Context, host: Host) -> Iterator[Any]:
    from fleet.transport import connect

    t = connect(host, ctx.ssh_options())
    try:
        yield t
    finally:
        t.close()


def _default_path(env: str, relative: str) -> Path:
    return Path(os.environ.get(env, relative))


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _writable_file(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A file fleet will create or append to (its missing directories too): refused before anything
    runs when it cannot be, rather than a traceback after the work is done."""
    if value is None:
        return None
    if _CONTROL_CHARS.search(str(value)):  # it would reach a crontab line or a log as more than a name
        raise click.BadParameter(
            f"{str(value)!r} contains a newline or another control character; give a plain path.", param=param
        )
    if value.is_dir():
        raise click.BadParameter(f"{value} is a directory; give a file name in it.", param=param)
    if value.exists() and not value.is_file():  # /dev/null, a FIFO: written in place, its directory untouched
        _try_append(value, param)
        return value
    existing = value.absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise click.BadParameter(f"{existing} is not a directory, so {value} cannot be created.", param=param)
    try:
        _create_and_remove_in(existing)
    except OSError as exc:
        raise click.BadParameter(
            f"{value} cannot be written: no file can be created in {existing} ({exc.strerror or exc}); "
            "choose another path.",
            param=param,
        ) from exc
    if value.exists():
        _try_append(value, param)
    return value


def _create_and_remove_in(directory: Path) -> None:
    """Raises OSError where no file can be created. Tried, not asked with os.access: root passes every
    access check, yet cannot create a file in a pseudo-filesystem such as /proc or on a read-only mount."""
    probe = directory / f".fleet-write-check-{os.getpid()}-{time.monotonic_ns()}"  # not tempfile: ~3 ms of imports
    os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    os.unlink(probe)


def _cache_file(name: str) -> Path:
    """`name` in fleet's cache directory, made (and found writable) now rather than failing mid-run with a
    traceback: a service account's HOME is often /nonexistent or read-only."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # as the pool makes it: its sockets live here
        _create_and_remove_in(directory)
    except OSError as exc:
        raise ConfigError(
            f"fleet's cache directory {directory} cannot be written ({exc.strerror or exc}).",
            "Set XDG_CACHE_HOME to a directory this user can write (fleet keeps its health lock, logs and "
            "pool sockets under $XDG_CACHE_HOME/fleet).",
        ) from exc
    return directory / name


def _try_append(path: Path, param: click.Parameter) -> None:
    try:
        with open(path, "a"):  # opened to append, nothing written
            pass
    except OSError as exc:
        raise click.BadParameter(
            f"{path} cannot be written ({exc.strerror or exc}); choose another path.", param=param
        ) from exc


def _replaceable_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A file fleet replaces whole (written beside it, then renamed over it): never a device or FIFO, which
    the rename would replace with a regular file (/dev/null, as root)."""
    if value is not None and value.exists() and not value.is_file() and not value.is_dir():
        raise click.BadParameter(
            f"{value} is not a regular file, and fleet replaces the file it names; give a file path.", param=param
        )
    return _writable_file(ctx, param, value)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--inventory",
    "-i",
    type=click.Path(path_type=Path),
    default=None,
    help="Inventory file [env FLEET_INVENTORY; default inventory/hosts.yaml].",
)
@click.option(
    "--playbooks",
    type=click.Path(path_type=Path),
    default=None,
    help="Playbook directory [env FLEET_PLAYBOOKS; default playbooks/].",
)
@click.option(
    "--accept-new-host-key", is_flag=True, help="Record an unknown SSH host key (a changed key is always refused)."
)
@click.option(
    "--accept-new-jump-host-key",
    is_flag=True,
    help="Record an unknown SSH host key of a ProxyJump host (never implied by --accept-new-host-key).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(
    click_ctx: click.Context,
    inventory: Path | None,
    playbooks: Path | None,
    accept_new_host_key: bool,
    accept_new_jump_host_key: bool,
    debug: bool,
) -> None:
    """Deploy and keep alive LLM inference servers (SGLang, vLLM) on GPU hosts over SSH.

    \b
    Examples:
      fleet facts --host blackwell
      fleet plan qwen35-nvfp4 --host blackwell
      fleet deploy qwen35-nvfp4 --host blackwell
      fleet status
      fleet health --json
    """
    from fleet import log

    log.configure(verbose=debug)
    click_ctx.obj = Context(
        inventory or _default_path("FLEET_INVENTORY", "inventory/hosts.yaml"),
        playbooks or _default_path("FLEET_PLAYBOOKS", "playbooks"),
        debug,
        accept_new_host_key,
        accept_new_jump_host_key,
    )


def _say(text: str, err: bool = False) -> None:
    """Print text that may carry what a host wrote (log lines, command lines): no terminal controls."""
    click.echo(safe_text(text), err=err)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, default=str, sort_keys=True))


@cli.command()
@click.option("--host", "-H", "host_name", required=True, help="Inventory host name.")
@click.option("--model", help="Also read this model directory (path on the host, or relative to models_dir).")
@click.option("--json", "as_json", is_flag=True, help="Print the raw facts as JSON.")
@click.pass_obj
def facts(ctx: Context, host_name: str, model: str | None, as_json: bool) -> None:
    """Gather a host's facts (GPUs, holders, servers, engines, disk, state) in one SSH round trip.

    \b
    Example:
      fleet facts --host blackwell --json
    """
    from fleet.control.facts import read_facts
    from fleet.facts import gpu_mismatches

    host = ctx.host(host_name)
    with transport_for(ctx, host) as t:
        f = read_facts(t, host, model=model)
    warnings = [m.message for m in gpu_mismatches(host.settings.expected_gpus, f.gpus)]
    warnings += [f"fleet's state on the host is unreadable: {e}" for e in f.remote.errors]
    if as_json:
        _emit_json(f.raw | {"host": host.name, "round_trips": t.commands_run, "warnings": warnings})
        return
    from fleet.render import render_facts

    render_facts(f, warnings)


@cli.command()
@click.argument("playbook")
@click.option("--host", "-H", "host_name", help="Inventory host (default: the playbook's default_host).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.pass_obj
def plan(ctx: Context, playbook: str, host_name: str | None, as_json: bool) -> None:
    """Show the exact command line and environment `fleet deploy` would run, each flag with its reason.

    Gathers the host's facts in one round trip; changes nothing on the host. Exits 4 when pre-flight
    refuses the deployment.

    \b
    Example:
      fleet plan qwen35-nvfp4 --host blackwell
    """
    from fleet.control.facts import model_path, read_facts
    from fleet.plan.build import build_plan

    pb = ctx.playbook(playbook)
    host = ctx.host(host_name, pb)
    path = model_path(host, pb.spec.model)
    with transport_for(ctx, host) as t:
        f = read_facts(t, host, model=path, engine=pb.spec.engine)
    result = build_plan(host, pb, f, path)
    if as_json:
        _emit_json(
            {
                "host": host.name,
                "playbook": pb.name,
                "model": result.model.describe() if result.model else None,
                "plan": result.plan.to_json() if result.plan else None,
                "verdicts": [vars(v) for v in result.verdicts],
            }
        )
    else:
        from fleet.render import render_plan

        render_plan(result, host.name, pb.name)
    if result.errors:
        raise click.exceptions.Exit(4)


def describe_stopped(stopped: list[dict[str, Any]]) -> list[str]:
    """One line per process group fleet stopped: its main command and how many processes went with it."""
    from fleet.facts import one_line

    groups: dict[int, list[dict[str, Any]]] = {}
    for p in stopped:
        groups.setdefault(p["pgid"], []).append(p)
    lines = []
    for members in groups.values():
        main = next((p for p in members if "sglang." in p["cmdline"] or "vllm" in p["cmdline"]), members[0])
        how = f"; {main['stop']}" if main.get("stop") else ""
        lines.append(
            f"{main['why']} pid {main['pid']} (+{len(members) - 1} in its group{how}): "
            + one_line(main["cmdline"])[:100]
        )
    return lines


def describe_left(left: list[dict[str, Any]]) -> list[str]:
    """The GPU daemons and tools fleet saw holding the devices and left running."""
    return [f"left running: {p['why']} (pid {p['pid']}, user {p['user']})" for p in left]


class Reporter:
    """Progress of a deploy on stderr: phases always; the live log line on a terminal."""

    def __init__(self, host: str, quiet: bool = False, show_log: bool = False) -> None:
        self.host = host
        self.quiet = quiet
        self.show_log = show_log
        self.started = time.monotonic()
        self.attempt = 1
        self.max = 1
        self.tty = sys.stderr.isatty()
        self.last_line = ""

    def say(self, text: str) -> None:
        if not self.quiet:
            if self.tty and self.last_line:
                sys.stderr.write("\r\x1b[K")
            _say(text, err=True)

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        elapsed = time.monotonic() - self.started
        h = self.host
        if event == "planned":
            learned = data["learned"]
            self.say(f"{h}: {data['model']}")
            if learned:
                self.say(f"{h}: the plan includes learned fixes: {', '.join(learned)}")
        elif event == "attempt":
            self.attempt, self.max = data["attempt"], data["max"]
            self.say(f"{h}: attempt {self.attempt}/{self.max} [{elapsed:5.1f}s]")
        elif event == "engine_check":
            self.say(f"{h}: engine's own argument check: {data['verdict']}")
        elif event == "engine_check_skipped":
            self.say(
                f"{h}: engine's own argument check: not needed (this command line ran with {data['version']} here)"
            )
        elif event == "stopped":
            for line in describe_stopped(data["stopped"]):
                self.say(f"{h}: stopped {line}")
            for line in describe_left(data.get("left", [])):
                self.say(f"{h}: {line}")
            mem = data.get("memory") or {}
            if data["stopped"] and mem.get("before_mib") is not None:
                freed = sum(mem["before_mib"]) - sum(mem["after_mib"] or [])
                self.say(f"{h}: GPU memory released: {freed / 1024:.1f} GiB in {mem['waited_s']:.1f}s")
        elif event == "launched":
            self.say(f"{h}: launched pid {data['pid']}, log {data['log']} [{elapsed:5.1f}s]")
        elif event == "log":
            if self.show_log:
                self.say(f"  | {safe_line(data['line'])}")
            elif self.tty and not self.quiet:
                line = safe_line(data["line"])[: max(20, shutil.get_terminal_size().columns - 30)]
                sys.stderr.write(f"\r\x1b[K{h} [{self.attempt}/{self.max} {elapsed:5.1f}s] {line}")
                sys.stderr.flush()
                self.last_line = line
        elif event == "diagnosed":
            d = data["diagnosis"]
            self.say(
                f"{h}: attempt {data['attempt']} {data['outcome']}: {d['category']}"
                f"{' (' + d['signature'] + ')' if d['signature'] else ''} — {d['explanation']}"
            )
            for line in d["evidence"][:4]:
                self.say(f"    > {line}")
        elif event == "relaunching":
            where = "re-checking (nothing was stopped)" if data["nothing_stopped"] else "relaunching"
            self.say(f"{h}: {where} with the fix: {data['fix']} (attempt {data['attempt']}/{data['max']})")
        elif event == "reconnecting":
            self.say(f"{h}: connection dropped; reconnecting and resuming the log at byte {data['offset']}")
        elif event == "log_reset":
            self.say(f"{h}: the engine's log was {data['why']} ({safe_line(data['log'])}); following it from the start")
        elif event == "lock_taken_over":
            prev = data["previous"]
            self.say(f"{h}: took over a stale lock of {prev.get('owner')} ({prev.get('command')})")
        elif event == "ready":
            self.say(f"{h}: ready; smoke answer {data['smoke'].get('text', '')!r} [{elapsed:5.1f}s]")
        elif event == "adopted":
            self.say(f"{h}: pid {data['pid']} already runs this plan; checked it instead of restarting it:")
            for line in data["checks"]:
                self.say(f"    {line}")
        elif event == "not_adopted":
            self.say(f"{h}: the running server has this plan but fails: {'; '.join(data['problems'])}; redeploying")


def _print_result(r: Any) -> None:
    if r.ok and r.adopted:
        _say(f"{r.host}: {r.playbook} is up at {r.endpoint}: {r.reason} (`fleet restart` restarts it).")
        return
    if r.ok:
        fixes = f"; fixed on the way: {', '.join(r.new_fixes)}" if r.new_fixes else ""
        _say(
            f"{r.host}: {r.playbook} is up at {r.endpoint} after {len(r.attempts)} attempt(s) in "
            f"{r.ready_s:.1f}s{fixes}."
        )
        if r.learned_applied:
            _say(f"{r.host}: learned fixes used: {', '.join(r.learned_applied)}")
        return
    last = r.attempts[-1]
    d = last.diagnosis
    _say(f"{r.host}: {r.playbook} FAILED after {len(r.attempts)} attempt(s): {r.reason}", err=True)
    if d is not None:
        _say(f"  diagnosis: {d.category}{' (' + d.signature + ')' if d.signature else ''}: {d.explanation}", err=True)
        for line in d.evidence:
            _say(f"  evidence: {line}", err=True)
    if last.log:
        _say(f"  log: {last.log}", err=True)
    if r.log_tail:
        _say("  last log lines:", err=True)
        for line in r.log_tail[-40:]:
            _say(f"    {line}", err=True)


def _result_json(r: Any) -> dict[str, Any]:
    return {
        "host": r.host,
        "playbook": r.playbook,
        "ok": r.ok,
        "reason": r.reason,
        "endpoint": r.endpoint,
        "ready_s": round(r.ready_s, 3),
        "adopted": r.adopted,
        "round_trips": r.round_trips,
        "learned_applied": list(r.learned_applied),
        "new_fixes": r.new_fixes,
        "argv": r.plan.argv(),
        "attempts": [
            {
                "n": a.number,
                "outcome": a.outcome,
                "fix": a.fix,
                "log": a.log,
                "seconds": round(a.seconds, 3),
                "diagnosis": a.diagnosis.to_json() if a.diagnosis else None,
            }
            for a in r.attempts
        ],
    }


@cli.command()
@click.argument("playbook")
@click.option("--host", "-H", "host_name", help="Inventory host (default: the playbook's default_host).")
@click.option(
    "--force",
    is_flag=True,
    help=(
        "Also kill foreign GPU and port holders (other users' processes, non-engines); lists them. "
        "GPU daemons and tools are never killed."
    ),
)
@click.option("--no-engine-check", is_flag=True, help="Skip the engine's own argument check before stopping anything.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option("--show-log", is_flag=True, help="Print every engine log line as it arrives.")
@click.pass_obj
def deploy(
    ctx: Context,
    playbook: str,
    host_name: str | None,
    force: bool,
    no_engine_check: bool,
    as_json: bool,
    show_log: bool,
) -> None:
    """Deploy a playbook to a host: plan, pre-flight, stop stale servers, free GPUs, launch, watch, prove.

    Known crashes are diagnosed and relaunched with their fix (each fix at most once, bounded attempts);
    unknown ones fail fast with the traceback. Exit 0 when the server answers the smoke prompt correctly.
    A server already running exactly this plan is checked (health, models, the smoke prompt) and left
    running; `fleet restart` restarts it (e.g. after a secret changed).

    \b
    Example:
      fleet deploy qwen35-nvfp4 --host blackwell
    """
    from fleet.control import ops

    pb = ctx.playbook(playbook)
    host = ctx.host(host_name, pb)
    reporter = Reporter(host.name, quiet=as_json, show_log=show_log)
    with transport_for(ctx, host) as t:
        result = ops.deploy(
            t,
            host,
            pb,
            force=force,
            engine_check=not no_engine_check,
            progress=reporter,
            signatures=ctx.signatures,
        )
    if as_json:
        _emit_json(_result_json(result))
    else:
        _print_result(result)
    if not result.ok:
        raise click.exceptions.Exit(7)


def multi_host_options(fn: Any) -> Any:
    """--host/--all/--force, shared by the commands that act on several hosts."""
    fn = click.option("--force", is_flag=True, help="Also kill foreign GPU holders.")(fn)
    fn = click.option("--all", "all_hosts", is_flag=True, help="Every host in the inventory.")(fn)
    return click.option("--host", "-H", "host_name", help="Inventory host or group.")(fn)


def _each_host(
    ctx: Context, host_name: str | None, all_hosts: bool, fn: Any
) -> list[tuple[str, Any, FleetError | None]]:
    """Run fn(transport, host) on the chosen hosts in parallel; one host failing does not stop the others."""
    from concurrent.futures import ThreadPoolExecutor

    if not host_name and not all_hosts:
        raise ConfigError("no host given.", "Pass --host NAME or --all.")
    hosts = ctx.inventory.select([host_name] if host_name else None)

    def one(host: Host) -> tuple[str, Any, FleetError | None]:
        try:
            with transport_for(ctx, host) as t:
                return host.name, fn(t, host), None
        except FleetError as exc:
            return host.name, None, exc

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(hosts)))) as pool:
        return list(pool.map(one, hosts))


def _exit_for_failures(codes: list[int]) -> None:
    """Several hosts' failures as one exit code: theirs when they agree (3: every failed host was
    unreachable), else 1. Nothing failed: return."""
    if codes:
        raise click.exceptions.Exit(codes[0] if len(set(codes)) == 1 else 1)


@cli.command()
@multi_host_options
@click.pass_obj
def restart(ctx: Context, host_name: str | None, all_hosts: bool, force: bool) -> None:
    """Redeploy the plan recorded on the host(s), with learned fixes, through the same loop.

    \b
    Example:
      fleet restart --host blackwell
    """
    from fleet.control import ops

    results = _each_host(
        ctx,
        host_name,
        all_hosts,
        lambda t, h: ops.restart(t, h, force=force, progress=Reporter(h.name), signatures=ctx.signatures),
    )
    failures = []
    for name, r, err in results:
        if err:
            _say(f"{name}: error: {err}", err=True)
            failures.append(err.exit_code)
        else:
            _print_result(r)
            if not r.ok:
                failures.append(DeployFailed.exit_code)
    _exit_for_failures(failures)


@cli.command()
@multi_host_options
@click.pass_obj
def stop(ctx: Context, host_name: str | None, all_hosts: bool, force: bool) -> None:
    """Stop fleet's server (and any stale inference server) on the host(s), free the GPUs; state becomes "stopped".

    \b
    Example:
      fleet stop --host ct129
    """
    from fleet.control import ops

    failures = []
    for name, out, err in _each_host(ctx, host_name, all_hosts, lambda t, h: ops.stop(t, h, force=force)):
        if err:
            _say(f"{name}: error: {err}", err=True)
            failures.append(err.exit_code)
            continue
        stopped = out.get("stopped", [])
        lines = [*describe_stopped(stopped), *describe_left(out.get("left", []))]
        lines += [  # stopping fleet's own server never needs --force; what is not fleet's is said and left
            f"not stopped: pid {p.get('pid')} (user {p.get('user')}: {str(p.get('cmdline'))[:80]}) — {p['why']}; "
            "--force stops it"
            for p in out.get("refused", [])
        ]
        _say(f"{name}: stopped {len(stopped)} process(es)" + "".join(f"\n  {x}" for x in lines))
    _exit_for_failures(failures)


@cli.command()
@click.option("--host", "-H", "host_name", help="Inventory host or group (default: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host per line.")
@click.pass_obj
def status(ctx: Context, host_name: str | None, as_json: bool) -> None:
    """One line per host: playbook, engine and version, pid, port, uptime, status, last outcome.

    \b
    Example:
      fleet status
    """
    from fleet.control import ops
    from fleet.control.facts import read_facts

    rows, failures = [], []
    for name, row, err in _each_host(ctx, host_name, True, lambda t, h: ops.status_row(h, read_facts(t, h))):
        rows.append(row if row else {"host": name, "status": "unreachable", "error": str(err)})
        failures += [err.exit_code] if err else []
    for r in rows:
        if as_json:
            _emit_json(r)
        elif r.get("error"):
            _say(f"{r['host']:<12} unreachable  {r['error']}")
        else:
            up = f"{r['uptime_s']}s" if r.get("uptime_s") is not None else "-"
            _say(  # the playbook, engine and fixes come from the host's record
                f"{r['host']:<12} {r['status']:<10} {r.get('playbook') or '-':<18} "
                f"{(r.get('engine') or '-') + ' ' + (r.get('engine_version') or ''):<16} "
                f"pid {r.get('pid') or '-':<7} port {r.get('port') or '-':<6} up {up:<8} "
                f"attempts {r.get('attempts') or '-'}"
                f"{'  fixes: ' + ','.join(r['applied_fixes']) if r.get('applied_fixes') else ''}"
            )
    _exit_for_failures(failures)


@cli.command()
@click.option("--host", "-H", "host_name", required=True, help="Inventory host.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines as they are written.")
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
def logs(ctx: Context, host_name: str, follow: bool, lines: int, raw: bool) -> None:
    """Print (or follow) the current server log of a host over SSH.

    \b
    Example:
      fleet logs --host blackwell -n 50 -f
    """
    from fleet.control import ops
    from fleet.secrets import LineFilter, redact

    host = ctx.host(host_name)
    secrets = ctx.secrets
    lines_out = LineFilter(lambda text: redact(text if raw else safe_text(text), secrets))

    def sink(chunk: bytes) -> bool:
        sys.stdout.write(lines_out.feed(chunk))
        sys.stdout.flush()
        return True

    with transport_for(ctx, host) as t:
        try:
            code = ops.logs(t, host, lines=lines, follow=follow, sink=sink)
        finally:
            sys.stdout.write(lines_out.close())
            sys.stdout.flush()
    if code not in (0, -1):
        raise click.exceptions.Exit(code)


DIAGNOSE_LINES = 5000  # the end of a log diagnosed: a crash's traceback and what led to it
DIAGNOSE_BYTES = 16 << 20  # and at most this much of it in memory (a server log grows to gigabytes)


def _log_end(stream: Any) -> str:
    """The last DIAGNOSE_LINES lines of a binary stream, never more than ~DIAGNOSE_BYTES held at once."""
    from collections import deque

    kept: deque[bytes] = deque()
    held = 0
    while line := stream.readline(1 << 20):  # a line without an end arrives in pieces
        kept.append(line)
        held += len(line)
        while len(kept) > DIAGNOSE_LINES or held > DIAGNOSE_BYTES:
            held -= len(kept.popleft())
    return b"".join(kept).decode("utf-8", "replace")


@cli.command()
@click.argument("source", required=False)
@click.option("--host", "-H", "host_name", help="Diagnose the host's current server log instead of a file.")
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), help="Engine the log comes from (narrows signatures).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_obj
def diagnose(ctx: Context, source: str | None, host_name: str | None, engine: str | None, as_json: bool) -> None:
    """Classify an engine log (a file, - for stdin, or a host's current log) with the crash knowledge base.

    \b
    Examples:
      fleet diagnose server.log --json
      docker logs sglang 2>&1 | fleet diagnose -
      fleet diagnose --host blackwell
    """
    from fleet.crashes import Context as CrashContext
    from fleet.crashes import diagnose as run_diagnosis

    if host_name:
        from fleet.control import ops

        host = ctx.host(host_name)
        chunks: list[bytes] = []

        def keep(chunk: bytes) -> bool:
            chunks.append(chunk)
            return True

        with transport_for(ctx, host) as t:
            ops.logs(t, host, lines=DIAGNOSE_LINES, follow=False, sink=keep)
        text = b"".join(chunks).decode("utf-8", "replace")
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
    d = run_diagnosis(text.splitlines(), CrashContext(engine=engine), ctx.signatures)
    if as_json:
        _emit_json(d.to_json())
        return
    _say(f"{d.category}{' (' + d.signature + ')' if d.signature else ''}: {d.explanation}")
    _say(f"basis: {d.basis or 'the log shows no failure'}")
    if d.fix:
        _say(f"fix: {d.fix.describe()}")
    for line in d.evidence:
        _say(f"evidence: {safe_line(line)}")


@cli.command()
@click.option("--host", "-H", "host_name", help="Inventory host or group (default: all hosts).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host per line.")
@click.option(
    "--textfile",
    type=click.Path(path_type=Path),
    callback=_replaceable_file,
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
    "--log-file", type=click.Path(path_type=Path), callback=_writable_file, help="Append structured (JSON) logs here."
)
@click.option(
    "--lock-file",
    type=click.Path(path_type=Path),
    callback=_writable_file,
    help="Overlap lock [default ~/.cache/fleet/health.lock].",
)
@click.pass_obj
def health(
    ctx: Context,
    host_name: str | None,
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
    """
    import fcntl

    from fleet import log
    from fleet.health import EXIT_CODE

    if log_file:
        log.configure(json_file=log_file)
    logger = log.get(command="health")
    lock_path = lock_file or _cache_file("health.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)  # a --lock-file's missing directories
    with open(lock_path, "a+") as lock_fd:  # held for the whole run: overlapping cron runs do not pile up
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
        from fleet.control.health import HealthOptions

        options = HealthOptions(
            skip_generation=skip_generation,
            heal=heal,
            max_heals_per_hour=max_heals_per_hour,
            unreachable_status=unreachable_status,
            signatures=ctx.signatures,
            secrets=ctx.secrets,
        )
        overall = _health_run(ctx, host_name, options, as_json, textfile, deadline_s, quiet, logger)
    raise click.exceptions.Exit(EXIT_CODE[overall])


def _health_run(
    ctx: Context,
    host_name: str | None,
    options: HealthOptions,
    as_json: bool,
    textfile: Path | None,
    deadline_s: float,
    quiet: bool,
    logger: Any,
) -> str:
    import threading

    from fleet.control import health as control
    from fleet.health import SEVERITY, prometheus_text, worst

    hosts = ctx.inventory.select([host_name] if host_name else None)

    def one(host: Host) -> Any:
        with transport_for(ctx, host) as t:
            result = control.check_host(t, host, options)
            if options.heal and result.healable:
                from fleet.control import ops  # the deploy loop: only a heal needs it

                result = control.heal_host(
                    t,
                    host,
                    result,
                    options,
                    lambda: ops.restart(
                        t, host, force=False, progress=lambda e, d: None, signatures=options.signatures
                    ),
                )
            return result

    started = time.monotonic()
    processes = 1
    if not pool_socket().exists():  # connecting from scratch: the handshakes' CPU is spread over processes
        processes = control.sweep_processes(len(hosts), control.usable_cpus(), threading.active_count() - 1)
        if processes > 1 and any(h.settings.connection == "ssh" for h in hosts):
            import fleet.transport.ssh  # noqa: F401 - imported once here rather than in every child
    results = control.sweep_in_processes(hosts, one, deadline_s, options.unreachable_status, processes)
    logger.info("hosts_swept", hosts=len(hosts), processes=processes, seconds=round(time.monotonic() - started, 3))
    results.sort(key=lambda r: (-SEVERITY[r.status], r.host))
    for r in results:
        logger.info(
            "host_checked",
            host=r.host,
            status=r.status,
            heal=r.heal,
            problems=[f"{c.name}: {c.detail}" for c in r.problems()],
        )
    if textfile:
        textfile.parent.mkdir(parents=True, exist_ok=True)
        tmp = textfile.with_name(f".{textfile.name}.{os.getpid()}.tmp")
        tmp.write_text(prometheus_text(results, time.time()))
        os.replace(tmp, textfile)
    overall = worst([r.status for r in results])
    if as_json:
        for r in results:
            _emit_json(r.to_json())
    elif not (quiet and overall == "ok"):
        for r in results:
            problems = [c for c in r.problems() if c.name != "heal"]  # the heal has a line of its own
            summary = "; ".join(f"{c.name}: {c.detail}" for c in problems[:3]) or "all checks ok"
            _say(f"{r.host:<12} {r.status.upper():<9} {r.playbook or '-':<18} {summary}")  # evidence from logs
            if r.heal:
                _say(f"{'':<12} heal: {r.heal}")
    return overall


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
    callback=_writable_file,
    help="Where cron runs log [default ~/.cache/fleet/health.log].",
)
@click.pass_obj
def cron_install(ctx: Context, schedule: str, heal: bool, log_file: Path | None) -> None:
    """Install (or replace) the entry. Example: fleet cron install --schedule "* * * * *" --heal"""
    import shlex

    fields = schedule.split()
    if len(fields) != 5 or not all(re.fullmatch(r"[0-9*/,\-]+", f) for f in fields):
        raise ConfigError(f'cron schedule "{schedule}" is not five cron fields.', 'Example: --schedule "*/5 * * * *".')
    log_path = (log_file or _cache_file("health.log")).resolve()
    exe = shutil.which("fleet") or str(Path(sys.executable).parent / "fleet")
    env = [
        ("FLEET_INVENTORY", str(ctx.inventory_path.resolve())),
        ("FLEET_PLAYBOOKS", str(ctx.playbooks_dir.resolve())),
        *((k, os.environ[k]) for k in ("FLEET_KNOWN_HOSTS", "FLEET_SSH_CONFIG", "PYTHONPATH") if k in os.environ),
    ]
    # Everything that reaches the line besides fixed text: a newline in any of them would add crontab lines
    # of its own (the schedule's fields are checked above, not the whitespace between them).
    for name, value in [("--schedule", schedule), ("fleet", exe), *env, ("--log-file", str(log_path))]:
        if _CONTROL_CHARS.search(value):
            raise ConfigError(
                f"cron: {name}={value!r} contains a newline or another control character; the crontab was not changed.",
                "Use paths and variables without control characters.",
            )
    command = (
        " ".join(f"{k}={shlex.quote(v)}" for k, v in env)
        + f" {shlex.quote(exe)} health --quiet{' --heal' if heal else ''} "
        f"--log-file {shlex.quote(str(log_path))} >> {shlex.quote(str(log_path))}.out 2>&1"
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


def _ask_pool(request: dict[str, Any]) -> dict[str, Any] | None:
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
    log_path = _cache_file("pool.log")
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

    _cache_file("pool.sock")  # its directory
    serve(pool_socket(), idle_timeout_s)


@pool.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the pool's state as JSON.")
def pool_status(as_json: bool) -> None:
    """Show the pool and the connections it holds; exit 1 if it is not running. Example: fleet pool status"""
    state = _ask_pool({"op": "status"})
    if as_json:
        _emit_json(state or {"running": False})
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


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the exit code (0 ok; see fleet.errors for the others)."""
    from fleet.launch import command_word

    args = argv if argv is not None else sys.argv[1:]
    # Nagios: a check that could not run (bad inventory or arguments, say) is "unknown", not "critical".
    could_not_run = 3 if command_word(args) == "health" else None
    try:
        code = cli.main(args=argv, prog_name="fleet", standalone_mode=False)
    except FleetError as exc:
        _say(f"error: {exc.message}", err=True)
        if exc.hint:
            _say(f"       {exc.hint}", err=True)
        if "--debug" in args:
            if getattr(exc, "remote_traceback", ""):
                _say("the host said:\n" + exc.remote_traceback, err=True)  # type: ignore[attr-defined]
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
