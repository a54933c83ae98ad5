"""An engine's start-up, read from its own log lines: which phase it is in (download, distributed init,
weights, compile, KV cache, graph capture, warm-up), how far along when it prints a progress bar, how
long each phase took (a timeline), when it should be done judging by earlier starts on the same host (an
ETA), and when a phase has gone quiet for too long (a stall).

Pure: text and numbers in, values out. It runs in fleet's own process and, sent with the watch step
(fleet.hostscripts), on the host beside the engine, where the times are measured; standard library only,
Python 3.8.

The recognisers are built on real logs (the crash corpus, both engines, many versions) and the engines'
sources (SGLang 0.5.11 and 0.5.23; vLLM from 0.6 in the corpus to 0.32 on CPU in CI): families of lines,
not single versions' spellings. A line is read only when it looks like the engine's own (a log line, a
progress bar), so a request's text cannot move a phase; and phases only matter before the server is
ready, when no request is served.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

try:  # fleet.protocol is prepended before this file when a step is sent to a host
    READY  # noqa: B018
except NameError:  # imported as a module (fleet itself)
    from fleet.host.words import READY

# Phases in the order an engine usually goes through them. SGLang 0.5.23 may load real weights after its
# graph capture, so a timeline is a sequence of phases as they came, not a fixed order.
PHASES = ("download", "distributed", "weights", "compile", "kv_cache", "graphs", "warmup")
PHASE_TITLES = {
    "download": "downloading the model",
    "distributed": "distributed init (the ranks meeting)",
    "weights": "loading weights",
    "compile": "compiling (torch.compile, JIT kernels)",
    "kv_cache": "allocating the KV cache",
    "graphs": "capturing CUDA graphs",
    "warmup": "warming up",
}

# Phase rules as data: (phase, what the line says, pattern). A pattern is searched in the line's last
# carriage-return segment (a progress bar redraws itself with \r); its groups, when it has them, are
# the progress (done, of).
PHASE_RULES: Tuple[Tuple[str, str, str], ...] = (
    ("download", "huggingface_hub / modelscope download", r"^(Downloading|Fetching \d+ files)\b"),
    ("download", "vLLM/SGLang download of weights", r"\] (Downloading|Using model weights format)\b"),
    ("distributed", "SGLang to 0.5.22: Init torch distributed begin", r"\bInit torch distributed begin\b"),
    ("distributed", "SGLang 0.5.23: Init parallel begin (distributed/bootstrap.py)", r"\bInit parallel begin\b"),
    ("distributed", "vLLM: world_size/rank of the process group", r"\bworld_size=\d+ rank=\d+\b"),
    ("weights", "SGLang: Load weight begin", r"\bLoad weight begin\b"),
    ("weights", "vLLM: Starting to load model", r"\bStarting to load model\b"),
    (
        "weights",
        "both engines' shard progress bar",
        r"\bLoading (?:safetensors |pt )?checkpoint shards:\s*\d+%.*?\b(\d+)/(\d+)\s*\[",
    ),
    ("weights", "shard progress bar without counts", r"\bLoading (?:safetensors |pt )?checkpoint shards\b"),
    ("compile", "vLLM: Dynamo bytecode transform", r"\bDynamo bytecode transform time\b"),
    ("compile", "vLLM: compiling a graph", r"\bCompiling a graph for\b"),
    ("compile", "vLLM: torch.compile cache", r"\bUsing cache directory: .*torch.compile\b"),
    ("compile", "SGLang: DeepGEMM JIT", r"\bDeepGEMM JIT Compiling\b"),
    ("compile", "SGLang: DeepGEMM warmup bar", r"\bDeepGEMM warmup:\s*\d+%.*?\b(\d+)/(\d+)\s*\["),
    ("kv_cache", "vLLM: memory profiling", r"\bAvailable KV cache memory\b"),
    ("kv_cache", "vLLM: blocks / KV cache size", r"(# GPU blocks:|\b[GC]PU KV cache size\b)"),
    ("kv_cache", "SGLang: KV Cache is allocated / Memory pool end", r"\b(KV Cache is allocated|Memory pool end)\b"),
    ("graphs", "SGLang: Capture ... graph begin (0.5.11, 0.5.23)", r"\bCapture [\w ]*graph (begin|bs|num tokens)\b"),
    (
        "graphs",
        "both engines' capture progress bar",
        r"\bCapturing (?:batches|num tokens|CUDA graphs?(?: shapes)?)\b[^:]*:\s*\d+%.*?\b(\d+)/(\d+)\s*\[",
    ),
    ("graphs", "capture progress without counts", r"\bCapturing (?:batches|num tokens|CUDA graph)"),
    ("warmup", "SGLang: the HTTP server is up, the warm-up request runs", r"\bUvicorn running on\b"),
    ("warmup", "vLLM: the API server starts", r"\bStarting vLLM (API )?server\b"),
    ("warmup", "vLLM: warm-up of templates and inputs", r"\b(Chat template|[Mm]ulti-modal) warmup\b"),
)
_COMPILED = [(phase, re.compile(pattern)) for phase, _, pattern in PHASE_RULES]
# Lines that end a phase: the time after them belongs to it until the next phase starts.
PHASE_ENDS: Tuple[Tuple[str, str], ...] = (
    ("weights", r"\b(Load weight end|Loading weights took|Model loading took)\b"),
    ("graphs", r"\b(Capture [\w ]*graph end|Graph capturing finished)\b"),
    ("compile", r"\btorch\.compile takes\b"),
)
_ENDS = [(phase, re.compile(pattern)) for phase, pattern in PHASE_ENDS]
# Whose line it is: a log record's prefix (SGLang's "[time TPn]", vLLM's "INFO mm-dd" or "(Worker pid=)")
# or a progress bar of the engine's own. Anything else (a request echoed by a handler) is not read.
_ENGINE_LINE = re.compile(
    r"^(\[\d{4}-\d\d-\d\d[ T][\d:]+[^\]]*\]|(\([\w-]+ pid=\d+\) )?(INFO|WARNING|DEBUG) \d\d-\d\d |"
    r"\[[\d\-T:.Z]+\] INFO |INFO:? |Loading |Capturing |Downloading |Fetching |DeepGEMM |# GPU blocks)"
)
_STAMP = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z\s+")  # `docker logs --timestamps` and the like
_REQUEST = re.compile(
    r"(\"(GET|POST|PUT|DELETE) /|\bReceived? ?:? ?obj=|ReqInput\(|Received request|\bprompts?[:=])", re.I
)
# Where no earlier start on this host tells how long a phase takes: how long it may go without a new
# line of progress before it is called stalled. Generous: a 235B checkpoint loads for 5+ minutes, and a
# shard is read for minutes on a slow disk (SGLang's fast-recovery write-up, sglang#33522).
PHASE_QUIET_BOUND_S = {
    "download": 600.0,
    "distributed": 600.0,
    "weights": 900.0,
    "compile": 1200.0,
    "kv_cache": 300.0,
    "graphs": 600.0,
    "warmup": 300.0,
}
# Start-up lines are short (the longest, a progress bar, ~150 characters): a line is read for its phase
# only this far, so a 16 KiB line of a flooding log costs no more than a start-up line.
PHASE_LINE_CHARS = 512
STALL_FACTOR = 3.0  # a phase quiet for this many times its usual length (on this host) has stalled
STALL_FLOOR_S = 30.0  # ... but never sooner than this: a phase of a few seconds varies by more


def phase_of_line(line: str) -> Optional[Tuple[str, bool, Optional[int], Optional[int]]]:
    """(phase, ends it, progress done, progress of) for an engine's own start-up line; None otherwise."""
    redrawn = [part for part in line.split("\r") if part.strip()]
    text = redrawn[-1].strip() if redrawn else ""
    text = _STAMP.sub("", text)[:PHASE_LINE_CHARS]
    if not _ENGINE_LINE.match(text):
        return None
    seen = None  # type: Optional[Tuple[str, bool, Optional[int], Optional[int]]]
    for phase, pattern in _ENDS:
        if pattern.search(text):
            seen = phase, True, None, None
            break
    for phase, pattern in _COMPILED if seen is None else []:
        found = pattern.search(text)
        if found:
            done = of = None
            if found.lastindex == 2 and found.group(1).isdigit() and found.group(2).isdigit():
                done, of = int(found.group(1)), int(found.group(2))
            seen = phase, False, done, of
            break
    return None if seen is None or _REQUEST.search(text) else seen  # a request's text never moves a phase


