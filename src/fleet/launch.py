"""The `fleet` command's entry point: run in a warm process when `fleet pool` is running.

Most of a short fleet run is Python importing fleet (click, PyYAML, msgspec, the crash knowledge base,
paramiko...): ~0.3 s of CPU before the first byte goes to a host. While the pool runs, it keeps one
process that has imported all of that; each `fleet` command asks it for a fork, hands over its stdin,
stdout and stderr (SCM_RIGHTS) with its arguments, environment and working directory, and waits for the
exit code. The forked process runs the command exactly as `fleet.cli.main` would here, reaching hosts
through the pool. Signals (Ctrl-C) are passed on to it. Without a pool, or when it refuses (fleet's code
changed since it started), the command runs here as usual.

This module and `fleet.frames` use the standard library only: they are all a warm run imports.
"""

from __future__ import annotations

import _socket  # socket.py's base: socket.py (enums, selectors) is ~8 ms of a warm run's ~40 ms start
import gc
import os
import struct
import sys

from fleet import __version__
from fleet.frames import owner_only, peer_uid, read_frame, send_frame, unlink_if_ours
from fleet.paths import warm_socket_path

TYPE_CHECKING = False  # not typing's: see fleet.frames
if TYPE_CHECKING:
    import socket
    from pathlib import Path
    from typing import Any

# What a fleet command needs, imported once in the process the warm runs are forked from.
WARM_MODULES = (
    "fleet.cli",
    "fleet.inventory",
    "fleet.control.sweep",
    "fleet.control.ops",
    "fleet.control.deploy",
    "fleet.control.gather",
    "fleet.health",
    "fleet.crashes",
    "fleet.transport",
    "fleet.transport.pool",
    "fleet.log",
    "structlog",
    "importlib.resources.readers",  # how fleet reads its own remote scripts
)


# A command's objects are mostly what importing its modules built (classes, dataclasses, expressions), and
# they live until it exits. At the default thresholds the collector walked them over and over while they
# were made, and once more at exit: ~60 ms of a deploy. A command still collects its young garbage; the
# long-lived `fleet pool` keeps the defaults.
COMMAND_GC_THRESHOLDS = (100_000, 50, 100)


# `fleet`'s own options that take a value (kept equal to fleet.cli's by a test).
GLOBAL_OPTIONS_WITH_VALUE = ("-i", "--inventory", "--playbooks", "--services", "--crashes")


def command_word(argv: list[str]) -> str | None:
    """The subcommand: the first argument that is neither a global option nor an option's value."""
    args = iter(argv)
    for arg in args:
        if arg in GLOBAL_OPTIONS_WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def main() -> None:
    argv = sys.argv[1:]
    pool = command_word(argv) == "pool"
    if not pool:
        gc.set_threshold(*COMMAND_GC_THRESHOLDS)
    try:
        code = None if pool else run_warm(argv)  # the pool's own commands always run here
    except KeyboardInterrupt:  # before the warm run's pid was known: it ends with this process (SIGTERM)
        print("aborted", file=sys.stderr)
        sys.exit(130)
    if code is None:
        from fleet.cli import main as run_here

        code = run_here()
    gc.freeze()  # the interpreter's last collection would walk every object once more, for nothing
    sys.exit(code)


def run_warm(argv: list[str]) -> int | None:
    """The command's exit code, run in a process forked by the pool; None if there is none to ask."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(warm_socket_path())
        for fd in (0, 1, 2):
            os.fstat(fd)  # a closed descriptor (some cron setups) cannot be handed over
        # socket.send_fds, written out: stdin, stdout and stderr as one SCM_RIGHTS message
        sock.sendmsg([b"\0"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
        send_frame(sock, {"version": __version__, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()})
        first = read_frame(sock)
    except (OSError, EOFError, ValueError):
        sock.close()
        return None
    if "pid" not in first:  # refused: fleet's code changed since the pool started
        sock.close()
        return None
    import signal

    pid = int(first["pid"])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(pid, signum))
    try:
        return int(read_frame(sock)["exit"])
    except (OSError, EOFError, ValueError, KeyError):
        print(f"error: fleet's process {pid} (forked by `fleet pool`) ended without an exit code.", file=sys.stderr)
        return 1
    finally:
        sock.close()


def code_stamp() -> int:
    """A digest of fleet's own files (names, sizes, modification times): a warm process forked from
    older code must not run a command."""
    from pathlib import Path

    package = Path(__file__).parent
    files = sorted(p for p in package.rglob("*") if p.suffix in (".py", ".yaml"))
    return hash(tuple((str(p), st.st_mtime_ns, st.st_size) for p in files for st in [p.stat()]))


def serve_warm(socket_path: Path, pool_pid: int) -> None:
    """The process warm runs are forked from (forked by the pool before it starts any thread, so forking
    it again is safe). Ends with the pool."""
    import importlib
    import select
    import signal
    import socket

    for name in WARM_MODULES:
        importlib.import_module(name)
    stamp = code_stamp()
    socket_path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    owner_only(lambda: listener.bind(str(socket_path)))
    listener.listen(256)
    inode = socket_path.stat().st_ino
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the forked runs
    try:
        while os.getppid() == pool_pid:
            if not select.select([listener], [], [], 1.0)[0]:
                continue
            conn, _ = listener.accept()
            if peer_uid(conn) != os.getuid():
                conn.close()
                continue
            if os.fork() == 0:
                listener.close()
                _run_forked(conn, stamp)  # never returns
            conn.close()
    finally:
        unlink_if_ours(socket_path, inode)


def _run_forked(conn: socket.socket, stamp: int) -> None:
    import signal
    import socket

    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # fleet waits for its own subprocesses
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        request = read_frame(conn)
        if len(fds) != 3 or request.get("version") != __version__ or code_stamp() != stamp:
            send_frame(conn, {"refused": "fleet changed since the pool started"})
            os._exit(0)
        send_frame(conn, {"pid": os.getpid()})
        _end_with_the_launcher(conn)
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _reopen_standard_streams()
        sys.argv = ["fleet", *request["argv"]]
        from fleet.cli import main

        code = main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # reported to the person who ran the command, like an in-process crash
        print(f"error: {exc!r}", file=sys.stderr)
    finally:
        _flush()
        try:
            send_frame(conn, {"exit": code})
        finally:
            os._exit(code)


def _end_with_the_launcher(conn: socket.socket) -> None:
    """End this run when its `fleet` process dies without passing a signal on (SIGKILL, say a cron
    timeout's): in-process, the command would have died with it. The launcher sends nothing after its
    request, so end-of-file on the socket means it is gone."""
    import signal
    import threading

    def watch() -> None:
        try:
            while conn.recv(4096):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)  # as a SIGTERM passed on by a living launcher would

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def _reopen_standard_streams() -> None:
    """The zygote's sys.stdout was set up for its own (null) descriptors; buffering follows the new ones."""
    streams: dict[str, Any] = {}
    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        line_buffered = os.isatty(fd) or name == "stderr"
        streams[name] = open(fd, mode, buffering=1 if line_buffered else -1, closefd=False, encoding="utf-8")  # noqa: SIM115
    sys.stdin, sys.stdout, sys.stderr = streams["stdin"], streams["stdout"], streams["stderr"]


def _flush() -> None:
    import contextlib

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the run's own descriptors may be gone
            stream.flush()
