"""The one place a host script is built and sent: what fleet runs for one step on a host (`run_step`, typed
by fleet.step_answers; the streamed steps' events through `EventLines`).

A step's source is the shared host code (`SHARED`: the words, records, common, procs and signals files)
followed by the step's own file(s), each compiled under its own file name; the shell wrapper around it
finds a Python on the host (the engine's, then `python3`) and says so in JSON when there is none.
Scripts are sent as one `sh -c` command: one round trip; each file's text travels compressed
(a command's argument is capped at 128 KiB). Data that must not appear in
`ps` (secrets) goes on stdin, never here.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import shlex
import zlib
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, TypedDict, cast

from fleet.errors import HostStepError
from fleet.protocol import json_object
from fleet.secrets import hide, redact
from fleet.transport.base import Collected, CommandResult

if TYPE_CHECKING:
    from fleet.inventory import Host
    from fleet.plan import LaunchPlan
    from fleet.step_answers import Answer, Request, Step
    from fleet.transport import Transport

SHARED = ("host/words.py", "host/records.py", "host/common.py", "host/procs.py", "host/signals.py")
STEPS: dict[str, tuple[str, ...]] = {
    "probe": (
        "host/container.py",
        "host/model_files.py",
        "host/probe_gpus.py",
        "host/probe.py",
    ),  # facts in one round trip
    # lock, engine check, stop, free, launch, record
    "act": (
        "host/container.py",
        "host/free.py",
        "host/lock.py",
        "host/check.py",
        "host/weight_cache.py",
        "host/launch.py",
        "host/act.py",
    ),
    # follow an attempt (its start-up phases too), prove the server
    "watch": (
        "host/container.py",
        "startup.py",
        "host/startup.py",
        "host/follow.py",
        "host/smoke.py",
        "host/watch.py",
    ),
    # facts + checks
    "health": (
        "host/container.py",
        "host/model_files.py",
        "host/probe_gpus.py",
        "host/probe.py",
        "host/smoke.py",
        "host/health.py",
    ),
    "logs": ("host/follow.py", "host/logs.py"),  # server logs, followed across restarts
    "heal": ("host/heal.py",),  # the heal rate limit, decided and recorded on the host
    "fixes": ("host/fixes.py",),  # forget learned fixes, under the host's guard
    "router": ("host/smoke.py", "host/router.py"),  # a service's router and record
    "pull": ("host/model_files.py", "host/pull.py"),  # a model from the Hub
    # a model from another copy (fleet push): its files listed and sent, then received, checked, put in place
    "send": ("host/model_files.py", "host/pull.py", "host/send.py"),
    "receive": ("host/model_files.py", "host/pull.py", "host/receive.py"),
    "engine": ("host/engine.py",),  # fleet's own engine environments: install, use
}


# Files a step carries as text, not code: programs it runs under another Python (the engine's own).
TEXTS: dict[str, tuple[str, ...]] = {"act": ("host/check_sglang.py", "host/check_vllm.py", "host/launchers.py")}


@functools.cache
def _read(path: str) -> str:
    return resources.files("fleet").joinpath(path).read_text(encoding="utf-8")


@functools.cache
def _shipped(path: str) -> str:
    """A host file as it is sent: without its comment lines and its docstrings, which are for the people
    reading it here (a step is one argument of one command, and a fifth of its text was comments, another
    fifth docstrings). A line inside any other triple-quoted string is text, and kept; every line stays
    where it is, so a traceback from the host names the line in fleet's own file. (tokenize or ast would
    also take trailing comments, at ~70-110 ms a deploy.) A test holds each file's shipped code to the
    syntax tree of its source without its docstrings."""
    lines = _read(path).split("\n")
    in_string = ""
    opened_by = -1  # the line that opened the string being read, when it is a docstring
    code_before = ""  # the last code line: a docstring follows `def ...:` or `class ...:`, or opens the file
    for i, line in enumerate(lines):
        text = line.strip()
        if not in_string and text.startswith("#"):
            lines[i] = ""
            continue
        opens = not in_string and text.startswith(QUOTES)
        for quote in QUOTES:
            if (not in_string or in_string == quote) and line.count(quote) % 2:
                in_string = "" if in_string else quote
        if opens and (code_before.endswith(":") or not code_before) and _block_goes_on(lines, i, line):
            opened_by = i
        if opened_by >= 0 and not in_string:
            lines[opened_by : i + 1] = [""] * (i + 1 - opened_by)
            opened_by = -1
            continue
        if text and not in_string:
            code_before = text
    return "\n".join(lines)


QUOTES = ('"""', "'" * 3)


