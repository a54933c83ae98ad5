"""Fixes whose value the failure's own line states: where the engine says how much memory it found, the
next attempt asks for what it found, not for a fixed step less (which may fail again, attempt after
attempt). Computed when the log is read; a line cut before its numbers gives no fix at all."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

from fleet.plan.types import Fix

# vLLM's request_memory (v1/worker/utils.py): "Free memory on device cuda:0 (3.22/4.0 GiB) on startup is
# less than desired GPU memory utilization (0.9, 3.6 GiB)."
_FREE_BELOW_ASKED = re.compile(
    r"Free memory on device \S* ?\((\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) GiB\) on startup is less than desired "
    r"GPU memory utilization \((\d*\.\d+|\d+),"
)
MARGIN = 0.02  # of the GPU, below what was free: what else starts on it meanwhile (a CUDA context)
AT_LEAST = 0.5  # less than half the GPU free: another process holds it, which a smaller fraction only hides
STEP = 0.05  # always at least this much lower than what failed


def fit_free_memory(lines: Sequence[str]) -> Fix | None:
    """--gpu-memory-utilization at what the engine found free (less a margin, and at least a step lower
    than what it asked for); None where that is under half the GPU, or the numbers are not there."""
    for line in lines:
        m = _FREE_BELOW_ASKED.search(line)
        if m is None:
            continue
        free, total, asked = (float(x) for x in m.groups())
        if total <= 0 or not 0 < asked <= 1:
            return None
        fitted = min(asked - STEP, math.floor((free / total - MARGIN) * 100) / 100)
        return Fix(set_flags=(("--gpu-memory-utilization", f"{fitted:.2f}"),)) if fitted >= AT_LEAST else None
    return None


FITTED: dict[str, Callable[[Sequence[str]], Fix | None]] = {"fit_free_memory": fit_free_memory}
