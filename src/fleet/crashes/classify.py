"""Crash knowledge base: signatures (data) + `diagnose(log) -> Diagnosis` + `decide(...) -> next action`.

Pure: no clocks, no I/O beyond reading the packaged YAML once. `healthy` needs positive evidence (a
ready line or answered generation requests) and no failure; a log with neither is `starting`; a log
with a failure that no signature explains is `unknown`, with its evidence lines. Signatures are tried
in order (the root cause before its symptoms), on normalised lines (`logtext`). The relaunch policy
decides first and the deploy loop acts (tenacity-style): a fix is applied at most once, the same
signature after its fix gives up, an unknown failure gives up at once, and attempts are bounded.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fleet.crashes.fitted import FITTED
from fleet.crashes.logtext import (
    FRAME,
    SERVING,
    TRACEBACK_HEAD,
    LogText,
    failure_lines,
    is_exception_line,
    normalize_log,
    transient_lines,
)
from fleet.crashes.signatures import (
    Signature,
    builtin_signatures,
)
from fleet.plan import Fix, Version, args_dict

# Said among an attempt's lines by the deploy loop when /health answered before any ready line (an engine
# run at --log-level warning prints none): from there on a client may have written to the log.
ANSWERED_HEALTH = "[fleet] the server answered /health: it takes requests from here on"
# The server took requests: its socket listens, or one was answered.
# (vLLM hands uvicorn a socket bound long before, and uvicorn then never says "Uvicorn running on")
ACCEPTING = re.compile(
    r'Uvicorn running on|The server is fired up and ready to roll|Starting vLLM (?:API )?server|HTTP/[\d.]+" \d{3}|'
    + "^"
    + re.escape(ANSWERED_HEALTH)
)
# A client's generation request answered (any status): the server ran and took requests. Not /health,
# which a supervisor asks while a start goes on; SGLang's warm-up request is logged only once it is done.
TOOK_REQUEST = re.compile(r'"(?:POST|GET) /(?:v1/|generate)\S* HTTP/[\d.]+" \d{3}')
# vLLM's engine core had finished its start: a traceback through the loop it serves from (entered once the
# weights, KV cache and graphs are in place), or its front end losing it (its output handler exists only
# once the engine core said it was ready). Wherever the log shows it, often after the failure it follows
# from, every failure is the running server's, though no request was logged (an excerpt without its
# access log): an OOM there is no start-up's.
ENGINE_LOOP = re.compile(
    r"\bin (?:run_busy_loop|_process_engine_step|step_with_batch_queue)\b|AsyncLLM output_handler failed"
)
# vLLM's "Starting vLLM API server on http://..." comes before its routes and before the socket is bound
# (a port in use, or a hang, can follow it): it bounds what a start's fix reads (ACCEPTING), it proves nothing
READY_PATTERNS = (
    re.compile(r"The server is fired up and ready to roll!"),
    re.compile(r"Application startup complete\."),
)


@dataclass(frozen=True)
class LogContext:
    """What the diagnosis may condition on: engine, version, model traits, GPU, the launched flags."""

    engine: str | None = None
    version: Version | None = None
    hybrid: bool | None = None
    nvfp4: bool | None = None
    moe: bool | None = None
    sm: int | None = None
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    category: str
    signature: str | None
    explanation: str
    fix: Fix | None
    evidence: tuple[str, ...]
    source: str = ""
    basis: str = ""  # how sure: which signature, the frames of a cut traceback, or a generic error

    @property
    def found_failure(self) -> bool:
        """The log shows something wrong (not a healthy server, nor one still starting)."""
        return self.category not in ("healthy", "starting")

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "signature": self.signature,
            "explanation": self.explanation,
            "basis": self.basis,
            "fix": self.fix.describe() if self.fix else None,
            "evidence": list(self.evidence),
        }


def _conditions_hold(sig: Signature, ctx: LogContext) -> bool:
    if sig.engine != "any" and ctx.engine is not None and sig.engine != ctx.engine:
        return False
    if sig.versions and ctx.version is not None and not (sig.versions[0] <= ctx.version <= sig.versions[1]):
        return False
    w = sig.when
    for trait in ("hybrid", "nvfp4", "moe"):
        if trait in w and getattr(ctx, trait) is not None and bool(w[trait]) != getattr(ctx, trait):
            return False
    if ("sm_min" in w or "sm_max" in w) and ctx.sm is None and sig.fix is not None:
        return False  # a fix for one GPU family is never guessed for a GPU not known (B300 is not SM120)
    if ctx.sm is not None and (
        "sm_min" in w and ctx.sm < int(w["sm_min"]) or "sm_max" in w and ctx.sm > int(w["sm_max"])
    ):
        return False
    args = args_dict(list(ctx.argv))
    for name, value in dict(w.get("flag") or {}).items():
        if name not in args or (value is not None and args[name] != str(value)):
            return False
    for name, value in dict(w.get("not_flag") or {}).items():
        if name in args and (value is None or args[name] == str(value)):
            return False
    return True


@lru_cache(maxsize=1024)
def _one_pass(patterns: tuple[re.Pattern[str], ...]) -> tuple[re.Pattern[str], ...]:
    """A signature's patterns as one alternation: one scan of the log instead of one per pattern."""
    if len(patterns) < 2:
        return patterns
    try:
        return (re.compile("|".join(f"(?:{p.pattern})" for p in patterns), re.MULTILINE),)
    except re.error:  # a pattern with global flags, (?i)…, cannot be joined: scanned on its own
        return patterns


