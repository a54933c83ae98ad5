"""Engine logs as operators paste them, made comparable: prefixes, framing and colour stripped, the
log level kept, wrapped messages re-joined for matching, and what makes a line a failure or proof
of serving. Pure: text in, text out.

Real logs arrive wrapped in whatever carried them: docker-compose and Kubernetes framing, `> `
quotes from an issue, Ray actor prefixes, CRI and log-collector timestamps, the engines' own
`[2026-… TP3]` and `ERROR 05-13 10:46:43 [core.py:962]` prefixes, ANSI colour (sometimes pasted as
the literal text `^[[31m`). A classifier that keys on the message must see the message.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from fleet.crashes import literals
from fleet.crashes.literals import Prefiltered, Text

# Anywhere in a line: colour and terminal control sequences, also pasted as literal "^[[31m".
_CONTROL = re.compile(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\^\[\[[0-9;]*m|[\x00-\x08\x0b-\x1f\x7f]"
)
_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")  # Ray's de-duplication suffix
_K8S_RIGHT = re.compile(r"\s*│\s*$")  # Kubernetes log viewer's right frame
_RICH_SOURCE = re.compile(r"\s{2,}[\w.-]+\.py:\d+\s*$")  # rich's "file.py:108" column

_LEVEL = r"(?P<level>INFO|WARNING|WARN|ERROR|ERR|DEBUG|CRITICAL|FATAL)"
# Each strips one prefix at the start of a line; they nest, so they are applied until none applies.
_PREFIXES = [
    re.compile(r"^>\s?"),  # quoted in an issue
    re.compile(r"^\d+\t"),  # a CI log viewer's line number (Buildkite's copy)
    re.compile(r"^│\s?"),  # Kubernetes log viewer's left frame
    re.compile(r"^\s*\|\s+(?=\S)"),  # CI log viewers ("  | [2025-…")
    re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?\s+(?:stdout|stderr)\s+[FP]\s"),  # CRI log format
    # a cloud log viewer's copy (Google Cloud Logging): its own severity (INFO for all a container wrote,
    # not the engine's level, which its own prefix says next), a timestamp and the resource's label
    re.compile(
        r"^(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|ERROR|CRITICAL|ALERT|EMERGENCY)\s+\d{4}-\d\d-\d\dT[\d:.]+Z?\s+"
        r"\[[\w.]+:\s*[^\]]*\]\s*"
    ),
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: (?:TP|DP|PP|EP|CP)\d+)*\]\s*"),  # SGLang
    re.compile(r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s*"),  # ISO timestamps
    re.compile(r"^(?:(?:TP|DP|PP|EP|CP)\d+ ?)+\]\s*"),  # SGLang's rank tag, its "[date" cut off
    re.compile(r"^\[\d\d/\d\d/\d\d \d\d:\d\d:\d\d\]\s*"),  # rich's "[05/05/25 16:31:14]"
    re.compile(r"^\[\d\d:\d\d:\d\d(?: (?:TP|DP|PP|EP|CP)\d+)*\]\s*"),  # SGLang of 2024: "[16:43:29 TP0]"
    re.compile(r"^\[?[\w.-]+(?:[-_]\d+)?\]?\s+\|\s?"),  # docker-compose "service_1  | ", "[llm]    | "
    # stern's "POD CONTAINER " (a Deployment's pod: NAME-<replica set hash>-<5 characters>)
    re.compile(r"^[a-z0-9][a-z0-9.-]*-[a-z0-9]{6,10}-[a-z0-9]{5} [a-z0-9][a-z0-9-]* "),
    re.compile(rf"^\|\s*{_LEVEL}\s*\|\s*[\w.]+\s*\|\s?"),  # FastChat "| ERROR | stderr | "
    re.compile(rf"^-\s+[\w.]+\s+-\s+{_LEVEL}\s+-\s+"),  # python logging "- module - INFO - "
    re.compile(r"^\((?:APIServer|EngineCore(?:_DP\d+)?|Worker(?:_\w+)?|VllmWorker[\w-]*|pid=\d+)[^)]*\)\s*"),
    # Ray actors "(RayWorkerWrapper pid=123, ip=…)", their names with parentheses too ("(ActorWorker(x-0) pid=1, )")
    re.compile(r"^\((?:[\w:.-]|\([^()]*\))+\s+pid=\d+[^)]*\)\s*"),
    re.compile(r"^\[(?:TP|DP|PP|EP|CP)\d+(?: (?:TP|DP|PP|EP|CP)\d+)*\]\s*"),
    re.compile(r"^\[(?:rank|default)\d+\]:\s*"),  # torch.distributed; torchrun --tee's "[default0]:"
    re.compile(r"^\[[\w/.-]+@<\d+,\d+>\]:\s?"),  # a launcher's per-rank tag: "[/bin/sh@<0,0>]: "
    # journald and syslog: "Jun 02 10:00:01 host unit[12]: "
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [\w.@-]+(?:\[\d+\])?: "),
    re.compile(  # vLLM: "ERROR 05-13 10:46:43 [core.py:962] " and the older "INFO 12-27 08:52:17 config.py:350] "
        rf"^{_LEVEL}\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+(?:\[(?P<source>[^\]]+)\]|(?P<old_source>[\w.]+:\d+)\])\s?"
    ),
    re.compile(rf"^{_LEVEL}\s+[\w.]+:\d+ -- "),  # Ray's CLI "ERR cli.py:71 -- "
    re.compile(rf"^{_LEVEL}\s+\d+\s+\[[\w.]+:\d+\]\s"),  # a wrapper's logging: "INFO 147907 [scheduler.py:287] "
    # and "[INFO] sglang.srt.managers.scheduler: ", never an exception's name ("[ERROR] torch.OutOfMemoryError: ")
    re.compile(rf"^\[{_LEVEL}\]\s+(?![\w.]*(?:Error|Exception|Warning):)\w+(?:\.\w+)+:\s"),
    re.compile(rf"^\[{_LEVEL}\]\s+"),  # a bare level: "[ERROR] ValueError: ..."
    re.compile(rf"^{_LEVEL}:\s+"),  # uvicorn "ERROR:    "
    re.compile(rf"^\s+{_LEVEL}\s{{2,}}"),  # rich's level column
    # glog (PyTorch's C++ side, Kubernetes tools): "[E227 16:30:43.526290891 ProcessGroupNCCL.cpp:1834] "
    re.compile(r"^\[?(?P<glog>[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+(?:\d+\s+)?[\w.-]+:\d+\]\s*"),
    # Rust's tracing (after its timestamp): "ERROR scheduler.run: ", "INFO dynamo_runtime::x: "
    re.compile(rf"^{_LEVEL}\s+(?=[a-z_]\w*(?:(?:\.|::)\w+)*(?::\s|\s|$))"),
]
_GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "FATAL"}

# Whether any prefix starts the text, in one match (names dropped: several prefixes name a level): most
# lines have one prefix or none, and trying each of the two dozen in turn cost more than the rest of a
# long log's normalising
_UNNAMED = re.compile(r"\(\?P<\w+>")
_ANY_PREFIX = re.compile("|".join(f"(?:{_UNNAMED.sub('(?:', p.pattern)})" for p in _PREFIXES))


WINDOW_CHARS = 1000
# What of one line is read at all: its start and its end, each far more than a window, so a megabyte-long
# line (a config dump, a file of NULs) costs nothing to strip (stripping 16 MiB took seconds), and a
# failure at the end of a long line of progress bars joined by carriage returns is still seen.
LINE_CHARS = 16 * WINDOW_CHARS


def _bounded(raw: str) -> str:
    return raw if len(raw) <= 2 * LINE_CHARS else raw[:LINE_CHARS] + " ... " + raw[-LINE_CHARS:]


# Records that carry a client's text: an access log's request line (its path and query are the client's,
# whatever the method), the engines' request logging (`--log-requests`: SGLang's Receive/Finish of a
# request, as a repr or as JSON; vLLM's "Received request ...", and "Generated response ...: output:" with
# --enable-log-outputs, the model's words a prompt steers), SGLang's error for one request ("[http_server]
# Error: ...", which echoes what the request said). Whatever such a record says is a client's words: never
# a failure, a ready line or a signature's evidence, however it is split (a literal "\n", a carriage
# return). The line after one is the engine's own again, whatever brackets a prompt left open ('sad :(').
ACCESS = re.compile(r'^\S+:\d+ - "[A-Za-z][A-Za-z-]* |"(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) /\S* HTTP/')
BODY = re.compile(
    r"^(?:Receive|Finish|Abort)(?: \w+)?: (?:obj|rid)=|\bGenerateReqInput\(|\bEmbeddingReqInput\(|"
    r"^Received request\b|^Generated response\b|\bprompt(?:_token_ids)?: ['\"\[]|^\[http_server\] Error: |"
    r'^\{.*"(?:rid|request_id|obj|text|input_ids|messages)": |'
    r"^Hit invalid [\w ]+: "  # a request's grammar SGLang's grammar backend refused, quoted
)
QUOTED = re.compile(f"{ACCESS.pattern}|{BODY.pattern}")
# What SGLang's tool-call parsers say of a model's output that did not parse: the model's words, which a
# prompt steers, often printed as they are, newlines included. Never an exception line of the engine's
# ("ValueError: ... --tool-call-parser ...", at start-up, is the engine's own).
PARSER_ECHO = re.compile(
    r"\b(?:detect_and_parse|parse_streaming_increment)\b|\btool[ -]calls?\b(?![ _-]?parser)|"
    r"\bundefined (?:function|tool)\b"
)
PARSER_WORDS = ("tool", "detect_and_parse", "parse_streaming", "undefined")  # one is in every PARSER_ECHO match
# vLLM's request-facing modules log what one request did or what went wrong with it, and NewLineFormatter
# gives every line of a message their prefix, so a client's text (a request id or a model name with a
# newline, a template error) reads as the engine's own failure: the OpenAI handlers (serving_chat.py, ...;
# serving.py since they moved into a package per endpoint) and the request logger (request_logger.py;
# logger.py before). The engine's own failures are logged by the engine core and the API server.
# Their tool-call and reasoning parsers read a model's output for one request, and log it when it does not
# parse (the model's words, which a prompt steers).
REQUEST_HANDLER = re.compile(
    r"(?:serving(?:_\w+)?|request_logger|logger|\w*_tool_parser|\w*reasoning_parsers?|basic_parsers)\.py:\d+"
)
# A traceback a log collector flattened into one line with literal "\n": the engine's, when the message
# starts with it (or with the engine's own "... hit an exception: "). A literal "\n" anywhere else is a
# client's text (a model name, a request id) and splits nothing.
ESCAPED_TRACEBACK = re.compile(r"^(?:[\w .-]+ hit an exception: )?Traceback \(most recent call last\):\\n")


@dataclass(frozen=True)
class LogText:
    """A log, normalised: `lines[i]` is the message, `levels[i]` the log level its prefix named,
    `quoted[i]` whether it is a client's text (a request logged), which is never evidence, and
    `echoed[i]` whether it may be: a line no prefix starts after a record that quotes a client. An echoed
    line still counts as a failure (a crash the engine printed there must not be missed), but never as
    the evidence of a fix or as proof of serving."""

    lines: tuple[str, ...]
    levels: tuple[str | None, ...]
    quoted: tuple[bool, ...] = ()
    echoed: tuple[bool, ...] = ()

    def is_quoted(self, i: int) -> bool:
        return bool(self.quoted) and self.quoted[i]

    def is_echoed(self, i: int) -> bool:
        return bool(self.echoed) and self.echoed[i]

    def window(self, i: int) -> str:
        """Line i with the lines that continue it, for messages a terminal or a paste wrapped; at most
        WINDOW_CHARS of it, which hold the part of a message that tells what failed (a config dump can
        run to megabytes, and every signature scans every window)."""
        if self.is_quoted(i):
            return ""  # a client's words match no signature
        text = self.lines[i][:WINDOW_CHARS]
        for j in range(i + 1, min(i + 4, len(self.lines))):
            if (
                len(text) >= WINDOW_CHARS
                or self.is_quoted(j)
                or self.is_echoed(j)
                or not is_continuation(self.lines[j])
            ):
                break
            text += " " + self.lines[j][:WINDOW_CHARS]
        return text[:WINDOW_CHARS]

    @functools.cached_property
    def windows(self) -> tuple[str, ...]:
        """Every line's window, made once: the transient-line check and each signature's scan read them."""
        return tuple(self.window(i) for i in range(len(self.lines)))

    def scanner(self, pattern: re.Pattern[str], *, in_windows: bool = False) -> Prefiltered:
        """`pattern` over the lines (or windows): in a long log, searched only in those holding a word it
        needs (fleet.crashes.literals), as most of a failure's patterns are in few lines or none."""
        whole = self.windows_text if in_windows else self._lines_text
        return Prefiltered(pattern, whole if len(whole.text) >= literals.PREFILTER_FROM_CHARS else None)

    @functools.cached_property
    def _lines_text(self) -> Text:
        return Text("\n".join(self.lines))

    @functools.cached_property
    def windows_text(self) -> Text:
        """Every window, one per line of the text: what each signature's regex scans."""
        return Text("\n".join(self.windows))