def _block_goes_on(lines: list[str], start: int, line: str) -> bool:
    """Whether code at the string's own indentation follows the string that opens at line `start` (else it
    is its block's only statement, and stays)."""
    indent = len(line) - len(line.lstrip())
    quote = line.strip()[:3]
    if line.count(quote) >= 2:
        end = start
    else:
        end = next((j for j in range(start + 1, len(lines)) if quote in lines[j]), len(lines))
    after = next((x for x in lines[end + 1 :] if x.strip() and not x.lstrip().startswith("#")), "")
    return bool(after) and len(after) - len(after.lstrip()) == indent


# Runs on the host before a step's files: each file's code, compiled once per content and Python and kept
# in the host user's cache (a step compiles 90-120 KB of source, tens of milliseconds a round trip). An
# entry is used only from a directory and file that are the user's own and writable by nobody else, and
# only for the exact text (its hash is its name); entries unused for 30 days go when a new one is written.
COMPILED_PRELUDE = """\
def _fleet_compiled(key, text, name):
    import marshal, os, sys, time
    tag = getattr(sys.implementation, "cache_tag", None)
    where = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fleet", "steps")
    path = os.path.join(where, "%s.%s" % (key, tag))
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            mine, home = os.fstat(f.fileno()), os.stat(where)
            if tag and mine.st_uid == home.st_uid == os.getuid() and not (mine.st_mode | home.st_mode) & 0o022:
                return marshal.loads(f.read())
    except (OSError, ValueError, EOFError, TypeError):
        pass
    code = compile(text, name, "exec")
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        os.makedirs(where, 0o700, exist_ok=True)
        for old in os.listdir(where):
            if time.time() - os.stat(os.path.join(where, old)).st_atime > 30 * 86400:
                os.unlink(os.path.join(where, old))
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(marshal.dumps(code))
        os.replace(tmp, path) if tag else os.unlink(tmp)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return code
"""


def _files(paths: Sequence[str], carried: Sequence[str] = ()) -> str:
    """The statements that run `paths` on the host, in order: their texts travel as one compressed block
    (smaller than each alone: the whole script is one argument of one command, which Linux caps at 128
    KiB, and the act step's plain text came to 112 KiB), each compiled under its own file name (a traceback
    names fleet/host/act.py and its line) or its code taken from the host's cache. `carried`: files in the
    same block kept as text (FLEET_TEXTS), for programs the step runs under another Python. zlib's default
    level: its best took 7-9 ms of every step for half a percent less."""
    texts = [_shipped(p) for p in paths]
    block = "\0".join([*texts, *(_shipped(p) for p in carried)])
    data = base64.b64encode(zlib.compress(block.encode("utf-8"))).decode("ascii")
    out = f"_fleet_texts = _z.decompress(_b.b64decode({data!r})).decode('utf-8').split('\\0')\n"
    if carried:
        out += f"FLEET_TEXTS = dict(zip({list(carried)!r}, _fleet_texts[{len(texts)}:]))\n"
    for i, (path, text) in enumerate(zip(paths, texts, strict=True)):
        key = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
        out += f"exec(_fleet_compiled({key!r}, _fleet_texts[{i}], {'fleet/' + path!r}))\n"
    return out