class StartupTimeline:
    """One attempt's phases as they came: [phase, started at, ended at or None] in seconds since launch,
    the current one's progress, and when it last moved (a new line of its own, or progress)."""

    def __init__(self) -> None:
        self.spans: List[List[Any]] = []
        self.done: Optional[int] = None
        self.of: Optional[int] = None
        self.moved_at = 0.0
        self.ended = False  # the current phase printed its end line

    @property
    def phase(self) -> Optional[str]:
        return self.spans[-1][0] if self.spans else None

    def feed(self, line: str, now: float) -> bool:
        """Read one log line at `now`; True when the phase or its progress changed (worth saying)."""
        seen = phase_of_line(line)
        if seen is None:
            return False
        phase, ends, done, of = seen
        if phase != self.phase:
            if self.spans and self.spans[-1][2] is None:
                self.spans[-1][2] = now
            self.spans.append([phase, now, None])  # an end line alone (a log read from mid-way) opens it too
            self.done, self.of, self.ended, self.moved_at = done, of, ends, now
            return True
        self.moved_at = now
        if ends:
            changed, self.ended = not self.ended, True
            return changed
        if done is not None and (done, of) != (self.done, self.of):
            self.done, self.of = done, of
            return True
        return False

    def close(self, now: float) -> None:
        if self.spans and self.spans[-1][2] is None:
            self.spans[-1][2] = now

    def durations(self) -> Dict[str, float]:
        """Seconds per phase (a phase that came twice counts both times)."""
        out: Dict[str, float] = {}
        for phase, start, end in self.spans:
            if end is not None:
                out[phase] = out.get(phase, 0.0) + max(0.0, end - start)
        return out


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def well_formed(start: Mapping[str, object]) -> bool:
    """A kept start fleet wrote: a record edited by hand or cut short by a crash is no history."""
    phases, order = start.get("phases"), start.get("order", [])
    return (
        isinstance(phases, dict)
        and all(p in PHASES and _number(v) for p, v in phases.items())
        and _number(start.get("ready_s"))
        and isinstance(order, list)
        and all(p in PHASES for p in order)
    )


