"""One call per rank of a group at once, each answer or FleetError kept by rank."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from fleet.errors import FleetError

T = TypeVar("T")

INTERRUPTED_WAIT_S = 30.0  # after Ctrl-C, how long the steps in flight get to answer (a second Ctrl-C: none)


def in_parallel(fn: Callable[[int], T], ranks: Iterable[int]) -> dict[int, T | FleetError]:
    """`fn` for each rank at once, in daemon threads; what each returned, or the FleetError it raised, by
    rank. Any other exception is raised here. Ctrl-C is raised once the calls in flight have answered
    (for at most INTERRUPTED_WAIT_S), so that what the caller does next does not race them."""
    results: dict[int, T | FleetError] = {}
    crashed: list[BaseException] = []
    ranks = list(ranks)
    answered = {i: threading.Event() for i in ranks}

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except FleetError as exc:
            results[i] = exc
        except Exception as exc:  # a bug: raised in the caller, not lost in a thread
            crashed.append(exc)
        finally:
            answered[i].set()

    started: list[int] = []
    try:  # (events, not Thread.join: a join Ctrl-C interrupts leaves its thread looking ended on 3.11)
        for i in ranks:
            started.append(i)  # before start(): Ctrl-C in start() may come once the thread runs
            threading.Thread(target=run, args=(i,), daemon=True).start()
        for event in answered.values():
            event.wait()
    except KeyboardInterrupt:
        # a step in flight still changes its host (a lock it takes): the caller's clean-up comes after it
        deadline = time.monotonic() + INTERRUPTED_WAIT_S
        for i in started:
            answered[i].wait(timeout=max(0.0, deadline - time.monotonic()))
        raise
    if crashed:
        raise crashed[0]
    return dict(sorted(results.items()))