@functools.cache
def source_for(step: str) -> str:
    """The Python source of a step, as it runs on the host."""
    prelude = "import base64 as _b, zlib as _z\n"
    prelude += {  # a step's file used as a library by another: without its main
        "health": "FLEET_PROBE_AS_LIBRARY = True\n",
        "send": "FLEET_PULL_AS_LIBRARY = True\n",
        "receive": "FLEET_PULL_AS_LIBRARY = True\n",
    }.get(step, "")
    # Each file is compiled under its own name, into one namespace: a traceback from the host names
    # fleet/host/act.py and its line, not line 2345 of "<string>" (and coverage can follow it).
    return prelude + COMPILED_PRELUDE + _files((*SHARED, *STEPS[step]), TEXTS.get(step, ()))


def step_python(host: Host) -> str:
    """The Python a fleet step that needs no engine runs under on `host`: its first engine's, else python3."""
    return next(iter(host.settings.engines.values()), "python3")


def deployment_python(host: Host, plan: LaunchPlan) -> str:
    """The Python a deployment's own steps (act, watch) run under: its engine's, which the engine's check
    imports. A container's engine and check are in its image, so there it is the host's step Python: an
    engine's environment has NVML's bindings, read in a millisecond, where `python3` often has none and
    asks nvidia-smi (tens of milliseconds, before anything in the way is stopped)."""
    return step_python(host) if plan.container is not None else plan.python


def script_for(step: str, args: Mapping[str, object], pythons: Sequence[str]) -> str:
    """The shell script that runs `step` with `args` under the first of `pythons` (then python3) the host
    has. `~/` paths are expanded here for the interpreter only; everything else is data."""
    tries = " ".join(shlex.quote(p) for p in [*pythons, "python3"])
    missing = json.dumps({"error": f"no Python to run it: tried {', '.join([*pythons, 'python3'])}"})
    return (
        f"for py in {tries}; do\n"
        '  case "$py" in "~/"*) py="$HOME/${py#\\~/}";; esac\n'
        '  if [ -x "$py" ] || command -v "$py" >/dev/null 2>&1; then\n'
        f'    FLEET_PROBE_PYTHON="$py" exec "$py" -c {shlex.quote(source_for(step))} {shlex.quote(json.dumps(args))}\n'
        "  fi\n"
        "done\n"
        f"printf '%s\\n' {shlex.quote(missing)}\n"
    )


def run_step(
    transport: Transport,
    python: str,
    step: Step[Request, Answer],
    request: Request,
    *,
    stdin: bytes = b"",
    timeout_s: float = 300.0,
    hold_stdin: bool = False,
) -> Answer:
    """Run a host step (fleet.step_answers: ACT, FIXES, ROUTER, SEND_LIST) on `request`, under `python`;
    its answer, as the step's declared type."""
    answer = _run_json(
        transport, python, step.name, cast(Mapping[str, object], request), stdin, timeout_s, hold_stdin=hold_stdin
    )
    return cast("Answer", answer)


def _run_json(
    transport: Transport,
    python: str,
    step: str,
    args: Mapping[str, object],
    stdin: bytes = b"",
    timeout_s: float = 300.0,
    *,
    hold_stdin: bool = False,
) -> dict[str, Any]:
    """Run a host script that prints one JSON document (`answer_of`).

    `hold_stdin`: run it as a stream, whose stdin stays open until fleet has its answer; the script
    (told by `client_on_stdin`) stops before changing anything when it ends: fleet is gone."""
    if hold_stdin:
        output = Collected(transport.host_name)
        script = script_for(step, {**args, "client_on_stdin": True}, [python])
        result = output.result(transport.stream(script, output.out, stdin=stdin + b"\n", timeout_s=timeout_s))
    else:
        result = transport.run(script_for(step, args, [python]), stdin=stdin, timeout_s=timeout_s)
    return answer_of(transport.host_name, step, result)


