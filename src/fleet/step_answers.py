"""The host steps fleet runs for one JSON answer, each named with its request and answer types: what
`fleet.hostscripts.run_step` takes and gives, so a caller reads a step's answer by the keys it declares
(fleet.protocol declares the requests and the act step's result; this module the other answers).

The host side writes these answers as plain JSON (the host files carry no types at run time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypedDict, TypeVar

from fleet.protocol import ActRequest, ActResult, FixesRequest, RouterRequest
from fleet.transfer_protocol import ListedFile

Request = TypeVar("Request")
Answer = TypeVar("Answer")


@dataclass(frozen=True)
class Step(Generic[Request, Answer]):
    """A host step by its name (fleet.hostscripts.STEPS); the type parameters are for the type checker."""

    name: str


class FixesAnswer(TypedDict):
    """The fixes step: the learned fixes it forgot."""

    forgotten: list[dict[str, object]]


class SendListRequest(TypedDict):
    """The send step asked only for a model directory's listing (`fleet push`)."""

    op: str  # "list"
    path: str


class SendListing(TypedDict, total=False):
    """A model directory on the sending side: `missing`, or its files, why it is not whole, and fleet's
    own marker of a whole copy."""

    missing: bool
    files: dict[str, ListedFile]
    problems: list[str]
    marker: Any


class RouterResult(TypedDict, total=False):
    """One action's answer from the router step (`do` names the action): an `error` (with what explains
    it), or the action's own keys."""

    do: str
    error: str
    foreign: str  # the other service file a router of the same name was started from
    holders: list[Any]
    hidden_holder: bool
    log_tail: str
    router: str  # ensure: "running" or "started"
    pid: int
    log: str
    differs: bool
    replaced: Any
    workers: list[dict[str, Any]]
    added: str
    id: Any
    refused: str  # remove: why the router may not lose this worker now (keep_one_healthy)
    removed: str
    was_listed: bool
    answer: dict[str, Any]  # ask: the smoke request's answer through the router
    router_running: bool
    health: int
    text: str
    up: Any
    ended_pid: int | None
    remembered: list[str]
    record: dict[str, Any]
    held: bool
    released: bool
    taken_over: dict[str, Any] | None
    owner: str
    command: str
    since: float


class RouterAnswer(TypedDict):
    """The router step: each action's result in order, stopping at the first that failed."""

    results: list[RouterResult]


ACT: Step[ActRequest, ActResult] = Step("act")
FIXES: Step[FixesRequest, FixesAnswer] = Step("fixes")
ROUTER: Step[RouterRequest, RouterAnswer] = Step("router")
SEND_LIST: Step[SendListRequest, SendListing] = Step("send")