def _strip(raw: str) -> tuple[str, str | None, str | None]:
    """The message, the level its prefix named, and the source file:line it named (vLLM's prefix)."""
    text = _REPEATED.sub("", _CONTROL.sub("", _bounded(raw.rstrip("\r\n"))))
    text = _K8S_RIGHT.sub("", text)
    level = source = None
    for _ in range(8):  # prefixes nest: compose | timestamp (EngineCore pid=1) ERROR …
        if not _ANY_PREFIX.match(text):
            break
        before = text
        for p in _PREFIXES:
            m = p.match(text)
            if m:  # the outermost prefix is the logger's; one further in may be a client's text
                level = level or m.groupdict().get("level") or _GLOG_LEVELS.get(m.groupdict().get("glog") or "")
                source = source or m.groupdict().get("source") or m.groupdict().get("old_source")
                text = text[m.end() :]
                if p.pattern.startswith(r"^\s+"):
                    text = _RICH_SOURCE.sub("", text)
        if text == before:
            break
    if text.startswith(" ") and EXCEPTION_LINE.match(text):  # a padded traceback's "  TimeoutError"
        text = text.lstrip(" ")
    return text, level, source


def _logged(raw: str) -> bool:
    """Whether a logger began the line: it starts with one of the prefixes _strip takes off."""
    return bool(_ANY_PREFIX.match(_CONTROL.sub("", raw)))


