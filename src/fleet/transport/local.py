"""`connection: local`: the same interface as SSH, for running fleet on the GPU box itself."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time

from fleet.transport.base import Collected, CommandResult, OnChunk, Stdin, feed, timed_out


class LocalTransport:
    def __init__(self, host_name: str) -> None:
        self.host_name = host_name
        self.commands_run = 0
        self.chunked_input_connects = False
        # commands still running: close() ends them, as closing a connection ends its commands
        self._streaming: set[subprocess.Popen[bytes]] = set()

    def run(self, script: str, *, stdin: bytes = b"", timeout_s: float = 60.0) -> CommandResult:
        self.commands_run += 1
        output = Collected(self.host_name)
        proc = self._start(script, stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        pipe = proc.stdin

        def send() -> None:  # from a thread: input larger than a pipe's buffer must not wait on our reading
            with contextlib.suppress(BrokenPipeError, ValueError):
                pipe.write(stdin)
                pipe.close()

        threading.Thread(target=send, name="fleet-stdin", daemon=True).start()
        keep = {proc.stdout.fileno(): output.out, proc.stderr.fileno(): output.err}
        deadline = time.monotonic() + timeout_s
        try:
            while keep:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out(self.host_name, timeout_s)
                for fd in select.select(list(keep), [], [], min(left, 1.0))[0]:
                    chunk = os.read(fd, 65536)
                    if chunk:
                        keep[fd](chunk)
                    else:
                        del keep[fd]
            return output.result(proc.wait())
        finally:
            self._end(proc)

    def _start(self, script: str, *, stderr: int) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,  # as sshd runs each command: fleet's "own process group" is the command's
        )
        self._streaming.add(proc)
        return proc

    def _end(self, proc: subprocess.Popen[bytes]) -> None:
        """The command stopped if it still runs, then its pipes closed: in that order, or closing its stdin
        waits for a writer blocked on a command that never reads it."""
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(BrokenPipeError, ValueError):  # unread input left in its buffer
                    pipe.close()
        self._streaming.discard(proc)

    def stream(self, script: str, on_chunk: OnChunk, *, stdin: Stdin = b"", timeout_s: float = 3600.0) -> int:
        self.commands_run += 1
        proc = self._start(script, stderr=subprocess.DEVNULL)
        assert proc.stdin is not None and proc.stdout is not None
        pipe = proc.stdin
        # bytes: left open while fleet listens: its end tells the command fleet is gone (as over SSH). A
        # broken pipe: it ended without reading its input; its output and exit code still count.
        with contextlib.suppress(BrokenPipeError):
            feed(stdin, lambda chunk: (pipe.write(chunk), pipe.flush()), pipe.close)
        deadline = time.monotonic() + timeout_s
        fd = proc.stdout.fileno()
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out(self.host_name, timeout_s, "stream")
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return proc.wait()
                if not on_chunk(chunk):
                    return -1
        finally:
            self._end(proc)

    def close(self) -> None:
        for proc in list(self._streaming):
            with contextlib.suppress(OSError):
                proc.kill()
