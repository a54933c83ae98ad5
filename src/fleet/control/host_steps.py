"""What the deploy and service loops ask of a host, step by step (`HostSteps`): its facts (the probe), the
act step (lock, check, stop, launch, record; or a release), the watch step's events, a service's router
step and the health sweep (which proves a running server before a deploy keeps it). `SshSteps` runs fleet's
host scripts over a transport, each answer typed where it crosses. Tests hand the loop a scripted host
instead (fleet_testbed.fakehost), so every branch of it runs in milliseconds without root or sshd; what
fleet does on hosts is proven over real sshd and in simulated hosts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from fleet.hostscripts import EventLines, StepEvent, run_step, script_for
from fleet.inventory import Host
from fleet.protocol import ActRequest, ActResult, ProbeRequest, RouterRequest, WatchRequest
from fleet.step_ahead import StepAhead
from fleet.step_answers import ACT, ROUTER, RouterAnswer
from fleet.transport import Transport

if TYPE_CHECKING:  # what reads the answers loads while the first request is on its way (read_facts_ahead)
    from fleet.control.sweep import HealthOptions
    from fleet.facts import HostFacts
    from fleet.health import HostHealth


@runtime_checkable
class HostSteps(Protocol):
    host_name: str

    @property
    def commands_run(self) -> int:
        """Commands run on the host so far (a deploy's round trips)."""
        ...

    def facts(self, request: ProbeRequest, pythons: Sequence[str]) -> HostFacts:
        """The host's facts in one round trip, under the first of `pythons` it has (then python3)."""
        ...

    def act(
        self, python: str, request: ActRequest, *, stdin: bytes = b"", timeout_s: float, hold_stdin: bool = False
    ) -> ActResult:
        """`hold_stdin`: fleet keeps the step's stdin open until it has the answer; a step that sees it
        close (fleet gone) changes nothing more."""
        ...

    def watch(
        self,
        python: str,
        request: WatchRequest,
        *,
        stdin: bytes,
        on_event: Callable[[StepEvent], bool],
        timeout_s: float,
    ) -> int:
        """Stream the watch step's events to `on_event` (False: stop reading); the step's exit code."""
        ...

    def router(self, python: str, request: RouterRequest, *, timeout_s: float) -> RouterAnswer:
        """A service's router step: each of `request`'s actions answered in order, up to the first that failed."""
        ...

    def health(self, host: Host, options: HealthOptions) -> HostHealth:
        """The host's health sweep (`fleet health`): its hardware, disks and each recorded server asked
        (alive, /health, /v1/models, the smoke prompt)."""
        ...


HostLink = Transport | HostSteps  # a host's connection, or a scripted host (tests)


def steps_of(transport: HostLink) -> HostSteps:
    """A host's steps: given as they are (a scripted host in tests), or run over its connection."""
    return transport if isinstance(transport, HostSteps) else SshSteps(transport)


def connection_of(link: HostLink, what: str) -> Transport:
    """The connection itself, for what the steps do not cover (`what`: pulling an image or a model); a
    scripted host has none, and says which test went there."""
    if isinstance(link, HostSteps):
        raise TypeError(f"{link.host_name}: a scripted host cannot {what}")
    return link


# Act steps started before their request (start_act_ahead), by the transport they run over (held by the
# entry: an id is never reused under it).
_ACT_AHEAD: dict[int, StepAhead] = {}


def start_act_ahead(link: HostLink, python: str) -> None:
    """Start the act step under `python` now, to be given the first act request on this host (a deploy's):
    its start on the host passes while the host is probed and the deploy planned. Not on a scripted host,
    nor over the connection pool (where its held stdin would take a connection of its own)."""
    if isinstance(link, HostSteps) or link.chunked_input_connects:
        return
    give_up_ahead(link)
    _ACT_AHEAD[id(link)] = StepAhead(link, ACT.name, python)


def give_up_ahead(link: HostLink) -> None:
    """The act started ahead on this host, if it was never asked anything: it ends having done nothing."""
    ahead = _ACT_AHEAD.pop(id(link), None)
    if ahead is not None:
        ahead.give_up()


class SshSteps:
    """The steps as fleet's host scripts, run over `transport`."""

    def __init__(self, transport: Transport) -> None:
        self.t = transport
        self.host_name = transport.host_name

    @property
    def commands_run(self) -> int:
        return self.t.commands_run

    def facts(self, request: ProbeRequest, pythons: Sequence[str]) -> HostFacts:
        text = self.t.run(script_for("probe", request, pythons), timeout_s=60).text
        from fleet.facts import parse_facts

        return parse_facts(self.host_name, text)

    def act(
        self, python: str, request: ActRequest, *, stdin: bytes = b"", timeout_s: float, hold_stdin: bool = False
    ) -> ActResult:
        from fleet.control.answers import act_answer

        ahead = _ACT_AHEAD.pop(id(self.t), None)
        if ahead is not None and ahead.python == python and hold_stdin:
            said = ahead.answer({**request, "client_on_stdin": True}, stdin + b"\n", timeout_s)
            if said is not None:
                return act_answer(cast(ActResult, said))
        elif ahead is not None:  # started under another Python than the plan's: not asked
            ahead.give_up()
        return act_answer(
            run_step(self.t, python, ACT, request, stdin=stdin, timeout_s=timeout_s, hold_stdin=hold_stdin)
        )

    def watch(
        self,
        python: str,
        request: WatchRequest,
        *,
        stdin: bytes,
        on_event: Callable[[StepEvent], bool],
        timeout_s: float,
    ) -> int:
        reader = EventLines(self.host_name, "watch")  # bounded: a host that never ends a line is refused

        def on_chunk(chunk: bytes) -> bool:
            return all(on_event(event) for event in reader.feed(chunk))

        return self.t.stream(script_for("watch", request, [python]), on_chunk, stdin=stdin, timeout_s=timeout_s)

    def router(self, python: str, request: RouterRequest, *, timeout_s: float) -> RouterAnswer:
        return run_step(self.t, python, ROUTER, request, timeout_s=timeout_s)

    def health(self, host: Host, options: HealthOptions) -> HostHealth:
        from fleet.control.sweep import check_host  # the sweep's own module: loaded only when asked

        return check_host(self.t, host, options)