def quotes_a_client(message: str, source: str | None) -> bool:
    """Whether a record (its message, and the source file its prefix named) carries a client's or a
    model's words."""
    if QUOTED.search(message) or (source and REQUEST_HANDLER.fullmatch(source)):
        return True
    if not any(word in message for word in PARSER_WORDS):  # most lines: the regex is not run
        return False
    return bool(PARSER_ECHO.search(message)) and not is_exception_line(message)


def normalize_log(raw_lines: Iterable[str]) -> LogText:
    """Strip colour codes and prefixes; unflatten tracebacks logged as one line with literal '\\n'; split
    a line at carriage returns as a terminal would show it (progress bars redrawn in place, then the
    crash on the same line). A record that quotes a client (quotes_a_client) is marked whole, with every
    piece it splits into: splitting cannot turn it into evidence. The lines after it that no prefix
    starts, when a prefix started it, are echoed: a logger prefixes a record's first line only, so they
    may be the client's text going on after a newline it held -- up to a line with a prefix of its own,
    fleet's own "[fleet] " line, or a traceback's head (an exception the engine printed as it is)."""
    rows: list[tuple[str, str | None, bool, bool]] = []  # (message, level, quoted, echoed)
    quoting = False  # after the first line of a prefixed record that quotes a client
    for raw in raw_lines:
        message, level, source = _strip(raw)
        quotes = quotes_a_client(message, source)
        goes_on = False
        if quotes or quoting:
            prefixed = _logged(raw) or message.startswith("[fleet] ")
            goes_on = quoting and not (quotes or prefixed or TRACEBACK_HEAD.match(message.lstrip()))
            quoting = (quotes and (prefixed or quoting)) or goes_on
        if quotes or goes_on:
            rows.append((message, level, quotes, goes_on))
            continue
        pieces = raw.split("\\n") if ESCAPED_TRACEBACK.match(message) else [raw]
        carriage = "\r" in raw.rstrip("\r\n")
        if carriage:
            pieces = [seg for piece in pieces for seg in piece.rstrip("\r\n").split("\r") if seg.strip()]
        # a carriage return inside a record a logger began is the record's own text (a client's request id
        # holds one as easily as a newline): what follows it is echoed, at the record's level
        logged = carriage and _logged(raw)
        for n, piece in enumerate(pieces):  # a line kept whole was stripped above: only a split one's pieces are
            text, piece_level = (message, level) if piece is raw else _strip(piece)[:2]
            echo = logged and n > 0
            rows.append((text, level if echo else piece_level, False, echo))
    return LogText(
        tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows), tuple(r[3] for r in rows)
    )


