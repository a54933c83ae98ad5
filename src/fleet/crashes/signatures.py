"""Crash signatures as data: the packaged `signatures.yaml` and the files the operator names with
`--crashes DIR`, parsed and checked (a fix may only tune, never widen exposure or run code). Pure apart
from reading those files; no matching happens here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from fleet.plan import Fix, Version, parse_version
from fleet.plan.types import DERIVED_FIX_TEXT
from fleet.yamlfile import load_data

CATEGORIES = (
    "healthy",
    "starting",
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
    "startup_timeout",
    "garbage_output",
    "other",
    "unknown",
)
# Verdicts that are not a signature's: a signature may not claim them.
_NOT_A_SIGNATURE = {"healthy", "starting", "unknown"}
SCOPES = ("line", "cut_traceback")


@dataclass(frozen=True)
class Signature:
    id: str
    category: str
    engine: str
    pattern_texts: tuple[str, ...]
    requires_texts: tuple[str, ...]
    unless_texts: tuple[str, ...]
    versions: tuple[Version, Version] | None
    phase: str | None
    when: dict[str, Any]
    fix: Fix | None
    explanation: str
    source: str
    min_count: int = 1  # a line that means a hang only when it repeats (shm_broadcast waits)
    supporting: bool = False  # names the cause only when the log also shows a failure elsewhere
    scope: str = "line"  # "cut_traceback": matched on the frames of a traceback cut before its exception
    # the fix only where the evidence's two numbers (need, have) are within this ratio: (pattern, at most)
    fix_ratio: tuple[str, float] | None = None

    # Compiled when a log is first read, not when the knowledge is loaded: every command loads it (the
    # planner applies learned fixes), and compiling fleet's ~150 expressions cost each one ~13 ms.
    @property
    def patterns(self) -> tuple[re.Pattern[str], ...]:
        return _compile(self.pattern_texts)

    @property
    def requires(self) -> tuple[re.Pattern[str], ...]:
        return _compile(self.requires_texts)

    @property
    def unless(self) -> tuple[re.Pattern[str], ...]:
        return _compile(self.unless_texts)


@cache
def _compile(items: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    # MULTILINE: the log is searched as one text, a line (and its wrapped continuation) per text line.
    return tuple(re.compile(p, re.MULTILINE) for p in items)


# What a fix may change on its own: how the engine uses the GPUs it was given (memory, batch and graph
# sizes, kernels and backends, the parallel and speculative settings, the precision it computes in).
# Never what it exposes or what code it runs: the bind address, ports, keys, remote code, plugins,
# preloaded libraries, the model or the files it reads. Those are the playbook's to say; a knowledge file
# (the operator's or a copied one) that prescribes them is refused when it is read, whatever it matches.
TUNING_FLAG = re.compile(
    r"--(?:mem-fraction-static|gpu-memory-utilization|max-running-requests|max-num-seqs|max-total-tokens|"
    r"max-prefill-tokens|chunked-prefill-size|max-num-batched-tokens|context-length|max-model-len|"
    r"cuda-graph-[\w-]+|disable-cuda-graph|enforce-eager|disable-custom-all-reduce|disable-overlap-schedule|"
    r"attention-backend|[\w-]*attention-backend|moe-runner-backend|fp4-gemm-backend|fp8-gemm-backend|"
    r"sampling-backend|mamba-[\w-]+|speculative-(?:num-steps|num-draft-tokens|eagle-topk)|"
    r"kv-cache-dtype|dtype|enable-mixed-chunk|disable-radix-cache|enable-prefix-caching|"
    r"no-enable-prefix-caching)"
)
# Environment a fix may set: switches that only turn an engine or NCCL feature on or off (a variable
# can name a library to load or a plugin to run; these cannot).
TUNING_ENV = re.compile(r"NCCL_(?:P2P|IB|SHM|CUMEM|NVLS)_DISABLE|SGLANG_ENABLE_SPEC_V2|SGLANG_DISABLE_[A-Z_]+")
# A fix's value is a word or number: never a path, a command, or a word the launcher reads (fleet-secret:NAME)
SWITCH_VALUE = re.compile(r"[\w.-]{0,64}")


def _fix(raw: dict[str, Any] | None) -> Fix | None:
    if raw is None:
        return None
    flags = raw.get("set_flags") or {}
    env = raw.get("set_env") or {}
    for name in [*flags, *(raw.get("remove_flags") or ())]:
        if not TUNING_FLAG.fullmatch(str(name)):
            raise ValueError(
                f"a fix may change only how the engine uses its GPUs; {name} is not such a flag "
                "(a bind address, key, port, remote code or file is the playbook's to set: put it there)"
            )
    for value in [*flags.values(), *env.values()]:
        if value is not None and not SWITCH_VALUE.fullmatch(str(value)):
            raise ValueError(f"a fix's value must be a plain word or number, not {str(value)!r}")
    for name in env:
        if not TUNING_ENV.fullmatch(str(name)):
            raise ValueError(
                f"a fix may set only environment switches ({TUNING_ENV.pattern}); {name} is not one "
                "(a variable can load code: set it in the playbook's env if you mean it)"
            )
    derive = raw.get("derive")
    if derive is not None and derive not in DERIVED_FIX_TEXT:
        raise ValueError(f"a fix may derive only {', '.join(DERIVED_FIX_TEXT)}; {derive!r} is not one")
    return Fix(
        set_flags=tuple((str(k), None if v is None else str(v)) for k, v in flags.items()),
        remove_flags=tuple(str(x) for x in raw.get("remove_flags") or ()),
        set_env=tuple((str(k), str(v)) for k, v in env.items()),
        derive=derive,
    )


def _one(raw: dict[str, Any], compile_now: bool) -> Signature:
    category = raw["category"]
    if category not in CATEGORIES or category in _NOT_A_SIGNATURE:
        raise ValueError(f"unknown category {category!r}")
    scope = str(raw.get("scope", "line"))
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    fix = _fix(raw.get("fix"))
    patterns = [str(p) for p in raw["patterns"]]
    # A fix changes what runs on the host; it must come from the failure's own line, not from text
    # that merely appears somewhere in a line (a logged prompt can say anything).
    if fix is not None and not all(p.startswith("^") for p in patterns):
        raise ValueError("a signature with a fix must anchor every pattern at the start of the line (^)")
    if fix is not None and scope != "line":
        raise ValueError("a cut-traceback signature cannot carry a fix")
    texts = (
        tuple(patterns),
        tuple(str(p) for p in raw.get("requires") or ()),
        tuple(str(p) for p in raw.get("unless") or ()),
    )
    if compile_now:  # an operator's file: a bad expression is an error when it is read, naming the file
        for group in texts:
            _compile(group)
    ratio = raw.get("fix_ratio")
    if ratio is not None:
        if fix is None or re.compile(str(ratio["pattern"])).groups != 2:
            raise ValueError("fix_ratio needs a fix and a pattern with two groups (need, have)")
        ratio = (str(ratio["pattern"]), float(ratio["at_most"]))
    versions = raw.get("versions")
    lo = parse_version(versions[0]) if versions else None
    hi = parse_version(versions[1]) if versions else None
    return Signature(
        id=str(raw["id"]),
        category=category,
        engine=str(raw.get("engine", "any")),
        pattern_texts=texts[0],
        requires_texts=texts[1],
        unless_texts=texts[2],
        versions=(lo, hi) if lo and hi else None,
        phase=raw.get("phase"),
        when=dict(raw.get("when") or {}),
        fix=fix,
        explanation=str(raw["explanation"]),
        source=str(raw.get("source", "")),
        min_count=int(raw.get("min_count", 1)),
        supporting=bool(raw.get("supporting", False)),
        scope=scope,
        fix_ratio=ratio,
    )


def parse_signatures(data: Any, origin: str, *, compile_now: bool = True) -> list[Signature]:
    """`compile_now=False` only for fleet's own file, whose expressions a test compiles."""
    if not isinstance(data, list):
        raise ValueError(f"{origin}: the signature file must be a YAML list")
    out = []
    for i, raw in enumerate(data):
        try:
            out.append(_one(raw, compile_now))
        except (KeyError, TypeError, ValueError, re.error) as exc:
            raise ValueError(f"{origin}: signature #{i + 1}: {exc}") from exc
    return out


