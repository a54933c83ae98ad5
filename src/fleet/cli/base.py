"""The command group, its shared context (inventory, playbooks, knowledge base, secrets), and the
helpers every command uses: printing host text safely, host selection, exit codes over several hosts."""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fleet import __version__
from fleet.cli.complete import host_option
from fleet.errors import ConfigError, FleetError
from fleet.paths import cache_dir
from fleet.terminal import safe_text

if TYPE_CHECKING:  # the inventory types and the rest load only when a command needs them: cron starts fleet often
    from fleet.crashes import Signature
    from fleet.inventory import Host, Inventory, NamedPlaybook
    from fleet.inventory.services import NamedService


class Invocation:
    """What one `fleet` command was invoked with (inventory, playbooks, SSH options), and what it loads
    from them once: the inventory, the knowledge base with the operator's --crashes files, the secrets."""

    def __init__(
        self,
        inventory: Path,
        playbooks: Path,
        debug: bool,
        accept_new_host_key: bool,
        accept_new_jump_host_key: bool,
        services: Path | None = None,
        crashes: Path | None = None,
    ) -> None:
        self.inventory_path = inventory
        self.playbooks_dir = playbooks
        self.services_dir = services or Path("services")
        self.crashes_dir = crashes
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
        """The crash knowledge base: the operator's --crashes directory (never the working directory's)
        before the built-in one."""
        from fleet.crashes import load_signatures

        user_dir = self.crashes_dir
        if user_dir is not None and not user_dir.is_dir():
            raise ConfigError(f"--crashes {user_dir}: no such directory.", "Name a directory of *.yaml signatures.")
        try:
            return load_signatures([user_dir] if user_dir is not None else [])
        except (ValueError, OSError) as exc:
            raise ConfigError(
                str(exc), f"Fix or remove the file under {user_dir} (see signatures.yaml for the schema)."
            ) from exc

    @functools.cached_property
    def _playbooks(self) -> list[NamedPlaybook]:
        """Every playbook that loads (a broken one is reported when it is used, not by `fleet logs`)."""
        from fleet.inventory import load_playbook

        found = []
        for path in sorted(self.playbooks_dir.glob("*.yaml")) if self.playbooks_dir.is_dir() else []:
            try:
                found.append(load_playbook(str(path), self.playbooks_dir))
            except FleetError:
                continue
        return found

    @functools.cached_property
    def secrets(self) -> dict[str, str]:
        """The values of every secret_env a playbook names and this shell has set: an engine may echo one
        into its log, so they are redacted from all host text fleet prints."""
        from fleet.secrets import remember

        names = {n for pb in self._playbooks for n in pb.spec.secret_names}
        found = {n: os.environ[n] for n in sorted(names) if n in os.environ}
        remember(found)  # hidden from everything this run prints, whichever path printed it
        return found

    @functools.cached_property
    def api_keys(self) -> dict[str, str]:
        """playbook name -> the variable holding its engine's API key (api_key_env), for those that have one:
        what fleet's own requests may send to a deployment of that playbook, and nothing else."""
        return {pb.name: pb.spec.api_key_env for pb in self._playbooks if pb.spec.api_key_env}

    def playbook(self, ref: str) -> NamedPlaybook:
        from fleet.inventory import load_playbook

        return load_playbook(ref, self.playbooks_dir)

    def service(self, ref: str) -> NamedService:
        from fleet.inventory.services import load_service

        return load_service(ref, self.services_dir)

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
def transport_for(ctx: Invocation, host: Host) -> Iterator[Any]:
    from fleet.transport import connect

    t = connect(host, ctx.ssh_options())
    try:
        yield t
    finally:
        t.close()


def _default_path(env: str, relative: str) -> Path:
    return Path(os.environ.get(env, relative))


CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def writable_file(_ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A file fleet will create or append to (its missing directories too): refused before anything
    runs when it cannot be, rather than a traceback after the work is done."""
    if value is None:
        return None
    if CONTROL_CHARS.search(str(value)):  # it would reach a crontab line or a log as more than a name
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


def cache_file(name: str) -> Path:
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
    try:  # opened to append, nothing written; without waiting (a FIFO nobody reads would hold it for good)
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    except OSError as exc:
        raise click.BadParameter(
            f"{path} cannot be written ({exc.strerror or exc}); choose another path.", param=param
        ) from exc


def replaceable_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """A file fleet replaces whole (written beside it, then renamed over it): never a device or FIFO, which
    the rename would replace with a regular file (/dev/null, as root)."""
    if value is not None and value.exists() and not value.is_file() and not value.is_dir():
        raise click.BadParameter(
            f"{value} is not a regular file, and fleet replaces the file it names; give a file path.", param=param
        )
    return writable_file(ctx, param, value)


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
    "--services",
    type=click.Path(path_type=Path),
    default=None,
    help="Service directory [env FLEET_SERVICES; default services/].",
)
@click.option(
    "--crashes",
    type=click.Path(path_type=Path),
    default=None,
    help="A directory of your own crash signatures (*.yaml), tried before the built-in ones [env FLEET_CRASHES; "
    "none by default: never read from the working directory].",
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
@click.version_option(__version__, prog_name="fleet", message="%(prog)s %(version)s")
@click.pass_context
def cli(
    click_ctx: click.Context,
    inventory: Path | None,
    playbooks: Path | None,
    services: Path | None,
    crashes: Path | None,
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
    click_ctx.obj = Invocation(
        inventory or _default_path("FLEET_INVENTORY", "inventory/hosts.yaml"),
        playbooks or _default_path("FLEET_PLAYBOOKS", "playbooks"),
        debug,
        accept_new_host_key,
        accept_new_jump_host_key,
        services or _default_path("FLEET_SERVICES", "services"),
        crashes or (Path(os.environ["FLEET_CRASHES"]) if os.environ.get("FLEET_CRASHES") else None),
    )
    from fleet.events import flush_progress

    click_ctx.call_on_close(flush_progress)  # progress a command reported is shown before it returns


def say(text: str, err: bool = False) -> None:
    """Print text that may carry what a host wrote (log lines, command lines): no terminal controls. What
    progress was reported before is shown first."""
    from fleet.events import flush_progress
    from fleet.secrets import hide

    if threading.current_thread() is threading.main_thread():  # the progress thread says things too
        flush_progress()
    click.echo(safe_text(hide(text)), err=err)


def emit_json(data: Any) -> None:
    from fleet.events import flush_progress
    from fleet.secrets import hidden

    flush_progress()
    click.echo(json.dumps(hidden(data), default=str, sort_keys=True))


def multi_host_options(fn: Any) -> Any:
    """--host/--name/--all/--force, shared by the commands that act on several hosts' deployments."""
    fn = click.option("--force", is_flag=True, help="Also kill foreign GPU holders.")(fn)
    fn = click.option("--all", "all_hosts", is_flag=True, help="Every host in the inventory.")(fn)
    fn = click.option(
        "--name", "deployment", help="One deployment (default: every deployment on the host). Also --host HOST/NAME."
    )(fn)
    return host_option(help="Inventory host or group (or HOST/DEPLOYMENT).")(fn)


def split_deployment(host_name: str | None, deployment: str | None) -> tuple[str | None, str | None]:
    """`--host blackwell/qwen36-27b` is `--host blackwell --name qwen36-27b`."""
    from fleet.protocol import DEPLOYMENT_NAME_RE

    if host_name and "/" in host_name:
        host_name, _, named = host_name.partition("/")
        if deployment and deployment != named:
            raise ConfigError(f"--host names deployment {named!r} and --name {deployment!r}.", "Give it once.")
        deployment = named
    if deployment is not None and not DEPLOYMENT_NAME_RE.match(deployment):
        raise ConfigError(
            f"{deployment!r} is not a deployment name (letters, digits and ._-, at most 63).",
            "`fleet status` lists the deployments of each host.",
        )
    return host_name, deployment


def parse_gpus(value: str | None) -> int | tuple[int, ...] | None:
    """--gpus: a count (`4`, fleet picks free GPUs) or indices as nvidia-smi numbers them (`6,7`;
    one index as `device=3`, Docker's spelling)."""
    if value is None:
        return None
    text = value.removeprefix("device=")
    words = [w.strip() for w in text.split(",")]
    if not all(w.isascii() and w.isdigit() and len(w) <= 2 for w in words) or not words:
        raise ConfigError(
            f"--gpus {value!r}: not a GPU count or a list of GPU indices.",
            "Give a count (--gpus 4), indices (--gpus 6,7) or one index (--gpus device=3).",
        )
    if text == value and len(words) == 1:
        count = int(words[0])
        if count < 1:
            raise ConfigError("--gpus 0: a deployment needs at least one GPU.", "Give a count of 1 or more.")
        return count
    indices = tuple(int(w) for w in words)
    if len(set(indices)) != len(indices):
        raise ConfigError(f"--gpus {value!r}: a GPU is listed twice.", "List each GPU once.")
    return indices


def each_host(
    ctx: Invocation, host_name: str | None, all_hosts: bool, fn: Any
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


def exit_for_failures(codes: list[int]) -> None:
    """Several hosts' failures as one exit code: theirs when they agree (3: every failed host was
    unreachable), else 1. Nothing failed: return."""
    if codes:
        raise click.exceptions.Exit(codes[0] if len(set(codes)) == 1 else 1)