class _Searchable:
    """The log as one text of windows (a line and its wrapped continuation), searched per signature
    in one regex pass instead of one call per line, and in a long log only when the words the pattern
    cannot match without are in it (fleet.crashes.literals)."""

    def __init__(self, log: LogText) -> None:
        self.log = log
        self.starts: list[int] = []
        pos = 0
        for w in log.windows:
            self.starts.append(pos)
            pos += len(w) + 1
        self.text = log.windows_text.text
        # what a signature's `requires` and `unless` read: the engine's own lines (an echoed client's text
        # neither completes a signature nor rules one out)
        self.own_text = (
            "\n".join("" if log.is_echoed(i) else w for i, w in enumerate(log.windows))
            if any(log.echoed)
            else self.text
        )

    def may_match(self, pattern: re.Pattern[str]) -> bool:
        return self.log.scanner(pattern, in_windows=True).may_match

    def hits(self, patterns: Sequence[re.Pattern[str]], only: range | None = None) -> list[int]:
        found: set[int] = set()
        # each pattern's own words decide whether it is searched: joined first, a signature whose
        # alternation holds one common word ("NCCL") would scan a long log with every branch
        for p in _one_pass(tuple(p for p in patterns if self.may_match(p))):
            for m in p.finditer(self.text):
                i = bisect.bisect_right(self.starts, m.start()) - 1
                if only is None or i in only:
                    found.add(i)
        return sorted(found)

    def any(self, patterns: Sequence[re.Pattern[str]]) -> bool:
        return any(self.may_match(p) and p.search(self.own_text) for p in patterns)


def _in_phase(
    sig: Signature,
    log: LogText,
    hits: list[int],
    ready_at: int | None,
    accepting_at: int | None,
    running_at: int | None,
    last_served: int | None,
) -> list[int]:
    """The hits `sig` may stand on: a fix's only from lines the engine logged as failures, and each only
    from the part of the log its phase names (start-up: before the server was ready, or took requests for
    a fix; runtime: after it was ready or took a request, or after the last request it answered for a fix)."""
    if sig.fix is not None:  # a failure the engine reports is logged as one, never at INFO (a request's echo is)
        hits = [i for i in hits if log.levels[i] not in ("INFO", "DEBUG") and not log.is_echoed(i)]
    if sig.phase == "startup":
        before = ready_at if sig.fix is None else accepting_at
        hits = [i for i in hits if before is None or i < before]
    if sig.phase == "runtime":
        after = running_at if sig.fix is None else last_served
        hits = [i for i in hits if after is not None and i > after]
    return hits


