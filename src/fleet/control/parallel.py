"""One call per rank of a group at once, each answer or FleetError kept by rank."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

from fleet.errors import FleetError

T = TypeVar("T")


def in_parallel(fn: Callable[[int], T], ranks: Iterable[int]) -> dict[int, T | FleetError]:
    """`fn` for each rank at once, in daemon threads (Ctrl-C is not held up by one); what each returned, or
    the FleetError it raised, by rank. Any other exception is raised here."""
    results: dict[int, T | FleetError] = {}
    crashed: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except FleetError as exc:
            results[i] = exc
        except Exception as exc:  # a bug: raised in the caller, not lost in a thread
            crashed.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if crashed:
        raise crashed[0]
    return dict(sorted(results.items()))
