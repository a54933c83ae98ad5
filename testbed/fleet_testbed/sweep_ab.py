"""Interleaved A/B of two fleet installs on the cold health sweep, with the Fabric anchor in the same loop.

Two builds compared on one machine in one run, their runs alternating with a Fabric ThreadingGroup
running the same probe, so that a machine that is slower this hour (or another instance of the same
kind) does not pass for a change in fleet:

    python -m fleet_testbed.sweep_ab --a /tmp/a/bin/fleet --b /tmp/b/bin/fleet --sizes 1,10,50 --runs 10
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace

from fleet_testbed import simhost
from fleet_testbed.bench import PORT, REPO, ROOT, fabric_sweep, probe_command


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.sweep_ab")
    ap.add_argument("--a", required=True, help="the first `fleet` program")
    ap.add_argument("--b", required=True, help="the second `fleet` program")
    ap.add_argument("--sizes", default="1,50", help="host counts, comma-separated")
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    os.environ["SIM_SPEED"] = "0"
    specs = [replace(simhost.extra_host(i), address=f"127.0.5.{i}") for i in range(1, max(sizes) + 1)]
    sb = simhost.up(ROOT / "ab", specs, PORT + 2)
    env = {**os.environ, **sb.env(), "FLEET_PLAYBOOKS": str(REPO / "playbooks"), "XDG_CACHE_HOME": str(sb.root)}
    remote = f"exec /bin/sh -c {shlex.quote(probe_command(sb, specs[0]))}"

    def fleet_sweep(program: str, size: int) -> Callable[[], None]:
        inventory = sb.root / f"inv{size}.yaml"
        inventory.write_text(simhost.inventory_yaml(sb.root, specs[:size], sb.port))

        def run() -> None:
            argv = [program, "-i", str(inventory), "health", "--json", "--skip-generation"]
            r = subprocess.run(argv, env=env, capture_output=True, text=True)
            assert len(r.stdout.splitlines()) == size, r.stderr[-500:]

        return run

    runners = {
        (name, size): run
        for size in sizes
        for name, run in (
            ("a", fleet_sweep(a.a, size)),
            ("b", fleet_sweep(a.b, size)),
            ("fabric", lambda size=size: fabric_sweep(sb, specs[:size], remote)),
        )
    }
    times: dict[tuple[str, int], list[float]] = {key: [] for key in runners}
    try:
        for _ in range(a.runs):
            for key, run in runners.items():
                started = time.perf_counter()
                run()
                times[key].append(time.perf_counter() - started)
    finally:
        simhost.down(ROOT / "ab")
    print(f"### Cold health sweep, A/B and Fabric interleaved ({a.runs} runs each, {os.cpu_count()} CPUs; seconds)")
    print(f"A: `{a.a}`  B: `{a.b}`  Fabric: a ThreadingGroup running the same probe (bench.FABRIC_SWEEP)\n")
    print(
        "| hosts | A, median (min-max) | B, median (min-max) | Fabric, median (min-max) | A vs Fabric | B vs Fabric |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    medians = {key: statistics.median(xs) for key, xs in times.items()}
    for size in sizes:
        cells = [
            f"{medians[(n, size)]:.3f} ({min(times[(n, size)]):.3f}-{max(times[(n, size)]):.3f})"
            for n in ("a", "b", "fabric")
        ]
        fabric = medians[("fabric", size)]
        print(
            f"| {size} | {' | '.join(cells)} | {medians[('a', size)] / fabric:.2f}x | {medians[('b', size)] / fabric:.2f}x |"
        )
    print(f"\n| build | {' | '.join(f'{s} vs {sizes[0]} hosts' for s in sizes[1:])} |")
    print(f"| --- | {' | '.join('---' for _ in sizes[1:])} |")
    for name in ("a", "b", "fabric"):
        ratios = [f"{medians[(name, s)] / medians[(name, sizes[0])]:.2f}x" for s in sizes[1:]]
        print(f"| {name if name == 'fabric' else name.upper()} | {' | '.join(ratios)} |")


if __name__ == "__main__":
    main()
