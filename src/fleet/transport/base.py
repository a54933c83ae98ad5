"""The one seam between fleet and a host: run a shell script there, get bytes and an exit code back.

Everything above this layer takes a `Transport` and never builds one (`fleet.transport.connect`
does). A script is sent as one `sh -c` command: one exec channel, one network round trip once the
connection is up. Data that must not appear in `ps` (secrets) travels on the channel's stdin.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from fleet.errors import TransportError


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def error_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


OnChunk = Callable[[bytes], bool]
"""Called with each piece of stdout as it arrives; return False to stop the command early."""

Stdin = bytes | Iterable[bytes]
"""A streamed command's input: bytes, sent at once, after which stdin stays open while fleet listens (its
end tells the command that fleet is gone); or chunks, sent as they come (a push's gigabytes never sit in
memory whole), after which stdin is closed: the end of the data."""


def feed(stdin: Stdin, write: Callable[[bytes], object], close: Callable[[], object]) -> None:
    """Send `stdin` to a command through `write`: bytes at once (a broken pipe is the caller's), chunks
    from a thread of their own while the caller reads the command's output."""
    if isinstance(stdin, bytes):
        if stdin:
            write(stdin)
        return

    def pump() -> None:
        try:
            for chunk in stdin:
                write(chunk)
            close()
        except Exception:  # noqa: BLE001 - the command ended or the connection went: its own answer says which
            return

    threading.Thread(target=pump, name="fleet-stdin", daemon=True).start()


# A step's answer is one JSON document of kilobytes (a probe's facts, an act's outcome); a command that
# sends more than this is broken or not fleet's, and is stopped rather than held in memory (the pool's
# frames, base64 and all, stay under fleet.frames.MAX_FRAME). Of stderr only the end is kept: messages
# quote its last lines.
ANSWER_BYTES = 8 << 20
ERROR_TAIL_BYTES = 64 << 10


class Collected:
    """A command's output as it arrives, held to ANSWER_BYTES of stdout (more is a TransportError, raised
    from `out`: the transport stops the command as it unwinds) and the last ERROR_TAIL_BYTES of stderr."""

    def __init__(self, host_name: str) -> None:
        self.host_name = host_name
        self._out = bytearray()
        self._err = bytearray()

    def out(self, chunk: bytes) -> bool:
        """Keep `chunk` of stdout; True (an `OnChunk`: the stream goes on)."""
        if len(self._out) + len(chunk) > ANSWER_BYTES:
            raise TransportError(
                f"{self.host_name}: a command sent more than {ANSWER_BYTES >> 20} MiB of output for one answer; "
                "it was stopped.",
                "fleet's steps answer in kilobytes: check what runs as fleet's Python on the host (--debug).",
            )
        self._out += chunk
        return True

    def err(self, chunk: bytes) -> None:
        self._err += chunk
        del self._err[:-ERROR_TAIL_BYTES]

    def result(self, exit_code: int) -> CommandResult:
        return CommandResult(exit_code, bytes(self._out), bytes(self._err))


def timed_out(host_name: str, timeout_s: float, what: str = "command") -> TransportError:
    """A command (or a stream) that outlived its timeout: every transport says it the same way."""
    return TransportError(
        f"{host_name}: {what} timed out after {timeout_s:.0f} s.",
        "The host may be overloaded; retry or raise the timeout.",
    )


class Transport(Protocol):
    host_name: str
    commands_run: int  # exec channels opened so far: the round-trip count the benchmark reports
    # whether a stream fed in chunks opens a connection of its own (the pool's): then a step started
    # ahead of its request (fleet.step_ahead) would cost a connection rather than save a round trip
    chunked_input_connects: bool

    def run(self, script: str, *, stdin: bytes = b"", timeout_s: float = 60.0) -> CommandResult:
        """Run `script` with /bin/sh on the host and wait for it."""
        ...

    def stream(self, script: str, on_chunk: OnChunk, *, stdin: Stdin = b"", timeout_s: float = 3600.0) -> int:
        """Run `script`, handing stdout to `on_chunk` as it arrives; returns the exit code (-1 if stopped)."""
        ...

    def close(self) -> None: ...


def sh_command(script: str) -> str:
    """The command line for a script: the login shell may be anything, so hand it to /bin/sh explicitly."""
    import shlex

    return f"exec /bin/sh -c {shlex.quote(script)}"
