"""The connection pool process: `fleet pool serve` in the foreground, `fleet pool start` in the background.

One thread per request (a fleet run opens one unix connection per command); one SSH connection per host
and set of SSH options, shared by the requests for that host (paramiko multiplexes channels on it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from fleet import __version__
from fleet.errors import ConfigError, ConnectionLost, FleetError, TransportError
from fleet.frames import owner_only, peer_uid, read_frame, send_frame, unlink_if_ours
from fleet.inventory import Host, settings_from
from fleet.transport.pool import PoolRequest, check_socket_path, decode, encode, error_frame
from fleet.transport.ssh import SshTransport

KEEPALIVE_S = 30
# What identifies a connection: the same host reached the same way with the same host-key rules.
CONNECTION_FIELDS = ("address", "port", "user", "identity_file", "proxy_jump", "connect_timeout_s")


def say(text: str) -> None:
    """One line in the pool's log: what it connected and closed, never a command or its input."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}", file=sys.stderr, flush=True)


@dataclass
class _Held:
    transport: SshTransport
    where: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    opened_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    in_use: int = 0
    commands: int = 0


class ConnectionPool:
    def __init__(self, idle_timeout_s: float) -> None:
        self.idle_timeout_s = idle_timeout_s
        self.started_at = time.time()
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._active = 0
        self._last_activity = time.monotonic()

    def _take(self, request: PoolRequest) -> _Held:
        host_fields, options = request["host"], request["options"]
        settings = settings_from(host_fields["settings"], "a fleet run")
        key = json.dumps(
            [host_fields["name"], {f: getattr(settings, f) for f in CONNECTION_FIELDS}, options], sort_keys=True
        )
        with self._lock:
            held = self._held.get(key)
            if held is None:
                host = Host(host_fields["name"], settings, (), "the connection pool")
                transport = SshTransport(
                    host,
                    known_hosts=Path(options["known_hosts"]),
                    ssh_config=Path(options["ssh_config"]) if options.get("ssh_config") else None,
                    accept_new_host_key=bool(options.get("accept_new_host_key")),
                    accept_new_jump_host_key=bool(options.get("accept_new_jump_host_key")),
                )
                where = f"{settings.user + '@' if settings.user else ''}{settings.address}:{settings.port or 22}"
                held = self._held[key] = _Held(transport, where)
            held.in_use += 1
            held.last_used = time.monotonic()
        return held

    def _give_back(self, held: _Held) -> None:
        with self._lock:
            held.in_use -= 1
            held.last_used = time.monotonic()
            if not held.in_use and not held.commands and not held.transport.is_open:
                # its handshake failed (host key, authentication, no answer): nothing to keep or list
                self._held = {key: h for key, h in self._held.items() if h is not held}

    def use(self, request: PoolRequest, action: Any) -> Any:
        """Run `action(transport)` on the host's kept connection, opening it if needed. A kept connection
        found dead before the command started is replaced once: nothing ran on it, so a retry is safe."""
        with self._lock:
            self._active += 1
            self._last_activity = time.monotonic()
        try:
            for attempt in (1, 2):
                held = self._take(request)
                try:
                    with held.lock:  # one handshake per connection, however many requests arrive at once
                        reused = held.transport.is_open
                        if not reused:
                            held.transport.connect()
                            held.transport.keep_alive(KEEPALIVE_S)
                            held.opened_at = time.time()
                            say(f"connected {held.transport.host_name} ({held.where})")
                    held.commands += 1
                    return action(held.transport)
                except ConnectionLost:
                    if not reused or attempt == 2:
                        raise
                    say(f"{held.transport.host_name}: kept connection was gone; reconnecting")
                    held.transport.close()
                finally:
                    self._give_back(held)
        finally:
            with self._lock:
                self._active -= 1
                self._last_activity = time.monotonic()

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            connections = [
                {
                    "host": h.transport.host_name,
                    "where": h.where,
                    "open": h.transport.is_open,
                    "opened_at": round(h.opened_at, 3),
                    "idle_s": round(now - h.last_used, 1),
                    "commands": h.commands,
                    "in_use": h.in_use,
                }
                for h in self._held.values()
            ]
        return {
            "pid": os.getpid(),
            "version": __version__,
            "started_at": round(self.started_at, 3),
            "idle_timeout_s": self.idle_timeout_s,
            "connections": connections,
        }

    def close_idle(self) -> bool:
        """Close connections idle past the timeout; True when the pool itself has been idle that long."""
        now = time.monotonic()
        with self._lock:
            stale = [k for k, h in self._held.items() if not h.in_use and now - h.last_used > self.idle_timeout_s]
            closing = [self._held.pop(k) for k in stale]
            idle = not self._held and not self._active and now - self._last_activity > self.idle_timeout_s
        for held in closing:
            held.transport.close()
            say(f"closed {held.transport.host_name} after {self.idle_timeout_s:.0f} s idle")
        return idle

    def close_all(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for h in held:
            h.transport.close()


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_queue_size = 1024  # a sweep connects once per host at the same moment (the default is 5)
    pool: ConnectionPool


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        if peer_uid(sock) != os.getuid():  # the socket's mode already says so; never rely on one check
            return
        try:
            request = read_frame(sock)
        except (EOFError, OSError, ValueError):
            return
        try:
            self._answer(sock, cast(PoolRequest, request))  # checked there: the version first
        except (BrokenPipeError, ConnectionResetError):
            pass  # the fleet run went away (Ctrl-C); its command was stopped with it
        except FleetError as exc:
            with contextlib.suppress(OSError):
                send_frame(sock, error_frame(exc))
        except Exception as exc:  # a bug here must not take the pool (and every held connection) down
            say(f"internal error: {exc!r}")
            with contextlib.suppress(OSError):
                send_frame(sock, error_frame(TransportError(f"the connection pool failed ({exc!r}).", "")))

    def _answer(self, sock: socket.socket, request: PoolRequest) -> None:
        pool = self.server.pool
        if request.get("version") != __version__:
            raise ConfigError(
                f"the connection pool runs fleet {__version__}, this run is fleet {request.get('version')}.",
                "Restart it: fleet pool stop && fleet pool start",
            )
        op = request.get("op")
        if op == "status":
            send_frame(sock, pool.status())
        elif op == "stop":
            send_frame(sock, {"stopping": True})
            threading.Thread(target=self.server.shutdown, daemon=True).start()
        elif op == "run":
            result = pool.use(
                request,
                lambda t: t.run(request["script"], stdin=decode(request["stdin"]), timeout_s=request["timeout_s"]),
            )
            send_frame(
                sock, {"exit": result.exit_code, "stdout": encode(result.stdout), "stderr": encode(result.stderr)}
            )
        elif op == "stream":
            code = pool.use(request, lambda t: self._stream(sock, t, request))
            send_frame(sock, {"exit": code})
        else:
            raise ConfigError(f"the connection pool does not know the request {op!r}.", "")

    @staticmethod
    def _stream(sock: socket.socket, transport: SshTransport, request: PoolRequest) -> int:
        gone = threading.Event()

        def watch_client() -> None:  # the run closes its socket to stop the command (or it was killed)
            with contextlib.suppress(OSError):
                sock.recv(1)
            gone.set()

        def forward(chunk: bytes) -> bool:
            try:
                send_frame(sock, {"stdout": encode(chunk)})
            except OSError:
                gone.set()
                return False
            return True

        threading.Thread(target=watch_client, daemon=True).start()
        return transport.stream(
            request["script"],
            forward,
            stdin=decode(request["stdin"]),
            timeout_s=request["timeout_s"],
            cancelled=gone,
        )


def _claim(socket_path: Path) -> None:
    """Remove a socket file left by a pool that died; refuse if a pool is listening there."""
    if not socket_path.exists():
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(socket_path))
    except (ConnectionRefusedError, FileNotFoundError):
        socket_path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise ConfigError(f"a connection pool is already running at {socket_path}.", "See it with `fleet pool status`.")


