"""`fleet pull`: a playbook's model onto a host from the Hugging Face Hub, downloaded by the host itself with
its engine's own client, checked whole before it counts (the host side is host/pull.py).

One streamed step: the token goes on stdin (never in argv, never printed: every message is redacted of
it), stdin stays open while fleet listens, and when fleet goes (Ctrl-C) the host stops where it is,
leaving a resumable partial download that no deploy would take as the model.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet import events
from fleet.control.gather import model_path
from fleet.errors import ConfigError, DeployFailed, HostStepError, PreflightError
from fleet.hostscripts import StepEvent, json_lines, script_for
from fleet.secrets import redact
from fleet.terminal import safe_line
from fleet.transfer_protocol import PullRequest

if TYPE_CHECKING:
    from fleet.inventory import Host, NamedPlaybook
    from fleet.transport import Transport


@dataclass(frozen=True)
class HubAccess:
    """How the host reaches the Hub: the operator's HF_TOKEN (sent on stdin) and HF_ENDPOINT (a mirror)."""

    token: str | None = None
    endpoint: str | None = None

    @classmethod
    def from_environment(cls) -> HubAccess:
        import os

        return cls(os.environ.get("HF_TOKEN") or None, os.environ.get("HF_ENDPOINT") or None)

    def check(self) -> None:
        """Refused before anything is sent: a token with a stray newline would be echoed back by the HTTP
        client's error; an endpoint carrying a password would travel in the host command's arguments."""
        if self.token is not None and (not self.token.isprintable() or any(c.isspace() for c in self.token)):
            raise ConfigError(
                "HF_TOKEN holds whitespace or control characters (a newline from the file it was read from?).",
                "Set it to the token alone: export HF_TOKEN=$(tr -d '[:space:]' < tokenfile).",
            )
        if self.endpoint is not None and (
            not re.match(r"^https?://[^\s@/]+(/[^\s@]*)?\Z", self.endpoint) or not self.endpoint.isprintable()
        ):
            raise ConfigError(
                "HF_ENDPOINT must be a plain http(s) URL without a user or password in it.",
                "Give the mirror's URL alone; a token goes in HF_TOKEN (it is sent on stdin, never in argv).",
            )


@dataclass
class PullResult:
    host: str
    path: str
    # "present" (nothing downloaded), "pulled" (from the Hub), "pushed" (from --from), or "present-theirs": a
    # push found a directory fleet did not make whose files have the source's sizes (it is never changed)
    outcome: str
    files: int | None = None
    bytes: int = 0
    checksums: int = 0
    commit: str | None = None
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    source: str | None = None  # a push: the host or directory the files came from (None: the Hub)
    sent: int = 0  # a push: the bytes sent this time (less than `bytes` when resumed or repaired)

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "path": self.path,
            "outcome": self.outcome,
            "files": self.files,
            "bytes": self.bytes,
            "checksums": self.checksums,
            "commit": self.commit,
            "seconds": round(self.seconds, 3),
            **({"source": self.source, "sent": self.sent} if self.source is not None else {}),
        }


def pull_model(
    t: Transport,
    host: Host,
    playbook: NamedPlaybook,
    *,
    hub: HubAccess,
    progress: Callable[[events.Event], None],
) -> PullResult:
    """Get the playbook's `hf_repo` at `revision` to its model path on `host`, or prove it is there."""
    pb = playbook.spec
    if not pb.hf_repo:
        raise ConfigError(
            f"{playbook.path}: the playbook has no hf_repo:, so fleet does not know where its model comes from.",
            "Add hf_repo: owner/name (and revision: if not main) beside model:.",
        )
    path = model_path(host, pb.model)
    python = host.settings.engines.get(pb.engine, "python3")
    hub.check()
    args: PullRequest = {"path": path, "repo": pb.hf_repo, "revision": pb.revision, "endpoint": hub.endpoint}
    secrets = {"HF_TOKEN": hub.token} if hub.token else {}
    started = time.monotonic()
    answers = StepEvents(path, progress)
    stdin = json.dumps({"token": hub.token}).encode() + b"\n"
    code = t.stream(
        script_for("pull", args, [python]), json_lines(answers, t.host_name, "pull"), stdin=stdin, timeout_s=24 * 3600.0
    )
    last = answers.last(code)
    # redacted whole, then cut; one line: the Hub's own error text must not start a line of fleet's
    why = safe_line(redact(str(last.get("why") or last.get("error") or ""), secrets))[:600]
    problems = [safe_line(redact(str(p), secrets))[:300] for p in last.get("problems") or []]
    seconds = time.monotonic() - started
    if last["e"] in ("present", "pulled"):
        return PullResult(
            host.name,
            path,
            str(last["e"]),
            None if last.get("files") is None else int(last["files"]),
            int(last.get("bytes") or 0),
            int(last.get("checksums") or 0),
            last.get("commit"),
            seconds,
        )
    if last["e"] == "error":
        raise HostStepError(f"{host.name}: fleet's pull step failed on the host ({why}).", "")
    listed = "".join(f"\n  {p}" for p in problems)
    message = f"{host.name}: {pb.hf_repo} was not pulled to {path}: {why}{listed}"
    hint = HINTS.get(str(last.get("kind")), "")
    if last.get("stage") == "download":
        raise DeployFailed(message, hint or "Run fleet pull again: the files that came whole are kept.")
    raise PreflightError(message, hint)


class StepEvents:
    """A pull or push step's events: its plan and progress go to `progress` as events; of the rest only the
    last is kept (the step's answer: a host saying more cannot grow fleet's memory)."""

    def __init__(self, path: str, progress: Callable[[events.Event], None], source: str | None = None) -> None:
        self.path, self.progress, self.source = path, progress, source
        self.kept: StepEvent | None = None
        self.planned_at, self.had = time.monotonic(), 0

    def __call__(self, ev: StepEvent) -> None:
        if ev.get("e") == "planned":
            self.planned_at, self.had = time.monotonic(), int(ev["have"])
            plan = (ev["files"], ev["bytes"], ev["have"], ev["free"])
            self.progress(events.ModelPullPlanned(self.path, ev.get("commit") or "", *plan, source=self.source))
        elif ev.get("e") == "progress":
            self.progress(_progress(ev["done"], ev["total"], self.had, time.monotonic() - self.planned_at))
        else:
            self.kept = ev

    def last(self, code: int) -> StepEvent:
        return self.kept or {"e": "error", "error": f"no answer (exit {code})"}


def _progress(done: int, total: int, had: float, elapsed: float) -> events.ModelPullProgress:
    """The rate of what this pull fetched (not what an earlier one left), from when it began fetching."""
    fetched = max(0.0, done - had)
    rate = fetched / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 and fetched > 0 else None
    return events.ModelPullProgress(done, total, rate, eta)


HINTS = {
    "disk": "Free space on the host (or point models_dir: elsewhere), then pull again.",
    "busy": "Wait for the other pull to end (fleet status shows nothing for it; its terminal does).",
    "client": "Install the engine in the inventory's engines: path (its huggingface_hub comes with it).",
    "listing": "Check hf_repo:, revision: and HF_TOKEN (a gated or private model needs a token that may read it).",
    "foreign": "Move that directory away (or fix it), then pull again; fleet never changes a directory it did not make",
}
