"""`make bench` section 9: what watching an engine's start-up costs the host's watcher.

Every log line the watcher reads is also read for a start-up phase (fleet.startup), and each phase change
(or a progress bar's move, at most once a second) is left in phase.json for `fleet status`. Measured here
in the watcher's own code, on the real logs of the crash corpus (both engines, many versions) and on a
start-up's worth of tqdm redraws, against the floor of the same lines only split and decoded (what the
watcher did before it read phases).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fleet.host.startup import StartupWatch, remember_startup
from fleet.startup import history_key

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "crash-logs" / "cases"


def corpus_lines() -> list[str]:
    """Every line of every real log of the corpus (both engines, many versions), in order."""
    lines: list[str] = []
    for log in sorted(CORPUS.rglob("*.log")) if CORPUS.is_dir() else []:
        lines += log.read_text(errors="replace").split("\n")
    return lines


def redraws(shards: int = 64, captures: int = 36) -> list[str]:
    """A big start's progress bars as the watcher gets them: a redraw per shard and per capture size."""
    out = [f"Loading safetensors checkpoint shards: {100 * i // shards:3d}% Completed | {i}/{shards} [00:10<00:30]"
           for i in range(shards + 1)]  # fmt: skip
    out += [f"Capturing batches (bs={4 * (captures - i)} avail_mem=11.18 GB): {100 * i // captures:3d}%|#  | "
            f"{i}/{captures} [00:03<00:06]" for i in range(captures + 1)]  # fmt: skip
    return out


def per_line_us(fn: Callable[[str, float], object], lines: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        for i, text in enumerate(lines):
            fn(text, 1000.0 + i * 0.01)
        times.append((time.perf_counter() - began) / max(1, len(lines)) * 1e6)
    return times


def watch(state_dir: str, with_history: bool) -> StartupWatch:
    key = history_key("/models/q", "sglang", "0.5.11", (0, 1))
    os.makedirs(os.path.join(state_dir, "deployments", "q"), exist_ok=True)
    if with_history:
        start = {"outcome": "ready", "ready_s": 100.0, "order": ["weights", "graphs"]}
        remember_startup(state_dir, key, {**start, "phases": {"weights": 80.0, "graphs": 20.0}})
    return StartupWatch({"state_dir": state_dir, "startup_key": key, "deployment": "q", "run_id": "r"}, 1000.0)


def bench_startup(runs: int, title: str) -> list[str]:
    lines = corpus_lines()
    bars = redraws()
    if not lines:
        return [title, "", f"not measured: no crash corpus at {CORPUS}", ""]

    def floor(text: str, now: float) -> object:  # what the watcher did with a line before phases: decode it
        return text.encode("utf-8").decode("utf-8", "replace")

    rows = [title, "| what | µs per line, median | min | max | vs floor |", "| --- | --- | --- | --- | --- |"]
    with tempfile.TemporaryDirectory() as d:
        base = statistics.median(per_line_us(floor, lines, runs))
        measured = {}
        for name, fn in (
            ("a line decoded only, as before phases were read (floor)", floor),
            ("read for a phase, no start of this model here yet", watch(d + "/a", False).line),
            ("read for a phase, with this host's history (an ETA computed)", watch(d + "/b", True).line),
        ):
            xs = per_line_us(fn, lines, runs)
            measured[name] = statistics.median(xs)
            rows.append(
                f"| {name} | {measured[name]:.2f} | {min(xs):.2f} | {max(xs):.2f} | {measured[name] / base:.1f}x |"
            )
        published = watch(d + "/c", True)
        began = time.perf_counter()
        for i, text in enumerate(bars):  # a redraw every 10 ms: phase.json written at a new phase, else 1/s
            published.line(text, 1000.0 + i * 0.01)
        bar_ms = (time.perf_counter() - began) * 1e3
    total_ms = max(measured.values()) * len(lines) / 1e3  # the dearer of the two ways a line is read
    rows += [
        "",
        f"The corpus: {len(lines)} lines of {len(list(CORPUS.rglob('*.log')))} real logs. Reading all of them for "
        f"phases costs the watcher {total_ms:.0f} ms in all; a start's {len(bars)} progress-bar redraws, with "
        f"phase.json written for `fleet status`, cost {bar_ms:.1f} ms. Against a start of minutes this is "
        "nothing; on the simulated fleet (engine start ~instant) it is inside the deploy rows of section 1.",
        "",
    ]
    return rows
