"""Build the transport for a host. SSH modules are imported lazily: cron starts fleet every minute.

While a connection pool runs (`fleet pool start`), SSH hosts are reached through it and paramiko is
not loaded here at all; without one, each run connects itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec

from fleet.errors import ConfigError
from fleet.inventory import Host
from fleet.paths import pool_socket
from fleet.transport.base import CommandResult, Transport

__all__ = ["CommandResult", "SshOptions", "Transport", "connect"]


@dataclass(frozen=True)
class SshOptions:
    known_hosts: Path
    ssh_config: Path | None
    accept_new_host_key: bool = False
    accept_new_jump_host_key: bool = False  # a ProxyJump hop's key: its own consent

    @classmethod
    def from_env(cls, accept_new_host_key: bool = False, accept_new_jump_host_key: bool = False) -> SshOptions:
        """FLEET_KNOWN_HOSTS / FLEET_SSH_CONFIG override ~/.ssh (the sandbox and tests use their own).
        A missing file is none (no known hosts, no config); one that is there but not a file is an error."""
        known = _ssh_file("FLEET_KNOWN_HOSTS", "~/.ssh/known_hosts", "the SSH host keys fleet checks")
        config = _ssh_file("FLEET_SSH_CONFIG", "~/.ssh/config", "the ssh_config fleet reads")
        return cls(known, config, accept_new_host_key, accept_new_jump_host_key)


def _ssh_file(variable: str, default: str, what: str) -> Path:
    given = os.environ.get(variable)
    path = Path(given or os.path.expanduser(default))
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise ConfigError(
            f"{path} ({variable if given else 'the default'}) is {kind}; it must be {what}.",
            f"Point {variable} at a file." if given else f"Move it aside, or set {variable} to a file.",
        )
    return path


def connect(host: Host, options: SshOptions) -> Transport:
    """A transport for `host`; SSH connections open on first use."""
    if host.settings.connection == "local":
        from fleet.transport.local import LocalTransport

        return LocalTransport(host.name)

    def direct() -> Transport:
        from fleet.transport.ssh import SshTransport

        return SshTransport(
            host,
            known_hosts=options.known_hosts,
            ssh_config=options.ssh_config,
            accept_new_host_key=options.accept_new_host_key,
            accept_new_jump_host_key=options.accept_new_jump_host_key,
        )

    socket_path = pool_socket()
    if not socket_path.exists():
        return direct()
    from fleet.transport.pool import PooledTransport

    # The pool runs in another directory: every path it is sent must mean what it means here.
    ssh_config = options.ssh_config if options.ssh_config and options.ssh_config.exists() else None
    sent = {
        "known_hosts": os.path.abspath(options.known_hosts),
        "ssh_config": os.path.abspath(ssh_config) if ssh_config else None,
        "accept_new_host_key": options.accept_new_host_key,
        "accept_new_jump_host_key": options.accept_new_jump_host_key,
    }
    identity = host.settings.identity_file
    if identity and not identity.startswith("~"):
        host = replace(host, settings=msgspec.structs.replace(host.settings, identity_file=os.path.abspath(identity)))
    return PooledTransport(host, sent, socket_path, direct)
