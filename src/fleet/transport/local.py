"""`connection: local`: the same interface as SSH, for running fleet on the GPU box itself."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time

from fleet.errors import TransportError
from fleet.transport.base import CommandResult, OnChunk, Stdin, feed


class LocalTransport:
    def __init__(self, host_name: str) -> None:
        self.host_name = host_name
        self.commands_run = 0
        self.chunked_input_connects = False
        # streams still running: close() ends them, as closing a connection ends its commands
        self._streaming: set[subprocess.Popen[bytes]] = set()

    def run(self, script: str, *, stdin: bytes = b"", timeout_s: float = 60.0) -> CommandResult:
        self.commands_run += 1
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", script],
                input=stdin,
                capture_output=True,
                timeout=timeout_s,
                check=False,
                start_new_session=True,  # as sshd runs each command: fleet's "own process group" is the command's
            )
        except subprocess.TimeoutExpired as exc:
            raise TransportError(
                f"{self.host_name}: command timed out after {timeout_s:.0f} s.", "Retry, or raise the timeout."
            ) from exc
        return CommandResult(proc.returncode, proc.stdout, proc.stderr)

    def stream(self, script: str, on_chunk: OnChunk, *, stdin: Stdin = b"", timeout_s: float = 3600.0) -> int:
        self.commands_run += 1
        proc = subprocess.Popen(
            ["/bin/sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        self._streaming.add(proc)
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
                    raise TransportError(f"{self.host_name}: stream timed out after {timeout_s:.0f} s.", "")
                ready, _, _ = select.select([fd], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return proc.wait()
                if not on_chunk(chunk):
                    return -1
        finally:
            with contextlib.suppress(BrokenPipeError, ValueError):  # unread input left in its buffer
                proc.stdin.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            self._streaming.discard(proc)

    def close(self) -> None:
        for proc in list(self._streaming):
            with contextlib.suppress(OSError):
                proc.kill()
