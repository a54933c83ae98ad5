"""Keep SSH connections open between fleet runs: `fleet pool start` runs a local process that holds them.

cron starts `fleet health` every minute, and each run would otherwise pay a TCP connect, a key exchange
and an authentication per host (and each host's sshd its share). While the pool runs, fleet sends every
command for an SSH host to it over a unix socket; the pool runs it on a connection it keeps open, and
closes connections (then exits) after they have been idle for its timeout, like OpenSSH's
ControlMaster with ControlPersist.

The pool is fleet's own `SshTransport` in another process: a run sends the options it would have used
itself (known_hosts, ssh_config, accept-new), so host keys are checked exactly as without the pool.
Only this user can reach the socket (mode 0600, and the pool checks the peer's uid). Secrets still
travel on the command's stdin and are never written anywhere.

This module is the client half and imports nothing heavy: with the pool running, a fleet run does not
load paramiko at all. The pool itself is `fleet.transport.pool_server`.
"""

from __future__ import annotations

import base64
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec

from fleet import __version__, errors
from fleet.errors import ConfigError, FleetError, HostUnreachable, TransportError
from fleet.frames import read_frame, send_frame
from fleet.transport.base import CommandResult, OnChunk, Stdin, Transport

if TYPE_CHECKING:
    from fleet.inventory import Host


def check_socket_path(socket_path: Path) -> None:
    """sun_path holds 108 bytes with its NUL, and the warm process's pool-run.sock lies beside pool.sock."""
    if len(os.fsencode(socket_path)) > 100:
        raise ConfigError(
            f"the pool's socket path is too long for a unix socket: {socket_path}.",
            "Set XDG_CACHE_HOME to a shorter directory.",
        )


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def decode(text: str) -> bytes:
    return base64.b64decode(text)


def error_frame(exc: FleetError) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": exc.message, "hint": exc.hint}


def raise_error_frame(frame: Mapping[str, object]) -> None:
    """Re-raise an error the pool reported as the same FleetError class a direct run would have raised."""
    cls = getattr(errors, str(frame.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, FleetError)):
        cls = TransportError
    raise cls(str(frame.get("message", "the connection pool failed")), str(frame.get("hint", "")))


class PoolRequest(TypedDict, total=False):
    """What a fleet run asks the pool (or its warm process): `op` (run, stream, status, stop); for a
    command, the host (its name and settings) and SSH options of the connection to use or open, the script,
    its stdin (encoded) and timeout. `version`: the pool refuses a run of other code than its own."""

    version: str
    op: str
    host: dict[str, Any]
    options: dict[str, Any]
    script: str
    stdin: str
    timeout_s: float


def ask_pool(socket_path: Path, request: PoolRequest, timeout_s: float | None = 10.0) -> socket.socket | None:
    """Connect to the pool and send `request`; None when no pool is listening there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        for _ in range(200):
            try:
                sock.connect(str(socket_path))
                break
            except BlockingIOError:  # the pool's accept queue is full for a moment (a wide sweep)
                time.sleep(0.01)
        else:
            raise TimeoutError("the pool accepts no connections")
    except (FileNotFoundError, ConnectionRefusedError):  # no pool, or a socket file left by one that died
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        check_socket_path(socket_path)  # the likely cause, said as such
        raise ConfigError(
            f"cannot reach the connection pool at {socket_path} ({exc.strerror or exc}).",
            "Stop it with `fleet pool stop`; if no pool of yours runs there, remove that file.",
        ) from exc
    send_frame(sock, {"version": __version__, **request})
    return sock


class PooledTransport:
    """The `Transport` a run uses while a pool is listening; runs directly over SSH if the pool is gone."""

    def __init__(self, host: Host, ssh_options: dict[str, Any], socket_path: Path, direct: Any) -> None:
        self.host_name = host.name
        self.commands_run = 0
        self.chunked_input_connects = True  # see stream
        self._socket_path = socket_path
        self._connection: PoolRequest = {
            "host": {"name": host.name, "settings": msgspec.to_builtins(host.settings)},
            "options": ssh_options,
        }
        self._make_direct = direct
        self._direct: Transport | None = None

    def _ask(self, request: PoolRequest, timeout_s: float) -> socket.socket | None:
        if self._direct is not None:
            return None
        # The pool enforces the command's timeout itself and always answers; the margin covers a connect.
        sock = ask_pool(self._socket_path, {**self._connection, **request}, timeout_s + 60)
        if sock is None:
            self._direct = self._make_direct()
        else:
            self.commands_run += 1
        return sock

    def _answer(self, sock: socket.socket) -> dict[str, Any]:
        """The pool's next message; its errors raised as the FleetError a direct run would raise."""
        try:
            frame = read_frame(sock)
        except (EOFError, OSError) as exc:
            raise HostUnreachable(
                f"{self.host_name}: the connection pool went away mid-command ({exc}).",
                "Run again (`fleet pool status` shows whether the pool is running).",
            ) from exc
        if "error" in frame:
            raise_error_frame(frame)
        return frame

    def run(self, script: str, *, stdin: bytes = b"", timeout_s: float = 60.0) -> CommandResult:
        sock = self._ask({"op": "run", "script": script, "stdin": encode(stdin), "timeout_s": timeout_s}, timeout_s)
        if sock is None:
            assert self._direct is not None
            return self._direct.run(script, stdin=stdin, timeout_s=timeout_s)
        with sock:
            frame = self._answer(sock)
        return CommandResult(int(frame["exit"]), decode(frame["stdout"]), decode(frame["stderr"]))

    def stream(self, script: str, on_chunk: OnChunk, *, stdin: Stdin = b"", timeout_s: float = 3600.0) -> int:
        if not isinstance(stdin, bytes):  # streamed input (a push) takes a connection of its own: the pool's
            direct = self._make_direct()  # frames carry whole values, and bulk data gains nothing from reuse
            try:
                return int(direct.stream(script, on_chunk, stdin=stdin, timeout_s=timeout_s))
            finally:
                direct.close()
        request: PoolRequest = {"op": "stream", "script": script, "stdin": encode(stdin), "timeout_s": timeout_s}
        sock = self._ask(request, timeout_s)
        if sock is None:
            assert self._direct is not None
            return self._direct.stream(script, on_chunk, stdin=stdin, timeout_s=timeout_s)
        with sock:  # closing it tells the pool to stop the remote command
            while "stdout" in (frame := self._answer(sock)):
                if not on_chunk(decode(frame["stdout"])):
                    return -1
            return int(frame["exit"])

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
