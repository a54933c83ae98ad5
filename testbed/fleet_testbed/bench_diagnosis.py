"""`make bench`, section 12: diagnosing a long log, the step between a crash and its relaunch.

A start with NCCL_DEBUG=INFO on 8 GPUs writes thousands of lines before it fails; fleet keeps up to
20,000 of an attempt's lines (fleet.control.outcomes) and diagnoses them. Measured in this process, on
logs of NCCL's set-up lines ending in CUDA's out-of-memory error: the classifier as it runs (the floor
of the section's ratios), and with every pattern searched over every line, as before it looked for the
words each pattern needs first (fleet.crashes.literals)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fleet.crashes import LogContext, diagnose, literals

Row = Callable[..., str]
Timed = Callable[[Callable[[], object], int], list[float]]


def nccl_log(n: int) -> list[str]:
    """`n` lines of NCCL's ring set-up on 8 ranks, then the error a start fails with."""
    lines = [
        f"[2026-12-06 10:00:00 TP{i % 8}] node1:1234:{i}:5678 [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : "
        f"{i % 8}[{i % 8}] -> {(i + 1) % 8}[{(i + 1) % 8}] via P2P/CUMEM/read"
        for i in range(n)
    ]
    return [*lines, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]


@contextmanager
def every_pattern_run() -> Iterator[None]:
    """The classifier without its word check: every pattern searched over every line and window."""
    was = literals.PREFILTER_FROM_CHARS
    literals.PREFILTER_FROM_CHARS = 1 << 62  # no log is long enough to be checked for words first
    try:
        yield
    finally:
        literals.PREFILTER_FROM_CHARS = was


def bench_diagnosis(
    row: Row, timed: Timed, runs: int, title: str, sizes: tuple[int, ...] = (200, 2000, 20000)
) -> list[str]:
    diagnose(["warm-up"], LogContext(engine="sglang"))  # the signatures compiled once, as in a deploy

    def seconds(lines: list[str]) -> list[float]:
        def once() -> None:
            assert diagnose(lines, LogContext(engine="sglang")).signature == "cuda-oom-startup"

        return timed(once, runs)

    out = [title, "", "| what | median | min | max | vs fleet's | |", "| --- | --- | --- | --- | --- | --- |"]
    for n in sizes:
        lines = nccl_log(n)
        now = seconds(lines)
        floor = statistics.median(now)
        out.append(row(f"{n:,} lines: fleet's classifier", now, floor))
        if n <= 2000:  # the old way takes ~10 s a run at 20,000 lines
            with every_pattern_run():
                slow = seconds(lines)
                out.append(row(f"{n:,} lines: every pattern over every line (no word check)", slow, floor))
    return [*out, ""]