def host_said(result: CommandResult, chars: int, secrets: Mapping[str, str] | None = None) -> str:
    """The last `chars` (at most 4000) of what a command printed, stdout then stderr, with every secret this run
    read (and `secrets`) hidden before the cut: a step may have echoed its stdin, and a cut may leave a
    secret's tail."""
    return redact(hide((result.text + result.error_text)[-4000:]), secrets or {})[-chars:]


def answer_of(host_name: str, step: str, result: CommandResult) -> dict[str, Any]:
    """A step's one JSON document; a step that failed on the host is a HostStepError (the host answered:
    not an SSH problem), with the host's own traceback for --debug. What the host said is quoted with every
    secret hidden, before it is cut: a step may have echoed its stdin, and a cut may leave a secret's tail."""
    data = json_object(result.text)
    if data is None:
        said = host_said(result, 2000)
        raise HostStepError(
            f"{host_name}: fleet's {step} step failed on the host and said no result "
            f"(exit {result.exit_code}: {said[-300:].strip()!r}).",
            "Run with --debug for all it printed.",
            said,
        )
    if "error" in data:
        raise HostStepError(
            f"{host_name}: fleet's {step} step failed on the host ({hide(str(data['error']))}).",
            "Run with --debug for the host's traceback." if data.get("traceback") else "",
            hide(str(data.get("traceback", ""))),
        )
    return data


class StepEvent(TypedDict, total=False):
    """One line a streamed step says (pull, receive, engine): `e` names it, the rest is its own. A line that
    is not one of them is an `error` event with what was said (EventLines)."""

    e: str
    error: str
    why: str
    kind: str
    stage: str
    problems: list[str]
    t: str  # a line of the step's own output (an engine install's pip)
    need: list[Any]  # the files a receiving host asks for
    files: Any  # a count; None when a model is present but the Hub could not list it
    bytes: int
    have: int
    free: int
    done: int
    total: int
    sent: int
    commit: str | None
    checksums: int
    ours: bool
    version: str
    installer: str
    previous: str | None
    python: str


# One event line held at most: the host cuts a log line to 16 KiB, so only a broken host sends more.
EVENT_BYTES = 1 << 20


class EventLines:
    """A streamed step's stdout as its events, one JSON object per line, each line held to EVENT_BYTES: a
    host that never ends a line cannot grow fleet's memory. A line that is not one of the step's events
    (stray output on the host, the no-Python answer) becomes an error event with its tail, said by the
    step's caller as that step's failure."""

    def __init__(self, host_name: str, step: str) -> None:
        self.host_name, self.step = host_name, step
        self.pending = b""
        self.said = 0  # events read so far

    def feed(self, chunk: bytes) -> list[StepEvent]:
        *whole, self.pending = (self.pending + chunk).split(b"\n")
        if len(self.pending) > EVENT_BYTES:
            raise HostStepError(
                f"{self.host_name}: fleet's {self.step} step sent a line of over {EVENT_BYTES} bytes.",
                "Run with --debug; what answered on the host is not fleet's own step.",
            )
        found = [_event(raw) for raw in whole if raw.strip()]
        self.said += len(found)
        return found


def _event(raw: bytes) -> StepEvent:
    event = json_object(raw)
    if event is not None and isinstance(event.get("e"), str):
        return cast(StepEvent, event)  # the step's own: its keys as the step says them
    if event is not None and "error" in event:  # no Python on the host: said in place of events
        return {"e": "error", "error": str(event["error"])}
    return {"e": "error", "error": raw.decode("utf-8", "replace")[-300:]}


def json_lines(on_event: Callable[[StepEvent], None], host_name: str, step: str) -> Callable[[bytes], bool]:
    """A stream's `on_chunk` for a step that says one JSON object per line (pull, push, engine): each
    event to `on_event` (fleet.hostscripts.EventLines)."""
    reader = EventLines(host_name, step)

    def on_chunk(chunk: bytes) -> bool:
        for event in reader.feed(chunk):
            on_event(event)
        return True

    return on_chunk