@lru_cache(maxsize=1)
def builtin_signatures() -> tuple[Signature, ...]:
    text = resources.files("fleet.crashes").joinpath("signatures.yaml").read_text(encoding="utf-8")
    return tuple(parse_signatures(load_data(text), "fleet/crashes/signatures.yaml", compile_now=False))


def load_signatures(extra_dirs: Sequence[Path] = ()) -> tuple[Signature, ...]:
    """The operator's signatures (`*.yaml` in the directories named with --crashes) first, then the
    built-in ones. Never the working directory: a checkout or a download's folder is not knowledge."""
    user: list[Signature] = []
    for d in extra_dirs:
        for path in sorted(d.glob("*.yaml")):
            user += parse_signatures(load_data(path.read_text(encoding="utf-8")), str(path))
    return (*user, *builtin_signatures())


def known_fixes(signatures: Sequence[Signature]) -> dict[str, Fix]:
    """Signature id → the fix the knowledge base prescribes today (first definition wins, as in matching)."""
    first: dict[str, Fix | None] = {}
    for s in signatures:
        first.setdefault(s.id, s.fix)
    return {k: v for k, v in first.items() if v is not None}


def knowledge_diff(
    signatures: Sequence[Signature], engine: str, now: Version | None, then: Version | None
) -> list[str]:
    """The known crashes, fixed or new, between two versions of `engine` (an upgrade preview): each
    signature kept to a version range that holds one version and not the other. Pure."""

    def holds(sig: Signature, v: Version | None) -> bool:
        return v is not None and sig.versions is not None and sig.versions[0] <= v <= sig.versions[1]

    out = []
    for sig in signatures:
        if sig.versions is None or sig.engine not in (engine, "any") or holds(sig, now) == holds(sig, then):
            continue
        lo, hi = (".".join(map(str, v)) for v in sig.versions)
        span = f"{lo} and later" if sig.versions[1] >= (9, 9, 9) else f"{lo} to {hi}"
        out.append(f"{'+' if holds(sig, then) else '-'} known crash {sig.id} ({span}): {sig.explanation}")
    return out