def normalize(raw_lines: Iterable[str]) -> list[str]:
    return list(normalize_log(raw_lines).lines)


# NCCL's own records ("node5:240:240 [6] NCCL INFO …") start in lower case, as a host's name may: each is a
# record of its own, and an INFO trace after a WARN must not make the warning a transient one.
_CONTINUATION = re.compile(r"^(?![\w.-]+:\d+:\d+ \[\d+\] )[a-z:,;.)'\"]|^< truncated")


def is_continuation(line: str) -> bool:
    """A wrapped message goes on in lower case (or punctuation); a new record, frame or exception does not."""
    return bool(line) and not line[0].isspace() and bool(_CONTINUATION.match(line))


# --- what a line says ---------------------------------------------------------------------------------

# A Python exception line: "ValueError: …", "torch.OutOfMemoryError: …", "KeyError: 'x'", a bare
# "AssertionError". Warnings (UserWarning, FutureWarning) are not failures.
EXCEPTION_LINE = re.compile(
    # (indented a little where a post or a collector padded the traceback: "  TimeoutError")
    r"^ {0,4}(?:[A-Za-z_][\w]*\.)*(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt)(?:\([^)]*\))?(?::|\s*$)"
    # one whose name says nothing but whose module does: "triton.runtime.errors.OutOfResources: …"
    r"|^(?:[A-Za-z_]\w*\.)*(?:errors|exceptions|exc)\.[A-Z]\w*(?::|\s*$)"
)
TRACEBACK_HEAD = re.compile(r"Traceback \(most recent call last\)")
FRAME = re.compile(r'^\s*File "[^"]+", line \d+|^\s*File "[^"]+"|^frame #\d+:|^\s*#\d+ 0x')
# A process that died without a Python exception: native crashes, signals, child processes lost.
FATAL = re.compile(
    r"Fatal Python error|Segmentation fault|\bSIGSEGV\b|Bus error|core dumped|^Aborted\b|"
    r"terminate called|^\s*what\(\):|(?:^|[\s\]|])Killed\s*$|^Killed process|exited with (?:exit )?code [1-9]|"
    r"exited unexpectedly|died unexpectedly|EngineDeadError|EngineCore failed to start|"
    r"Engine core initialization failed|Scheduler hit an exception|Received sigquit from a child|"
    r"^Failed: |^[\w./-]+(?: \w+)?: error: |^error: |^\d+ errors? detected in the compilation of |"
    r"Initialization failed|process is killed by SIGKILL|"
    r"The actor is dead|worker process has died|Child process unexpectedly failed|"
    r"Memory access fault by GPU|\.cu:\d+: .*Assertion .* failed|NVRM: Xid|GPU has fallen off the bus|"
    r"killed due to memory pressure|Signal \d+ \(SIG[A-Z]+\) received by PID|"
    r"\b[Ee]xit ?[Cc]ode\s*[:=]?\s*-\d+\b|(?:exited|terminated|killed) (?:with|by) signal\b|[Ss]cheduler is dead\b|"
    r"^\s*#?\d+\s+0x[0-9a-fA-F]{8,}\s+\S|"  # a native backtrace's frame (UCX, gdb): a process crashed
    r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):"  # faulthandler's dump
)
# Lines that mention an error but are not a failure: a model module SGLang skips, a warning.
BENIGN = re.compile(r"Ignore import error|\b\w+Warning:")
# Neither a failure nor a signature's evidence: a call that will be retried, a client's bad request.
TRANSIENT = re.compile(
    r"\bretrying\b|\bwill retry\b|\bretry (?:in|after) \d|\battempt \d+ (?:of|/) ?\d+|"
    r"\b(?:code=|status(?:_code)?[=: ]|HTTP/\d\.\d\" )4\d\d\b|\bNotFoundError|BadRequestError|"
    r"\bNCCL INFO\b"  # NCCL_DEBUG=INFO's own trace: "Plugin load returned 2 : libnccl-net.so: cannot open …"
)
_RETRY_TAIL = re.compile(r"^(.*?)[\s,.;:]*(?:\bretrying\b|\bwill retry\b).*$")


