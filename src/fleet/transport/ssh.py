"""SSH transport: fabric sets the connection up (ssh_config, ProxyJump, agent, keys), paramiko runs commands.

Why not `fabric.Connection.run`: its runner polls and adds ~50 ms per command even on loopback; a bare
paramiko exec channel read with `select` costs ~4 ms. One connection per host is kept for the whole
run, and every operation is a single script, so an operation costs one round trip.

Host keys are checked strictly (fabric's default `AutoAddPolicy` is replaced): an unknown key is
refused unless `accept_new_host_key` is set (then it is recorded, like OpenSSH's `accept-new`), and a
changed key is always refused. A ProxyJump host's unknown key needs its own consent
(`accept_new_jump_host_key`), and every message names the host whose key is at issue.

The TCP connection to sshd is fleet's own (`ssh_socket.tcp_connect`), not paramiko's: see there for the ~90 ms
that saves on every new connection.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import threading
import time
from pathlib import Path
from typing import Any

from fleet.errors import (
    AuthError,
    ConfigError,
    ConnectionLost,
    HostKeyError,
    HostSilent,
    HostUnreachable,
)
from fleet.inventory import Host
from fleet.transport.base import Collected, CommandResult, OnChunk, Stdin, feed, sh_command, timed_out
from fleet.transport.ssh_keys import SHARED_PARSE_LOCK, UnknownKey, harden
from fleet.transport.ssh_socket import READ_BYTES, fast_transport, tcp_connect
from fleet.transport.sshlib import Config, Connection, paramiko


@functools.lru_cache(maxsize=4)
def _fabric_config(ssh_config: str | None) -> Config:
    """One fabric Config per ssh_config file and run, shared read-only by the connections made from it
    (building one merges every invoke config level: ~2 ms of CPU per host in a sweep)."""
    try:
        if ssh_config is not None:
            return Config(runtime_ssh_path=ssh_config)
        config = Config()
        config.load_ssh_config()
        return config
    except (OSError, ValueError, paramiko.SSHException) as exc:  # ConfigParseError is an SSHException
        raise ConfigError(
            f"{ssh_config or '~/.ssh/config'} cannot be read as an ssh_config file ({exc}).",
            "Fix that line; `ssh -G HOST -F FILE` shows how OpenSSH reads the file.",
        ) from exc


class _Connection(Connection):  # type: ignore[misc]  # fabric ships no type hints
    """fabric's Connection, safe to build from one shared Config in many threads.

    invoke stores an attribute set on a Context in its Config unless the class declares it, and fabric 3.2
    does not declare `inline_ssh_env`: every Connection() wrote it into the shared Config, which re-merged
    every config level (~1 ms of CPU) and was empty in the meantime for the threads reading it (a sweep
    lost hosts to "No attribute or config key found for 'user'")."""

    inline_ssh_env = None


# A host that sends nothing for SILENT_S is asked for an SSH keepalive reply (OpenSSH's
# ServerAliveInterval); one that does not answer it within ANSWER_S is given up: a frozen host is
# reported within SILENT_S + ANSWER_S, whatever the command's own timeout.
SILENT_S = 10.0
ANSWER_S = 15.0


class _Liveness:
    """Whether the host still answers, asked only after it has been silent for SILENT_S."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # one keepalive in flight per connection: paramiko keeps one reply slot

    def answers(self, transport: paramiko.Transport, within_s: float) -> bool:
        if not self._lock.acquire(timeout=within_s):
            return False
        try:
            done = threading.Event()

            def ask() -> None:
                with contextlib.suppress(Exception):
                    transport.global_request("keepalive@openssh.com", wait=True)  # any reply counts, even "no"
                if transport.is_active():
                    done.set()

            threading.Thread(target=ask, name="ssh-keepalive", daemon=True).start()  # ends when the connection closes
            return done.wait(within_s)
        finally:
            self._lock.release()


class _Silence:
    """Tracks when the host last sent something on a channel and asks it to answer after SILENT_S."""

    def __init__(self, owner: SshTransport) -> None:
        self.owner = owner
        self.heard = time.monotonic()

    def heard_now(self) -> None:
        self.heard = time.monotonic()

    def check(self) -> None:
        if time.monotonic() - self.heard < SILENT_S:
            return
        transport = self.owner._conn.client.get_transport()
        if transport is None or not self.owner._liveness.answers(transport, ANSWER_S):
            quiet = time.monotonic() - self.heard
            self.owner.close()
            raise HostSilent(
                f"{self.owner.host_name}: no answer from the host for {quiet:.0f} s "
                "(neither output nor an SSH keepalive reply).",
                "The host or its sshd is frozen or overloaded; check it, then run again.",
            )
        self.heard_now()


