"""Build the transport for a host. SSH modules are imported lazily: cron starts fleet every minute."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fleet.inventory import Host
from fleet.transport.base import CommandResult, Transport

__all__ = ["CommandResult", "SshOptions", "Transport", "connect"]


@dataclass(frozen=True)
class SshOptions:
    known_hosts: Path
    ssh_config: Path | None
    accept_new_host_key: bool = False

    @classmethod
    def from_env(cls, accept_new_host_key: bool = False) -> SshOptions:
        """FLEET_KNOWN_HOSTS / FLEET_SSH_CONFIG override ~/.ssh (the sandbox and tests use their own)."""
        known = os.environ.get("FLEET_KNOWN_HOSTS") or os.path.expanduser("~/.ssh/known_hosts")
        config = os.environ.get("FLEET_SSH_CONFIG") or os.path.expanduser("~/.ssh/config")
        return cls(Path(known), Path(config), accept_new_host_key)


def connect(host: Host, options: SshOptions) -> Transport:
    """A transport for `host`; SSH connections open on first use."""
    if host.settings.connection == "local":
        from fleet.transport.local import LocalTransport

        return LocalTransport(host.name)
    from fleet.transport.ssh import SshTransport

    return SshTransport(
        host,
        known_hosts=options.known_hosts,
        ssh_config=options.ssh_config,
        accept_new_host_key=options.accept_new_host_key,
    )