def _key(text: str) -> str:
    return re.sub(r"[\s,.;:]+$", "", text)


def transient_lines(log: LogText) -> set[int]:
    """Lines that report something retried, and the same message again (the last try's report). A raised
    exception (a traceback's head or its exception line) is never a try's report, whatever said "retrying"
    before it: copies of a crash's lines, each with "retrying", must not hide the crash."""
    windows = log.windows
    retry, transient = log.scanner(_RETRY_TAIL, in_windows=True), log.scanner(TRANSIENT, in_windows=True)
    # what was retried, in the engine's own words: a client's echoed "... retrying" hides no real line
    retried = {
        _key(m.group(1)) for i, w in enumerate(windows) if not log.is_echoed(i) and (m := retry.match(w)) and m.group(1)
    }

    def again(i: int, w: str) -> bool:
        if not retried or _key(w) not in retried:
            return False
        return not (TRACEBACK_HEAD.search(w) or is_exception_line(log.lines[i]))  # raised: never a try's report

    return {i for i, w in enumerate(windows) if transient.search(w) or again(i, w)}


# Proof that the server serves: the engines' ready lines, and answered generation requests.
# What proves a server serves: ready, bound, answering, generating. Not vLLM's "Starting vLLM API server"
# (before the bind), nor a prefill alone (a scheduler that hangs before its first decode prints them)
SERVING = re.compile(
    r"The server is fired up and ready to roll|Application startup complete|Uvicorn running on|"
    r"\"POST /(?:v1/\S+|generate)\S* HTTP/[\d.]+\" 200|^Decode batch[.,]? #|Avg generation throughput: [1-9]"
)


def is_exception_line(line: str) -> bool:
    return bool(EXCEPTION_LINE.match(line)) and not line.split(":", 1)[0].endswith("Warning")


def failure_lines(log: LogText, transient: set[int]) -> list[int]:
    """The lines that show something failed (before any signature says what)."""
    benign, fatal, head = (log.scanner(p) for p in (BENIGN, FATAL, TRACEBACK_HEAD))

    def failed(i: int, line: str) -> bool:
        if i in transient or log.is_quoted(i) or benign.search(line):
            return False
        if is_exception_line(line) or head.search(line) or fatal.search(line):
            return True
        return log.levels[i] in ("ERROR", "ERR", "CRITICAL", "FATAL") and bool(line.strip())

    return [i for i, line in enumerate(log.lines) if failed(i, line)]


__all__ = [
    "EXCEPTION_LINE",
    "FRAME",
    "QUOTED",
    "SERVING",
    "TRACEBACK_HEAD",
    "TRANSIENT",
    "LogText",
    "is_continuation",
    "is_exception_line",
    "failure_lines",
    "normalize",
    "normalize_log",
    "transient_lines",
]
