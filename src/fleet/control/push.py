"""`fleet pull --from SOURCE`: a model pushed to hosts that cannot reach the Hub, from another host that has
it or from a directory on this machine, over fleet's own connections.

The source's step lists the model's files and whether they are whole (host/send.py); each
receiving host says what it lacks, resumed per file from the bytes an earlier, cut push left
(host/receive.py); the source then sends exactly that, and fleet relays the bytes from one
stream to the other, holding at most RELAY_CHUNKS pieces of them. Every file is checked by size and by the
sha256 of the bytes the source read before the model appears at its path, as a pull's are.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet import events
from fleet.control.gather import model_path
from fleet.control.pull import HINTS, PullResult, StepEvents
from fleet.errors import DeployFailed, FleetError, HostStepError, PreflightError
from fleet.hostscripts import StepEvent, json_lines, run_step, script_for
from fleet.step_answers import SEND_LIST, SendListing, SendListRequest
from fleet.terminal import safe_line

if TYPE_CHECKING:
    from fleet.inventory import Host, NamedPlaybook
    from fleet.transport import Transport

RELAY_CHUNKS = 16  # pieces between the source's stream and the host's, each a read of it (up to 1 MiB over SSH)
DAY_S = 24 * 3600.0
PUSH_HINTS = {
    **HINTS,
    "cut": "Run the same command again: files that came whole are kept, and a cut file resumes where it stopped.",
    "source": "Check the source's copy (fleet pull PLAYBOOK --host SOURCE verifies it there), then push again.",
    "listing": "Rename or remove the files named in the source (their names as listed), then push again.",
}


@dataclass(frozen=True)
class Source:
    """Where a push reads the model: a host of the inventory, or a directory on this machine."""

    label: str  # as the operator named it: the host's name, or the directory
    transport: Transport
    python: str
    path: str


def directory_here(path: str) -> Source:
    """A model directory on this machine as a push's source: read by this Python, as a host's would be."""
    import os
    import sys

    from fleet.transport.local import LocalTransport

    return Source(path, LocalTransport("this machine"), sys.executable, os.path.abspath(path))


def list_source(source: Source) -> SendListing:
    """The source's files, refused before anything is sent when there are none or they are not whole."""
    request: SendListRequest = {"op": "list", "path": source.path}
    data = run_step(source.transport, source.python, SEND_LIST, request, timeout_s=600)
    here = source.label == source.path or "/" in source.label  # a directory on this machine
    where = safe_line(source.path) if here else f"{safe_line(source.label)}: {safe_line(source.path)}"
    if data.get("missing"):
        raise PreflightError(
            f"{where} is not there, so there is nothing to push.",
            "Give --from the host (or directory) that has the model.",
        )
    if not data["files"]:
        raise PreflightError(f"{where} holds no files: nothing to push.", "Give --from the model's directory.")
    if data["problems"]:
        raise PreflightError(
            f"{where} is not whole, so it is not pushed:{_listed(data['problems'])}",
            "Repair it there first"
            + ("." if here else f" (fleet pull PLAYBOOK --host {safe_line(source.label)} checks it against the Hub)."),
        )
    return data