def _took_requests_at(log: LogText) -> int | None:
    took_request = log.scanner(TOOK_REQUEST)
    return next((i for i in range(len(log.lines)) if _own_line(log, i) and took_request.search(log.lines[i])), None)


def _engine_looped(log: LogText) -> bool:
    in_loop = log.scanner(ENGINE_LOOP)
    return any(_own_words(log, i) and in_loop.search(line) for i, line in enumerate(log.lines))


def _first(*at: int | None) -> int | None:
    return min((i for i in at if i is not None), default=None)


def _fix_within(sig: Signature, lines: list[str]) -> bool:
    """Whether `sig`'s fix can close the gap its evidence states (its fix_ratio; none: it can)."""
    if sig.fix_ratio is None:
        return True
    pattern, at_most = sig.fix_ratio
    for line in lines:
        m = re.search(pattern, line)
        if m:  # a number cut off (a pasted excerpt): the gap is not known, and no fix is guessed
            need, have = float(m.group(1)), float(m.group(2) or 0)
            return have > 0 and need / have <= at_most
    return True  # the signature's other wordings (no numbers): its fix as it gives it


def _cut_traceback(log: LogText) -> range | None:
    """The frames at the end of a traceback that was cut before its exception line, if the log ends so and
    no exception line of the engine's says more (what the frames point at counts only then)."""
    if any(is_exception_line(x) for i, x in enumerate(log.lines) if _own_words(log, i)):
        return None
    frames = [i for i, line in enumerate(log.lines) if FRAME.match(line) and _own_words(log, i)]
    if not frames:
        return None
    last = frames[-1]
    if any(is_exception_line(x) for i, x in enumerate(log.lines[last + 1 :], last + 1) if _own_words(log, i)):
        return None
    heads = [i for i in range(last) if TRACEBACK_HEAD.search(log.lines[i]) or is_exception_line(log.lines[i])]
    return range(heads[-1] + 1 if heads else 0, len(log.lines))


