"""A host step started before its request exists (`StepAhead`): its Python starts and loads the step's code
while fleet is still reading the host's facts and planning, and it waits for the request on stdin.

A deploy's act step spends ~90 ms on a host before it does anything (sshd's session, the shell, Python,
the step's modules) and its `run -d` waits on that, where an operator's `ssh HOST podman run -d` does not.
Started beside the probe, that time passes while the host answers the probe. The step reads nothing from
its arguments but that it was started ahead; a step that is never given a request sees its stdin end and
changes nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fleet.errors import FleetError, TransportError
from fleet.hostscripts import answer_of, script_for
from fleet.transport.base import Collected, timed_out

if TYPE_CHECKING:
    from fleet.transport import Transport

# How long a step started ahead waits for its request at most: a deploy plans in milliseconds; a model
# pulled first can take hours, and the step is then given up and the act runs as usual.
WAIT_FOR_REQUEST_S = 600.0


class StepAhead:
    """`step` under `python` on `transport`'s host, started now; `answer` gives it its request, once."""

    def __init__(self, transport: Transport, step: str, python: str) -> None:
        self.t, self.step, self.python = transport, step, python
        self._lock = threading.Lock()
        self._request: bytes | None = None
        self._closed = False  # no request can be given any more: the step's stdin ended or it ended
        self._given = threading.Event()  # the request was given, or the step given up
        self._answered = threading.Event()  # fleet has the answer: the step's stdin may end
        self._output = Collected(transport.host_name)  # bounded: a host cannot grow fleet's memory
        self._code: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"ahead-{step}-{transport.host_name}", daemon=True)
        self._thread.start()

    def _input(self) -> Iterator[bytes]:
        """The step's stdin: the request and its own input when given, then held open until fleet has the
        answer (its end tells the step that fleet is gone); nothing, and the end, when given up."""
        self._given.wait(WAIT_FOR_REQUEST_S)
        with self._lock:
            self._closed, request = True, self._request
        if request is None:
            return
        yield request
        self._answered.wait()

    def _run(self) -> None:
        try:
            # the host waits no longer than fleet does (a client gone without closing TCP is not seen)
            script = script_for(self.step, {"ahead": True, "wait_s": WAIT_FOR_REQUEST_S + 60}, [self.python])
            out = self._output.out
            self._code = self.t.stream(script, out, stdin=self._input(), timeout_s=WAIT_FOR_REQUEST_S + 3600)
        except BaseException as exc:  # handed to `answer`, which raises it as its own run would have
            self._error = exc
        finally:
            with self._lock:
                self._closed = True
            self._answered.set()

    def answer(self, request: Mapping[str, object], stdin: bytes, timeout_s: float) -> dict[str, Any] | None:
        """The step's answer to `request` (the first line of its stdin, then `stdin`); None when the step
        ended before it was given one (the caller runs the step as usual)."""
        given = json.dumps(request).encode() + b"\n" + stdin
        try:
            with self._lock:
                if self._closed or self._request is not None:
                    return None
                self._request = given
            self._given.set()
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                self.t.close()  # ends the command, as its own timeout would; the next step reconnects
                raise timed_out(self.t.host_name, timeout_s)
        finally:
            self._answered.set()
        if self._error is not None:
            if isinstance(self._error, FleetError):
                raise self._error
            raise TransportError(f"{self.t.host_name}: fleet's {self.step} step failed ({self._error}).", "")
        return answer_of(self.t.host_name, self.step, self._output.result(self._code or 0))

    def give_up(self) -> None:
        """Never given a request: its stdin ends and the step ends without changing anything."""
        with self._lock:
            self._closed = True  # an answer() after this runs the step as usual, not this one
        self._given.set()
        self._answered.set()
