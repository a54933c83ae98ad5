"""Host keys, checked strictly: only the known_hosts file fleet was given is trusted, an unknown key is
refused unless recording it was consented to (OpenSSH's `accept-new`), separately for the host and for
its ProxyJump hops, and a changed key is always refused (paramiko raises BadHostKeyException)."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

from fleet.errors import ConfigError
from fleet.transport.sshlib import Connection, paramiko


class RecordNewKey(paramiko.MissingHostKeyPolicy):
    """Accept an unknown key once and append it to the known_hosts file (OpenSSH `accept-new`)."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


@functools.lru_cache(maxsize=8)
def _parsed_known_hosts(path: str, mtime_ns: int, size: int) -> paramiko.HostKeys:
    """One parse per file version, shared read-only by every connection: a sweep of N hosts would
    otherwise parse an N-line file N times (paramiko's load is quadratic in the lines, too)."""
    try:
        return paramiko.HostKeys(path)
    except (OSError, ValueError, paramiko.SSHException) as exc:  # unreadable, not text, a malformed key
        raise ConfigError(
            f"{path} cannot be read as a known_hosts file ({type(exc).__name__}: {exc}).",
            "Fix or remove the lines it names; `ssh-keygen -R HOST -f FILE` drops one host's keys.",
        ) from exc


# A sweep's threads all ask for the shared parses at once: one computes, the others wait for it.
SHARED_PARSE_LOCK = threading.Lock()


def known_host_keys(known_hosts: Path) -> paramiko.HostKeys:
    try:
        st = known_hosts.stat()
    except FileNotFoundError:
        return paramiko.HostKeys()
    with SHARED_PARSE_LOCK:
        return _parsed_known_hosts(str(known_hosts), st.st_mtime_ns, st.st_size)


class UnknownKey(paramiko.SSHException):
    """An unknown host key, refused: says which hop's (the host itself, or a ProxyJump host)."""

    def __init__(self, hostname: str, jump: bool) -> None:
        super().__init__(f"Server {hostname!r} not found in known_hosts")
        self.hostname, self.jump = hostname, jump


class Refuse(paramiko.MissingHostKeyPolicy):
    def __init__(self, jump: bool) -> None:
        self.jump = jump

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownKey(hostname, self.jump)


def harden(conn: Connection, known_hosts: Path, accept_new: bool, accept_new_jump: bool) -> None:
    """Strict host-key checking on the connection and on every ProxyJump hop; recording an unknown key
    is consented to separately for the host and for its jump hosts."""
    hop: Any = conn
    while isinstance(hop, Connection):
        client = hop.client
        client._system_host_keys = known_host_keys(known_hosts)  # only the file fleet was given
        jump = hop is not conn
        record = accept_new_jump if jump else accept_new
        policy: paramiko.MissingHostKeyPolicy = RecordNewKey(known_hosts) if record else Refuse(jump)
        client.set_missing_host_key_policy(policy)
        hop = hop.gateway
