"""Crash knowledge base: signatures (data) + `diagnose(log) -> Diagnosis` + `decide(...) -> next action`.

Pure: no clocks, no I/O beyond reading the packaged YAML once. Logs arrive messy (timestamps,
`[TP3]`, `(EngineCore pid=N)`, docker-compose prefixes, flattened tracebacks); `normalize` strips
that before any pattern is tried. The relaunch policy decides first and the deploy loop acts
(tenacity-style): a fix is applied at most once, the same signature after its fix gives up, an
unknown failure gives up at once, and attempts are bounded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from fleet.plan import Fix, Version, args_dict, parse_version
from fleet.yamlfile import load_data

CATEGORIES = (
    "healthy",
    "spec_decode_hybrid_mamba",
    "invalid_flags",
    "cuda_oom_startup",
    "kv_cache_oom",
    "cuda_graph_capture",
    "port_in_use",
    "nccl_p2p",
    "unsupported_arch_or_quant",
    "jit_compile",
    "unknown_architecture",
    "model_files_missing",
    "dependency_mismatch",
    "driver_mismatch",
    "illegal_memory_access",
    "killed_by_signal",
    "worker_timeout",
    "garbage_output",
    "unknown",
)
READY_PATTERNS = (
    re.compile(r"The server is fired up and ready to roll!"),
    re.compile(r"Starting vLLM (API )?server on http"),
    re.compile(r"Application startup complete\."),
)
SGLANG_READY = re.compile(r"The server is fired up and ready to roll!")


@dataclass(frozen=True)
class Signature:
    id: str
    category: str
    engine: str
    patterns: tuple[re.Pattern[str], ...]
    requires: tuple[re.Pattern[str], ...]
    unless: tuple[re.Pattern[str], ...]
    versions: tuple[Version, Version] | None
    phase: str | None
    when: dict[str, Any]
    fix: Fix | None
    explanation: str
    source: str


@dataclass(frozen=True)
class Context:
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

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "signature": self.signature,
            "explanation": self.explanation,
            "fix": self.fix.describe() if self.fix else None,
            "evidence": list(self.evidence),
        }


_PREFIXES = [
    re.compile(r"^\x1b\[[0-9;]*m"),
    re.compile(r"^[\w.-]+(?:[-_]\d+)?\s+\|\s?"),  # docker-compose "service_1  | "
    re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s*"),  # ISO timestamp
    re.compile(
        r"^\((?:APIServer|EngineCore(?:_DP\d+)?|Worker(?:_\w+)?|VllmWorker[\w-]*|pid=\d+|[\w:]+ pid=\d+)[^)]*\)\s*"
    ),
    re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?(?: (?:TP|DP|PP|EP)\d+)*\]\s*"),  # SGLang
    re.compile(r"^\[(?:TP|DP|PP|EP)\d+\]\s*"),
    re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]+\]\s*"),  # vLLM
]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def normalize(lines: Iterable[str]) -> list[str]:
    """Strip colour codes and per-line prefixes; unflatten tracebacks logged as one line with '\\n'."""
    out: list[str] = []
    for raw in lines:
        text = _ANSI.sub("", raw.rstrip("\r\n"))
        pieces = text.split("\\n") if "\\n" in text and "Traceback" in text else [text]
        for piece in pieces:
            for _ in range(4):  # prefixes nest: compose | timestamp (EngineCore pid=1) ...
                before = piece
                for p in _PREFIXES:
                    piece = p.sub("", piece, count=1)
                if piece == before:
                    break
            out.append(piece)
    return out


def _compile(items: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in items)


def _fix(raw: dict[str, Any] | None) -> Fix | None:
    if raw is None:
        return None
    flags = raw.get("set_flags") or {}
    env = raw.get("set_env") or {}
    return Fix(
        set_flags=tuple((str(k), None if v is None else str(v)) for k, v in flags.items()),
        remove_flags=tuple(str(x) for x in raw.get("remove_flags") or ()),
        set_env=tuple((str(k), str(v)) for k, v in env.items()),
        derive=raw.get("derive"),
    )


def parse_signatures(data: Any, origin: str) -> list[Signature]:
    if not isinstance(data, list):
        raise ValueError(f"{origin}: the signature file must be a YAML list")
    out = []
    for i, raw in enumerate(data):
        try:
            category = raw["category"]
            if category not in CATEGORIES:
                raise ValueError(f"unknown category {category!r}")
            versions = raw.get("versions")
            lo = parse_version(versions[0]) if versions else None
            hi = parse_version(versions[1]) if versions else None
            out.append(
                Signature(
                    id=str(raw["id"]),
                    category=category,
                    engine=str(raw.get("engine", "any")),
                    patterns=_compile(raw["patterns"]),
                    requires=_compile(raw.get("requires") or ()),
                    unless=_compile(raw.get("unless") or ()),
                    versions=(lo, hi) if lo and hi else None,
                    phase=raw.get("phase"),
                    when=dict(raw.get("when") or {}),
                    fix=_fix(raw.get("fix")),
                    explanation=str(raw["explanation"]),
                    source=str(raw.get("source", "")),
                )
            )
        except (KeyError, TypeError, ValueError, re.error) as exc:
            raise ValueError(f"{origin}: signature #{i + 1}: {exc}") from exc
    return out


@lru_cache(maxsize=1)
def builtin_signatures() -> tuple[Signature, ...]:
    text = resources.files("fleet.crashes").joinpath("signatures.yaml").read_text(encoding="utf-8")
    return tuple(parse_signatures(load_data(text), "fleet/crashes/signatures.yaml"))


def load_signatures(extra_dirs: Sequence[Path] = ()) -> tuple[Signature, ...]:
    """User signatures (`crashes/*.yaml` in the project directory) first, then the built-in ones."""
    user: list[Signature] = []
    for d in extra_dirs:
        for path in sorted(d.glob("*.yaml")):
            user += parse_signatures(load_data(path.read_text(encoding="utf-8")), str(path))
    return (*user, *builtin_signatures())


def _conditions_hold(sig: Signature, ctx: Context) -> bool:
    if sig.engine != "any" and ctx.engine is not None and sig.engine != ctx.engine:
        return False
    if sig.versions and ctx.version is not None and not (sig.versions[0] <= ctx.version <= sig.versions[1]):
        return False
    w = sig.when
    for trait in ("hybrid", "nvfp4", "moe"):
        if trait in w and getattr(ctx, trait) is not None and bool(w[trait]) != getattr(ctx, trait):
            return False
    if ctx.sm is not None and (
        "sm_min" in w and ctx.sm < int(w["sm_min"]) or "sm_max" in w and ctx.sm > int(w["sm_max"])
    ):
        return False
    if "flag" in w:
        args = args_dict(list(ctx.argv))
        for name, value in dict(w["flag"]).items():
            if name not in args or (value is not None and args[name] != str(value)):
                return False
    return True


def diagnose(
    lines: Sequence[str], ctx: Context = Context(), signatures: Sequence[Signature] | None = None
) -> Diagnosis:
    """Classify an engine log. A clean startup or steady serving is `healthy`, never a crash."""
    sigs = builtin_signatures() if signatures is None else signatures
    norm = normalize(lines)
    ready_at = next((i for i, line in enumerate(norm) if any(p.search(line) for p in READY_PATTERNS)), None)
    for sig in sigs:
        if not _conditions_hold(sig, ctx):
            continue
        hits = [i for i, line in enumerate(norm) if any(p.search(line) for p in sig.patterns)]
        if sig.phase == "startup" and ready_at is not None:
            hits = [i for i in hits if i < ready_at]
        if sig.phase == "runtime":
            hits = [i for i in hits if ready_at is not None and i > ready_at]
        if not hits:
            continue
        if sig.requires and not all(any(r.search(line) for line in norm) for r in sig.requires):
            continue
        if any(u.search(line) for u in sig.unless for line in norm):
            continue
        return Diagnosis(sig.category, sig.id, sig.explanation, sig.fix, _evidence(norm, hits), sig.source)
    tb = [i for i, line in enumerate(norm) if line.startswith("Traceback (most recent call last)")]
    errors = [i for i, line in enumerate(norm) if re.match(r"^\w*(Error|Exception)\b.*:", line)]
    if tb or errors:
        return Diagnosis(
            "unknown",
            None,
            "a failure that matches no known signature",
            None,
            _evidence(norm, (tb + errors)[:1] + errors[-1:]),
        )
    return Diagnosis(
        "healthy",
        None,
        "clean startup or steady serving" if ready_at is not None else "no failure in the log",
        None,
        (),
    )


def _evidence(norm: list[str], hits: list[int]) -> tuple[str, ...]:
    """The matching lines, with the exception line that ends their traceback when there is one."""
    keep: list[str] = []
    for i in hits[:3]:
        if norm[i] not in keep:
            keep.append(norm[i])
        for j in range(i + 1, min(i + 40, len(norm))):
            if re.match(r"^[\w.]*(Error|Exception)\b", norm[j]) or norm[j].startswith("AssertionError"):
                if norm[j] not in keep:
                    keep.append(norm[j])
                break
    return tuple(keep)


def traceback_of(lines: Sequence[str]) -> list[str]:
    """The whole (first) traceback in a log, as lines; the last 50 lines when there is none."""
    norm = normalize(lines)
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
    if diagnosis.category == "healthy":
        return GiveUp("the engine stopped without an error in its log")
    if diagnosis.signature is None or diagnosis.category == "unknown":
        return GiveUp("unknown failure: fleet does not relaunch what it cannot explain")
    if diagnosis.fix is None:
        return GiveUp(f"known failure without an automatic fix: {diagnosis.explanation}")
    if diagnosis.signature in applied:
        return GiveUp(f"{diagnosis.signature} came back after its fix was applied")
    if attempt >= max_attempts:
        return GiveUp(f"attempt {attempt}/{max_attempts} failed; no attempts left")
    return Relaunch(diagnosis.fix, diagnosis.signature, diagnosis.explanation)