# How long output may still arrive after the exit status before a process left in the background is
# taken to hold the command's stdout open (its output is then never going to end).
OUTPUT_GRACE_S = 1.0


class _CommandEnd:
    """Whether a command on `chan` has ended and every byte it wrote has been read.

    The exit status alone is not the end: sshd sends it when the command exits, and the command's last
    output, still in the pipe, after it (a bare `printf` lost its output that way about once in 400
    runs). The end of output (EOF) is; or, OUTPUT_GRACE_S after the exit status, a background process
    holding stdout open."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan
        self._exited_at: float | None = None  # when the exit status was first seen here

    def reached(self) -> bool:
        chan = self.chan
        if chan.recv_ready() or chan.recv_stderr_ready():
            return False
        if chan.closed:
            return True
        if not chan.status_event.is_set():
            return False
        if self._exited_at is None:
            self._exited_at = time.monotonic()
        return bool(chan.eof_received) or time.monotonic() - self._exited_at > OUTPUT_GRACE_S

    def wait(self, timeout_s: float) -> None:
        """Until more output, the exit status or the timeout."""
        chan = self.chan
        if chan.eof_received:  # the channel stays readable after EOF: wait for the exit status instead
            chan.status_event.wait(timeout_s)
        elif chan.status_event.is_set():  # output may still come: look again soon, for the grace period
            select.select([chan], [], [], min(timeout_s, 0.05))
        else:
            select.select([chan], [], [], timeout_s)


class SshTransport:
    def __init__(
        self,
        host: Host,
        *,
        known_hosts: Path,
        ssh_config: Path | None,
        accept_new_host_key: bool = False,
        accept_new_jump_host_key: bool = False,
    ) -> None:
        self.host_name = host.name
        self.commands_run = 0
        self.chunked_input_connects = False
        s = host.settings
        with SHARED_PARSE_LOCK:
            config = _fabric_config(str(ssh_config) if ssh_config and ssh_config.exists() else None)
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": s.connect_timeout_s,
            "auth_timeout": s.connect_timeout_s,
            "transport_factory": fast_transport,
        }
        self._identity = os.path.expanduser(s.identity_file) if s.identity_file else None
        if self._identity:
            connect_kwargs["key_filename"] = [self._identity]
        gateway = None
        if s.proxy_jump:
            gateway = _Connection(s.proxy_jump, config=config.clone(), connect_timeout=int(s.connect_timeout_s))
        assert s.address is not None
        self._conn = _Connection(
            s.address,
            user=s.user,
            port=s.port,
            config=config,
            gateway=gateway,
            connect_timeout=max(1, int(s.connect_timeout_s)),
            connect_kwargs=connect_kwargs,
        )
        self._known_hosts = known_hosts
        self._accept_new = accept_new_host_key
        self._accept_new_jump = accept_new_jump_host_key
        self._timeout_s = s.connect_timeout_s
        self._liveness = _Liveness()
        # two threads' first commands (a step started ahead) open one connection, or fail on one attempt
        self._connecting = threading.Lock()
        self._connects = 0  # attempts to connect ended so far (counted at their end: see _transport)
        self._connect_error: BaseException | None = None  # how the last of them failed
        self._where = f"{s.user + '@' if s.user else ''}{s.address}{':' + str(s.port) if s.port else ''}"
        if s.proxy_jump:  # a silent or refusing hop may be the jump host: say the path
            self._where += f" (through ProxyJump {s.proxy_jump})"

    def _key_owner(self, key_name: str) -> str:
        """Whose key a known_hosts name is: the host's own, or a ProxyJump host's (named as such).
        paramiko names a host `[host]:port` or just `host`, depending on where it reports from."""
        host, port = self._conn.host, self._conn.port
        if key_name in (host, f"[{host}]:{port}"):
            return self._where
        return f"the jump host {key_name} (ProxyJump for {self._where})"

    def _known_hosts_name(self, key_name: str) -> str:
        """The name `ssh-keygen -R` needs: known_hosts keeps a non-22 port as `[host]:port`."""
        if key_name.startswith("["):
            return key_name
        hop: Any = self._conn
        while isinstance(hop, Connection):
            if hop.host == key_name:
                return key_name if hop.port == 22 else f"[{key_name}]:{hop.port}"
            hop = hop.gateway
        return key_name

    def _bad_identity(self, reason: str) -> ConfigError:
        return ConfigError(
            f"{self.host_name}: identity_file {self._identity} {reason}.",
            "Fix identity_file: for this host in the inventory, or remove it to use ssh-agent and ~/.ssh keys.",
        )

    def _transport(self) -> paramiko.Transport:
        attempts_before = self._connects
        with self._connecting:
            if self._connects != attempts_before and self._connect_error is not None:
                raise self._connect_error  # tried while this thread waited, and failed: not tried twice
            if self._conn.is_connected:
                return self._connected()
            try:
                transport = self._connected()
            except BaseException as exc:
                self._connect_error = exc
                raise
            finally:
                self._connects += 1  # at the end: a thread that read the count meanwhile waited for this one
            self._connect_error = None
            return transport

    def _connected(self) -> paramiko.Transport:
        if not self._conn.is_connected:
            harden(self._conn, self._known_hosts, self._accept_new, self._accept_new_jump)
            if self._identity and not os.path.isfile(self._identity):  # else "cannot connect (Is a directory)"
                kind = "is a directory" if os.path.isdir(self._identity) else "is not a regular file"
                raise self._bad_identity(kind if os.path.exists(self._identity) else "does not exist")
            try:
                self._open_or_close()
            except ValueError as exc:  # paramiko reading a binary file as a text key (UnicodeDecodeError)
                if not self._identity:
                    raise
                raise self._bad_identity(f"is not a private key ({exc})") from exc
            except paramiko.BadHostKeyException as exc:
                raise HostKeyError(
                    f"{self.host_name}: the host key of {self._key_owner(exc.hostname)} has CHANGED "
                    f"(known_hosts: {self._known_hosts}).",
                    f"If it was reinstalled, remove the old key with "
                    f"`ssh-keygen -R '{self._known_hosts_name(exc.hostname)}'`; otherwise stop: this may be an attack.",
                ) from exc
            except UnknownKey as exc:
                consent = "--accept-new-jump-host-key" if exc.jump else "--accept-new-host-key"
                raise HostKeyError(
                    f"{self.host_name}: the host key of {self._key_owner(exc.hostname)} is unknown "
                    f"(not in {self._known_hosts}).",
                    f"Verify it and run again with {consent}, or add it with ssh-keyscan.",
                ) from exc
            except paramiko.AuthenticationException as exc:
                raise AuthError(
                    f"{self.host_name}: authentication to {self._where} failed ({exc}).",
                    "Check user:, identity_file: or your ssh-agent.",
                ) from exc
            except paramiko.SSHException as exc:
                if "banner" in str(exc) or "No existing session" in str(exc):
                    raise HostSilent(
                        f"{self.host_name}: no SSH answer from {self._where} within {self._timeout_s:.0f} s "
                        "(it accepted the TCP connection, then said nothing).",
                        "The host or its sshd is frozen or overloaded; check it, then run again.",
                    ) from exc
                raise HostUnreachable(f"{self.host_name}: SSH to {self._where} failed ({exc}).", "") from exc
            except TimeoutError as exc:
                raise HostUnreachable(
                    f"{self.host_name}: no SSH answer from {self._where} within {self._timeout_s:.0f} s.",
                    "Check that the host is up and sshd is running.",
                ) from exc
            except OSError as exc:
                raise HostUnreachable(
                    f"{self.host_name}: cannot connect to {self._where} ({exc.strerror or exc}).",
                    "Check the address and port, and that sshd is running.",
                ) from exc
        transport: paramiko.Transport | None = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionLost(f"{self.host_name}: the SSH connection to {self._where} is closed.", "Run again.")
        return transport

    def _open_or_close(self) -> None:
        """A refused handshake (host key, authentication) leaves paramiko's transport and its TCP
        connection open: close them, or a connection pool would keep them."""
        # Only the first hop (the host itself, or its outermost ProxyJump) is a TCP connection from here;
        # the others run inside it. A ProxyCommand hop is the command's pipe, left as it is.
        first: Any = self._conn
        while isinstance(first.gateway, Connection):
            first = first.gateway
        sock = None
        if not first.gateway and not first.is_connected:
            sock = tcp_connect(first.host, int(first.port), self._timeout_s)
            first.connect_kwargs["sock"] = sock
        try:
            self._conn.open()
        except BaseException:
            with contextlib.suppress(Exception):  # fabric's own close() skips a connection it never finished
                self._conn.client.close()
            self.close()
            if sock is not None:
                sock.close()
            raise
        finally:
            first.connect_kwargs.pop("sock", None)  # a reconnection makes a new one

    def connect(self) -> None:
        self._transport()

    def keep_alive(self, interval_s: int) -> None:
        """Send an SSH keepalive every `interval_s` seconds: a connection kept open between runs must notice
        a dead host and keep NAT and firewall state from expiring."""
        self._transport().set_keepalive(interval_s)

    @property
    def is_open(self) -> bool:
        return bool(self._conn.is_connected)

    def _open(self, script: str, stdin: Stdin, *, close_stdin: bool = True) -> paramiko.Channel:
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self._timeout_s)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise ConnectionLost(f"{self.host_name}: the SSH connection dropped ({exc}).", "Run again.") from exc
        try:
            self.commands_run += 1
            chan.exec_command(sh_command(script))
            feed(stdin, chan.sendall, chan.shutdown_write)
            if close_stdin:
                chan.shutdown_write()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostUnreachable(f"{self.host_name}: the SSH connection dropped ({exc}).", "Run again.") from exc
        return chan

    def run(self, script: str, *, stdin: bytes = b"", timeout_s: float = 60.0) -> CommandResult:
        chan = self._open(script, stdin)
        output = Collected(self.host_name)
        deadline = time.monotonic() + timeout_s
        end = _CommandEnd(chan)
        silence = _Silence(self)
        try:
            while True:
                while chan.recv_ready():
                    output.out(chan.recv(65536))
                    silence.heard_now()
                while chan.recv_stderr_ready():
                    output.err(chan.recv_stderr(65536))
                    silence.heard_now()
                if end.reached():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out(self.host_name, timeout_s)
                silence.check()
                end.wait(min(left, 1.0))
            code = chan.recv_exit_status() if chan.exit_status_ready() else -1
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostUnreachable(f"{self.host_name}: the SSH connection dropped ({exc}).", "Run again.") from exc
        finally:
            chan.close()
        if code == -1:
            self.close()
            raise HostUnreachable(f"{self.host_name}: the SSH connection dropped mid-command.", "Run again.")
        return output.result(code)

    def stream(
        self,
        script: str,
        on_chunk: OnChunk,
        *,
        stdin: Stdin = b"",
        timeout_s: float = 3600.0,
        cancelled: threading.Event | None = None,
    ) -> int:
        """`cancelled` (set by another thread) stops a quiet stream too: the connection pool sets it when the
        fleet run it streams for has gone away.

        The command's stdin stays open while fleet listens: its end tells the command that fleet is gone
        (killed, or its connection cut), so the host never keeps working for a run that has ended."""
        chan = self._open(script, stdin, close_stdin=False)
        deadline = time.monotonic() + timeout_s
        end = _CommandEnd(chan)
        silence = _Silence(self)
        try:
            while True:
                if cancelled is not None and cancelled.is_set():
                    return -1
                if chan.recv_ready():
                    silence.heard_now()
                    chunk = chan.recv(READ_BYTES)
                    if chunk and not _handed(on_chunk, chunk):
                        return -1
                    if chunk:
                        continue
                while chan.recv_stderr_ready():
                    chan.recv_stderr(65536)
                if end.reached():
                    code = chan.recv_exit_status() if chan.exit_status_ready() else -1
                    if code == -1:  # closed without an exit status: the connection went away
                        raise HostUnreachable(f"{self.host_name}: the SSH connection dropped while streaming.", "")
                    return code
                if not self._conn.client.get_transport() or not chan.get_transport().is_active():
                    raise HostUnreachable(f"{self.host_name}: the SSH connection dropped while streaming.", "")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out(self.host_name, timeout_s, "stream")
                silence.check()
                end.wait(min(left, 0.2 if cancelled is not None else 0.5))
        except _ReaderFailed as failed:  # fleet's own side of the stream (a closed pipe): not the connection
            raise failed.cause from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostUnreachable(f"{self.host_name}: the SSH connection dropped ({exc}).", "") from exc
        finally:
            # the stream's outcome is decided (an exit, a reader that stopped, a dropped connection): a close
            # whose message cannot be sent (EOFError from a socket going away) must not replace it
            with contextlib.suppress(Exception):
                chan.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection must never raise
            self._conn.close()


class _ReaderFailed(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _handed(on_chunk: OnChunk, chunk: bytes) -> bool:
    """`on_chunk(chunk)`; what it raises (its reader gone: `fleet logs | head`) kept apart from what the
    connection raises, which is the host's trouble."""
    try:
        return bool(on_chunk(chunk))
    except OSError as exc:
        raise _ReaderFailed(exc) from exc
