"""Interleaved A/B of two fleet installs on the cold health sweep (1 and N simulated hosts).

Two builds compared on one machine in one run, their runs alternating, so that a machine that is slower
this hour (or another instance of the same kind) does not pass for a change in fleet:

    python -m fleet_testbed.sweep_ab --a /tmp/a/bin/fleet --b /tmp/b/bin/fleet --hosts 50 --runs 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from dataclasses import replace

from fleet_testbed import simhost
from fleet_testbed.bench import PORT, REPO, ROOT


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.sweep_ab")
    ap.add_argument("--a", required=True, help="the first `fleet` program")
    ap.add_argument("--b", required=True, help="the second `fleet` program")
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    os.environ["SIM_SPEED"] = "0"
    specs = [replace(simhost.extra_host(i), address=f"127.0.5.{i}") for i in range(1, a.hosts + 1)]
    sb = simhost.up(ROOT / "ab", specs, PORT + 2)
    env = {**os.environ, **sb.env(), "FLEET_PLAYBOOKS": str(REPO / "playbooks"), "XDG_CACHE_HOME": str(sb.root)}
    inventories = {}
    for size in (1, a.hosts):
        inventories[size] = sb.root / f"inv{size}.yaml"
        inventories[size].write_text(simhost.inventory_yaml(sb.root, specs[:size], sb.port))
    times: dict[tuple[str, int], list[float]] = {}
    try:
        for _ in range(a.runs):
            for size, inventory in inventories.items():
                for name, program in (("a", a.a), ("b", a.b)):
                    started = time.perf_counter()
                    r = subprocess.run(
                        [program, "-i", str(inventory), "health", "--json", "--skip-generation"],
                        env=env,
                        capture_output=True,
                        text=True,
                    )
                    times.setdefault((name, size), []).append(time.perf_counter() - started)
                    assert len(r.stdout.splitlines()) == size, r.stderr[-500:]
    finally:
        simhost.down(ROOT / "ab")
    print(f"### Cold health sweep, A/B interleaved ({a.runs} runs each, {os.cpu_count()} CPUs; seconds)")
    print(f"A: `{a.a}`  B: `{a.b}`\n")
    print(f"| build | 1 host, median (min-max) | {a.hosts} hosts, median (min-max) | {a.hosts} vs 1 |")
    print("| --- | --- | --- | --- |")
    for name in ("a", "b"):
        one, many = times[(name, 1)], times[(name, a.hosts)]
        m1, mn = statistics.median(one), statistics.median(many)
        print(
            f"| {name.upper()} | {m1:.3f} ({min(one):.3f}-{max(one):.3f}) | "
            f"{mn:.3f} ({min(many):.3f}-{max(many):.3f}) | {mn / m1:.2f}x |"
        )


if __name__ == "__main__":
    main()
