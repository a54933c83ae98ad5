"""Server logs read from a host (`fleet logs`, `fleet diagnose --host`): the logs step's JSON events, taken
as they stream in. A log's text only ever arrives inside a `line` event, so nothing an engine writes can
pass for fleet's own word that the log was switched (a restart) or is missing."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

from fleet.errors import FleetError, HostStepError
from fleet.hostscripts import EventLines, script_for, step_python
from fleet.protocol import LogsEvent, LogsRequest

if TYPE_CHECKING:
    from fleet.inventory import Host
    from fleet.transport import Transport

FOLLOW_TIMEOUT_S = 10**7  # following has no end of its own: Ctrl-C, or the connection, ends it


def read_logs(
    t: Transport,
    host: Host,
    *,
    names: Sequence[str | None],
    lines: int,
    follow: bool,
    on_event: Callable[[LogsEvent], bool],
) -> int:
    """Stream the logs of deployments `names` (None: the host's newest) on `host` to `on_event`, which
    returns False to stop; the last `lines` of each first, then (with `follow`) new lines as written,
    across restarts. Returns the exit code (-1 when stopped)."""
    args: LogsRequest = {"log_dir": host.settings.log_dir, "names": list(names), "lines": lines, "follow": follow}
    reader = EventLines(host.name, "logs")

    def sink(chunk: bytes) -> bool:
        return all(on_event(_logs_event(host, e)) for e in reader.feed(chunk))

    code = t.stream(script_for("logs", args, [step_python(host)]), sink, timeout_s=FOLLOW_TIMEOUT_S if follow else 60)
    if code not in (0, -1) and not reader.said:
        raise HostStepError(f"{host.name}: fleet's logs step failed on the host (exit {code}).", "")
    return code


def _logs_event(host: Host, event: Mapping[str, object]) -> LogsEvent:
    if event["e"] == "error" or "error" in event:  # the step failed, or no Python on the host
        raise HostStepError(f"{host.name}: fleet's logs step failed: {event.get('error')}", "")
    return cast(LogsEvent, event)


def no_log_error(host: Host, name: str | None) -> FleetError:
    whose = f" for deployment {name}" if name else ""
    return FleetError(
        f"{host.name}: no server log{whose} in {host.settings.log_dir} yet.",
        f"fleet writes one when it deploys: fleet deploy PLAYBOOK --host {host.name}",
    )


LOG_TEXT_CHARS = 16 << 20  # what the host reads of a log's end at most (fleet.host.logs.LOG_END_BYTES)


def log_text(t: Transport, host: Host, name: str | None, lines: int) -> str:
    """The last `lines` lines of a deployment's log (the host's newest without a name), as one text."""
    # the host sends the last `lines`, each cut to 16 KiB: a host that sends more has only its end kept
    said: deque[str] = deque()
    held = 0

    def keep(event: LogsEvent) -> bool:
        nonlocal held
        if event["e"] == "missing":
            raise no_log_error(host, name)
        if event["e"] == "line":
            said.append(event["text"])
            held += len(event["text"])
            while len(said) > lines or held > LOG_TEXT_CHARS:
                held -= len(said.popleft())
        return True

    read_logs(t, host, names=[name], lines=lines, follow=False, on_event=keep)
    return "\n".join(said) + "\n" if said else ""