def diagnose(
    lines: Sequence[str], ctx: LogContext = LogContext(), signatures: Sequence[Signature] | None = None
) -> Diagnosis:
    """Classify an engine log. Only positive evidence of serving, with no failure, is `healthy`."""
    sigs = builtin_signatures() if signatures is None else signatures
    log = normalize_log(lines)
    n = len(log.lines)
    ready = [log.scanner(p) for p in READY_PATTERNS]
    ready_at = next(
        (i for i, line in enumerate(log.lines) if _own_words(log, i) and any(p.search(line) for p in ready)), None
    )
    transient = transient_lines(log)
    failures = failure_lines(log, transient)
    # a client can write to the log once the server accepts requests (uvicorn binds after "Application
    # startup complete"): a fix for a start's failure comes from before that
    accepting, serving = log.scanner(ACCEPTING), log.scanner(SERVING)
    accepting_at = next((i for i in range(n) if _own_line(log, i) and accepting.search(log.lines[i])), None)
    served = [i for i in range(n) if _own_line(log, i) and serving.search(log.lines[i])]
    loop_at = -1 if _engine_looped(log) else None  # the start was over before anything the log shows
    running_at = _first(ready_at, _took_requests_at(log), loop_at)
    # the last sign the server lived: what explains its end, and so a fix, comes after it
    last_served = max(served, default=running_at)
    cut = _cut_traceback(log)
    search = _Searchable(log)
    frame_hints: list[tuple[int, Signature]] = []
    warned: Diagnosis | None = None  # the first signature only warnings match: an error elsewhere says more
    for sig in sigs:
        if not _conditions_hold(sig, ctx):
            continue
        if sig.scope == "cut_traceback":
            if cut is None:
                continue
            hits = search.hits(sig.patterns, only=cut)
        else:
            hits = [i for i in search.hits(sig.patterns) if i not in transient]
        hits = _in_phase(
            sig, log, hits, _first(ready_at, loop_at), _first(accepting_at, loop_at), running_at, last_served
        )
        if len(hits) < sig.min_count:
            continue
        if sig.requires and not all(search.any((r,)) for r in sig.requires):
            continue
        if sig.unless and search.any(sig.unless):
            continue
        if sig.supporting and not (set(failures) - set(hits)) and cut is None:
            continue
        if sig.scope == "cut_traceback":
            frame_hints.append((hits[-1], sig))
            continue
        basis = f"signature {sig.id}"
        fix = sig.fix if _fix_within(sig, [log.lines[i] for i in hits]) else None
        if fix is not None and fix.derive in FITTED:  # its value from the evidence, now
            fix = FITTED[fix.derive]([log.lines[i] for i in hits])
        found = Diagnosis(sig.category, sig.id, sig.explanation, fix, _evidence(log, hits), sig.source, basis)
        if not all(log.levels[i] in WARNINGS for i in hits):
            return found
        warned = warned or found
    if warned is not None:
        return warned
    if frame_hints:  # the deepest frame a hint recognises says most about where it failed
        deepest, sig = max(frame_hints, key=lambda h: h[0])
        basis = f"signature {sig.id}, from the frames of a traceback cut before its exception line"
        evidence = tuple(log.lines[i].strip() for i in range(max(deepest - 2, 0), deepest + 1))
        return Diagnosis(sig.category, sig.id, sig.explanation, None, evidence, sig.source, basis)
    if failures or cut is not None:
        return _unknown(log, failures, cut)
    if served:
        return Diagnosis("healthy", None, "the server is ready or serving, with no failure in the log", None, ())
    return Diagnosis(
        "starting",
        None,
        "no failure in the log, and nothing in it shows the server ready or serving (no ready line, "
        "no answered generation request)",
        None,
        tuple(x for x in log.lines[-3:] if x.strip()),
    )


# an engine that warns (or says it waits) goes on: what it logged so explains a crash only alone, never
# over an error it logged (a worker that died, then minute after minute of waiting for it)
WARNINGS = ("WARNING", "WARN", "INFO", "DEBUG")

_ACCESS_LINE = re.compile(r'^\S+:\d+ - "')


def _own_words(log: LogText, i: int) -> bool:
    """Whether line i is surely the server's: neither a client's text nor what may go on from one."""
    return not (log.is_quoted(i) or log.is_echoed(i))


def _own_line(log: LogText, i: int) -> bool:
    """The server's own words (_own_words), and the access log's line itself (the request's path is the
    client's, the status after it the server's)."""
    return _own_words(log, i) or bool(_ACCESS_LINE.match(log.lines[i]))


_SYMPTOM = re.compile(
    r"EngineDeadError|Engine core initialization failed|See root cause above|See stack trace|RayTaskError|"
    r"ChildProcessError|Received sigquit|WorkerDied"
)


def _unknown(log: LogText, failures: list[int], cut: range | None) -> Diagnosis:
    # An exception that only reports another process's death is a symptom, not "what failed".
    exceptions = [i for i in failures if is_exception_line(log.lines[i]) and not _SYMPTOM.search(log.lines[i])]
    if cut is not None and not exceptions:
        frames = [log.lines[i].strip() for i in cut if FRAME.match(log.lines[i])]
        return Diagnosis(
            "unknown",
            None,
            "the log ends inside a traceback, before its exception line; the last frames show where it failed",
            None,
            tuple([*[log.lines[i] for i in failures[-1:]], *frames[-3:]]),
            basis="no signature: a traceback cut before its exception line",
        )
    pick = sorted(set(failures[:1] + exceptions[-2:] + failures[-2:]))
    evidence = tuple(log.window(i) for i in pick)
    if exceptions:
        # The error is all there, and it is none of the known families: outside them, by definition.
        return Diagnosis(
            "other",
            None,
            "a failure outside fleet's known categories; the exception line says what failed",
            None,
            evidence,
            basis="no signature: generic error in the log (its exception line is complete)",
        )
    return Diagnosis(
        "unknown",
        None,
        "the log shows a failure but not what it was (no exception line and no known error text)",
        None,
        evidence,
        basis="no signature: generic error lines in the log",
    )