def _start_warm_process() -> tuple[int, Path]:
    """Fork the process warm `fleet` runs are forked from (`fleet.launch`): now, before any thread starts."""
    from fleet.launch import serve_warm
    from fleet.paths import warm_socket

    path, pool_pid = warm_socket(), os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            serve_warm(path, pool_pid)
        except BaseException as exc:
            say(f"warm process failed: {exc!r}; commands run in their own process")
            code = 1
        finally:
            os._exit(code)
    return pid, path


def _stop_warm_process(pid: int, path: Path) -> None:
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    path.unlink(missing_ok=True)


def serve(socket_path: Path, idle_timeout_s: float, ready: threading.Event | None = None) -> None:
    """Serve until stopped (SIGTERM, `fleet pool stop`) or idle for `idle_timeout_s`."""
    check_socket_path(socket_path)
    socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _claim(socket_path)
    warm = _start_warm_process()
    server = owner_only(lambda: _Server(str(socket_path), _Handler))
    server.pool = ConnectionPool(idle_timeout_s)
    inode = socket_path.stat().st_ino
    stopping = threading.Event()

    def reap() -> None:
        while not stopping.wait(min(1.0, idle_timeout_s / 4)):
            if server.pool.close_idle():
                say(f"idle for {idle_timeout_s:.0f} s; exiting")
                server.shutdown()
                return

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    threading.Thread(target=reap, daemon=True).start()
    say(
        f"fleet {__version__} connection pool (pid {os.getpid()}) at {socket_path}; idle timeout {idle_timeout_s:.0f} s"
    )
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.1)  # `fleet pool stop` waits for this loop to notice
    finally:
        stopping.set()
        _stop_warm_process(*warm)
        server.server_close()
        server.pool.close_all()  # before the socket goes: `fleet pool stop` returning means all are closed
        unlink_if_ours(socket_path, inode)  # a new pool may own the path by now
        say("stopped")