def push_model(
    source: Source,
    listing: SendListing,
    t: Transport,
    host: Host,
    playbook: NamedPlaybook,
    *,
    progress: Callable[[events.Event], None],
) -> PullResult:
    """Put the source's copy of the playbook's model at its path on `host`, or prove it is there."""
    pb = playbook.spec
    path = model_path(host, pb.model)
    python = host.settings.engines.get(pb.engine, "python3")
    relay = _Relay(json.dumps({"files": listing["files"], "marker": listing.get("marker")}).encode() + b"\n")
    started = time.monotonic()
    answers = StepEvents(path, progress, source.label)

    def on_event(ev: StepEvent) -> None:
        if ev.get("e") == "need":  # the host's plan: the source starts sending
            relay.start(source, _asked_for(host.name, ev.get("need"), listing["files"]))
        else:
            answers(ev)

    script = script_for("receive", {"path": path, "from": source.label}, [python])
    try:
        code = t.stream(script, json_lines(on_event, t.host_name, "receive"), stdin=relay.chunks(), timeout_s=DAY_S)
    finally:
        relay.stop()
    last = answers.last(code)
    if answers.kept is None and code != 0:  # the receiving step died (killed, or its host went away)
        raise DeployFailed(
            f"{host.name}: the receiving step ended without an answer (exit {code}); nothing is at {safe_line(path)}.",
            PUSH_HINTS["cut"],
        )
    why = safe_line(str(last.get("why") or last.get("error") or ""))[:600]
    seconds = time.monotonic() - started
    if last["e"] in ("present", "pulled"):
        outcome = "pushed" if last["e"] == "pulled" else "present" if last.get("ours", True) else "present-theirs"
        return PullResult(
            host.name,
            path,
            outcome,
            int(last.get("files") or 0),
            int(last.get("bytes") or 0),
            int(last.get("checksums") or 0),
            last.get("commit"),
            seconds,
            source=source.label,
            sent=int(last.get("sent") or 0),
        )
    if last["e"] == "error":
        raise HostStepError(f"{host.name}: fleet's receive step failed on the host ({why}).", "")
    if relay.failure:  # the host saw its stream end early: say why it ended
        why += f" (the source: {relay.failure})"
    listed = _listed(last.get("problems") or [])
    message = f"{host.name}: {safe_line(path)} was not pushed from {safe_line(source.label)}: {why}{listed}"
    hint = PUSH_HINTS.get(str(last.get("kind")), "")
    if last.get("stage") == "download":
        raise DeployFailed(message, hint)
    raise PreflightError(message, hint)


def _listed(problems: list[Any]) -> str:
    """A step's "NAME: what is wrong" lines, one per line under the message, each safe for a terminal."""
    return "".join(f"\n  {safe_line(str(p))[:300]}" for p in problems)


def _asked_for(host: str, need: Any, listed: dict[str, Any]) -> list[list[Any]]:
    """The files a host asks the source for, each one the source listed, as listed: a host never names
    what the source reads (a name outside the model, say)."""
    ok = isinstance(need, list) and all(
        isinstance(n, list)
        and len(n) == 4
        and isinstance(n[0], str)
        and isinstance(listed.get(n[0]), dict)
        and type(n[1]) is int
        and 0 <= n[1] <= listed[n[0]]["size"]
        and [n[2], n[3]] == [listed[n[0]]["size"], listed[n[0]]["mtime_ns"]]
        for n in need
    )
    if not ok:
        raise HostStepError(f"{host}: the host asked for files the source did not list; nothing was sent.", "")
    return list(need)


class _Relay:
    """The source's stream into the receiving host's stdin: `chunks` is what the host reads, starting with
    the offer (the listing); the source starts sending once the host has said what it needs."""

    def __init__(self, offer: bytes) -> None:
        self.offer = offer
        self.pieces: queue.Queue[bytes | None] = queue.Queue(maxsize=RELAY_CHUNKS)
        self.stopped = threading.Event()
        self.failure = ""
        self.thread: threading.Thread | None = None

    def chunks(self) -> Iterator[bytes]:
        yield self.offer
        while not self.stopped.is_set():
            try:
                piece = self.pieces.get(timeout=0.5)
            except queue.Empty:
                continue
            if piece is None:  # the source is done (or gone): the host's stdin ends here
                return
            yield piece

    def _put(self, piece: bytes | None) -> bool:
        while not self.stopped.is_set():
            try:
                self.pieces.put(piece, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def start(self, source: Source, need: list[list[Any]]) -> None:
        if self.thread is not None:  # one plan per push: a second would interleave two sources' bytes
            raise HostStepError("the host asked for files twice; nothing more is sent.", "")

        def send() -> None:
            script = script_for("send", {"op": "send", "path": source.path}, [source.python])
            try:
                request = json.dumps({"need": need}).encode() + b"\n"
                code = source.transport.stream(script, self._put, stdin=request, timeout_s=DAY_S)
                if code not in (0, -1):
                    self.failure = f"its send step ended with exit {code}"
            except FleetError as exc:
                self.failure = exc.message
            finally:
                self._put(None)

        self.thread = threading.Thread(target=send, name="fleet-push-source", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """The host has answered (or its connection went): the source stops at its next piece."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=30)