def _evidence(log: LogText, hits: list[int]) -> tuple[str, ...]:
    """The matching lines, with the exception line that ends their traceback when there is one."""
    keep: list[str] = []
    for i in hits[:3]:
        if log.window(i) not in keep:
            keep.append(log.window(i))
        for j in range(i + 1, min(i + 40, len(log.lines))):
            if is_exception_line(log.lines[j]):
                if log.window(j) not in keep:
                    keep.append(log.window(j))
                break
    return tuple(keep)


def traceback_of(lines: Sequence[str]) -> list[str]:
    """The whole (first) traceback in a log, as lines; the last 50 lines when there is none."""
    log = normalize_log(lines)
    norm = [line for i, line in enumerate(log.lines) if not log.is_quoted(i)]
    start = next((i for i, line in enumerate(norm) if "Traceback (most recent call last)" in line), None)
    if start is None:
        return norm[-50:]
    end = start + 1
    while end < len(norm) and (norm[end].startswith((" ", "\t")) or norm[end] == "" or end == start + 1):
        end += 1
    return norm[start : min(end + 1, len(norm))]


# --- the relaunch policy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Relaunch:
    fix: Fix
    signature: str
    reason: str


@dataclass(frozen=True)
class GiveUp:
    reason: str


def decide(diagnosis: Diagnosis, applied: Sequence[str], attempt: int, max_attempts: int) -> Relaunch | GiveUp:
    """Pure relaunch policy. `applied`: signature ids whose fix this deploy already applied."""
    if not diagnosis.found_failure:
        return GiveUp("the engine stopped without an error in its log")
    if diagnosis.signature is None or diagnosis.category == "unknown":
        return GiveUp("unknown failure: fleet does not relaunch what it cannot explain")
    if diagnosis.fix is None:
        return GiveUp(f"known failure without an automatic fix: {diagnosis.explanation}")
    if diagnosis.signature in applied:
        return GiveUp(f"{diagnosis.signature} came back after its fix was applied")
    undone = _undone_by(diagnosis.signature, diagnosis.fix, applied)
    if undone is not None:
        return GiveUp(
            f"{diagnosis.signature} would move the memory fraction back where {undone}'s fix in this deploy moved "
            f"it from: no fraction avoids both ({diagnosis.explanation})"
        )
    if attempt >= max_attempts:
        return GiveUp(f"attempt {attempt}/{max_attempts} failed; no attempts left")
    return Relaunch(diagnosis.fix, diagnosis.signature, diagnosis.explanation)


# The memory fraction moved one way by a fix, then the other way by the next: the two failures (a KV pool
# too small, then out of memory) would follow each other until the attempts ran out. Not after smaller
# graphs, which also freed the memory the capture took: a larger fraction may then fit.
_FRACTION_UP, _FRACTION_DOWN = {"raise_mem_fraction"}, {"lower_mem_fraction", "fit_free_memory"}


def _undone_by(signature: str, fix: Fix, applied: Sequence[str]) -> str | None:
    """The signature among `applied` (fleet's own) whose fix moved the memory fraction the other way."""
    known = {s.id: s for s in builtin_signatures()}
    derive = (known[signature].fix or fix).derive if signature in known else fix.derive  # a fitted one's own
    opposite = _FRACTION_DOWN if derive in _FRACTION_UP else _FRACTION_UP if derive in _FRACTION_DOWN else set()
    return next((i for i in applied if i in known and (known[i].fix or Fix()).derive in opposite), None)