def typical_startup(history: Sequence[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """From earlier starts that reached ready (each {"phases": {phase: s}, "ready_s": s, "order": [..]}):
    the median of each phase and of the whole, and the latest order of phases; None without one."""
    good = [h for h in history if h.get("outcome") == READY and well_formed(h)]
    if not good:
        return None
    phases: Dict[str, float] = {}
    for name in set(p for h in good for p in h["phases"]):
        phases[name] = _median([float(h["phases"].get(name, 0.0)) for h in good])
    return {
        "phases": phases,
        "ready_s": _median([float(h.get("ready_s", 0.0)) for h in good]),
        "order": list(good[-1].get("order") or []),
        "starts": len(good),
    }


def startup_eta(
    typical: Optional[Dict[str, Any]],
    phase: Optional[str],
    in_phase_s: float,
    elapsed_s: float,
    done: Optional[int] = None,
    of: Optional[int] = None,
) -> Optional[float]:
    """Seconds until ready, judging by `typical` (typical_startup): what is left of the current phase (by
    its progress bar when it has one, else by its usual length) plus the usual length of the phases after
    it. None without history: no guess is better than a made-up one."""
    if typical is None:
        return None
    lengths: Dict[str, float] = typical["phases"]
    order: List[str] = typical["order"]
    if phase is None or phase not in order:
        return max(0.0, float(typical["ready_s"]) - elapsed_s)
    usual = lengths.get(phase, 0.0)
    if done is not None and of:
        left = usual * (1.0 - min(done, of) / float(of))
    else:
        left = max(0.0, usual - in_phase_s)
    # phases follow each other without gaps (one ends when the next begins; the last at ready)
    return left + sum(lengths.get(p, 0.0) for p in order[order.index(phase) + 1 :])


def usual_length(typical: Optional[Dict[str, Any]], phase: Optional[str]) -> Optional[float]:
    """How long `phase` usually takes on this host (typical_startup); None when it never finished here."""
    usual = (typical or {}).get("phases", {}).get(phase)
    return None if usual is None else float(usual)


def stall_bound(
    typical: Optional[Dict[str, Any]], phase: Optional[str], floor_s: float = STALL_FLOOR_S
) -> Optional[float]:
    """How long `phase` may go without a new line of its own before it has stalled: a multiple of its usual
    length on this host, or the documented bound (PHASE_QUIET_BOUND_S) when this host never finished it."""
    if phase is None:
        return None
    usual = usual_length(typical, phase)
    if usual is None:
        return PHASE_QUIET_BOUND_S.get(phase)
    return max(STALL_FACTOR * usual, floor_s)


def history_key(model: str, engine: str, version: str, gpus: Any) -> str:
    """The history a start belongs to: the same model, engine version and GPUs on this host."""
    return "%s|%s %s|%s" % (model, engine, version, ",".join(str(g) for g in gpus) if gpus else "all")


def key_parts(key: str) -> Tuple[str, str, str]:
    """history_key's (model, "engine version", GPUs) again; a key not of that shape is all model."""
    parts = key.rsplit("|", 2)
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else (key, "?", "?")


def phase_now(said: Optional[Dict[str, Any]], run_id: Any, now: float) -> Optional[Dict[str, Any]]:
    """A starting deployment's phase as a reader sees it at `now` (the host's clock): what its watcher last
    said (PHASE_FILE), aged to now. None when the watcher said nothing for this run (`run_id`)."""
    if not isinstance(said, dict) or said.get("run_id") != run_id or said.get("phase") not in PHASES:
        return None
    if not all(_number(said.get(k)) for k in ("started", "since", "updated")):
        return None
    started, since, updated = float(said["started"]), float(said["since"]), float(said["updated"])
    eta = float(said["eta_s"]) if _number(said.get("eta_s")) else None
    return {
        "phase": said["phase"],
        "title": PHASE_TITLES[said["phase"]],
        "elapsed_s": round(max(0.0, now - started), 1),
        "in_phase_s": round(max(0.0, now - since), 1),
        "done": said.get("done") if _number(said.get("done")) else None,
        "of": said.get("of") if _number(said.get("of")) else None,
        "eta_s": None if eta is None else round(max(0.0, eta - (now - updated)), 1),
        "starts": int(said["starts"]) if _number(said.get("starts")) else 0,
    }
