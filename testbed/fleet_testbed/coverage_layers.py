"""`make coverage`'s report by layer: every file of the fleet package counted, a file no test ran at 0%
(coverage.py alone lists only the files it saw run, so a host step the fast tier never runs did not show
up at all), then each layer's share of its statements run.

    python -m fleet_testbed.coverage_layers [--data .coverage] [--fail-under LAYER=PERCENT ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import coverage

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "fleet"


def layer_of(relative: str) -> str:
    """The layer a file of the package belongs to (docs/architecture.md)."""
    top = relative.split("/")[0]
    name = relative.rsplit("/", 1)[-1]
    if top in ("host", "cli", "transport", "control"):  # host: everything that runs on a host
        return top
    if top in ("model", "plan", "crashes", "facts", "health", "inventory") or name in ("startup.py", "protocol.py"):
        return "core"
    return "edges"  # events, rendering, the terminal, secrets, the entry point, hostscripts


def by_layer(data_file: str) -> dict[str, tuple[int, int]]:
    """layer -> (statements, statements run), over every .py file of the package."""
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    totals: dict[str, tuple[int, int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        _, statements, _, missing, _ = cov.analysis2(str(path))
        layer = layer_of(path.relative_to(PACKAGE).as_posix())
        n, run = totals.get(layer, (0, 0))
        totals[layer] = (n + len(statements), run + len(statements) - len(missing))
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=".coverage")
    parser.add_argument("--fail-under", action="append", default=[], metavar="LAYER=PERCENT")
    args = parser.parse_args(argv)
    totals = by_layer(args.data)
    print(f"{'layer':8} {'statements':>10} {'run':>8} {'cover':>6}")
    for layer, (n, run) in sorted(totals.items()):
        print(f"{layer:8} {n:>10} {run:>8} {100 * run / max(n, 1):>5.0f}%")
    low = []
    for bound in args.fail_under:
        layer, _, percent = bound.partition("=")
        n, run = totals.get(layer, (0, 0))
        if 100 * run / max(n, 1) < float(percent):
            low.append(f"{layer}: {100 * run / max(n, 1):.0f}% < {percent}%")
    for line in low:
        print(f"coverage below its floor: {line}", file=sys.stderr)
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
