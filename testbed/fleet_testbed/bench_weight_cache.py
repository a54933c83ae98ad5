"""`make bench`, section 10: relaunching without reloading the weights (SGLang's weight cache daemon,
docs/weight-cache.md), on the simulated ct129 running SGLang 0.5.23 with a modelled disk: each load of
Qwen3.6-27B's 25.9 GiB per rank takes LOAD_S_PER_GIB seconds a GiB, in the daemon as in a plain engine.

The same deployment with and without `weight_cache: true`: its first deploy through the issue's loop (a
CUDA-graph capture out of memory, fixed by a smaller capture, then a KV pool too small, fixed by a larger
fraction: three attempts), then a `fleet restart`; then a service of two such replicas rolled. The loads are counted from the host's logs (a daemon's
start, an engine that did not map a daemon's weights), not assumed."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from fleet.host.launch import DAEMON_LOG_SUFFIX
from fleet_testbed import gpustate, simhost

LOAD_S_PER_GIB = 0.1
PLAYBOOK = """engine: sglang
model: Qwen3.6-27B
served_name: qwen36
weight_cache: {cache}
mem_fraction: 0.59
smoke: {{prompt: "What is the capital of France? Answer in one word.", expect: "(?i)paris"}}
"""


# Two replicas, one per simulated host (ct129; blackwell's GPUs 6 and 7), the router on ct129
SERVICE = """playbook: {playbook}
replicas:
  - host: ct129
  - host: blackwell
    gpus: [6, 7]
router: {{host: ct129, port: 30081, policy: round_robin}}
drain_s: 1
"""


def disk_loads(logs: Path) -> int:
    """Weight loads from disk the logs in `logs` show: each daemon start (its first rank's line) and each
    engine that did not map a daemon's weights."""
    daemons = sum(
        "[WeightCacheDaemon gpu=0] Loading model from disk" in p.read_text()
        for p in logs.glob(f"*{DAEMON_LOG_SUFFIX}-*.log")
    )
    engines = [p.read_text() for p in logs.glob("*-attempt*.log") if DAEMON_LOG_SUFFIX not in p.name]
    return daemons + sum("Load weight begin" in t and "Loaded model via IPC" not in t for t in engines)


def bench_weight_cache(
    sb: simhost.Sandbox,
    env: dict[str, str],
    fleet: Callable[..., subprocess.CompletedProcess[str]],
    runs: int,
    title: str,
    load_s_per_gib: float = LOAD_S_PER_GIB,
) -> list[str]:
    hosts = [sb.host_dir(spec.name) for spec in sb.specs]  # blackwell, ct129
    ct129 = sb.specs[1].name
    before = [gpustate.load_host(h) for h in hosts]
    for h in hosts:
        simhost.set_host(h, sglang_version="0.5.23", load_s_per_gib=load_s_per_gib)
    books = sb.root / "bench-weight-cache"
    books.mkdir(exist_ok=True)
    for name, cache in (("cached", "true"), ("disk", "false")):
        (books / f"{name}.yaml").write_text(PLAYBOOK.format(cache=cache))
        (books / f"{name}-svc.yaml").write_text(SERVICE.format(playbook=name))
    env = {**env, "FLEET_PLAYBOOKS": str(books), "FLEET_SERVICES": str(books)}
    measured: dict[tuple[str, str], list[tuple[float, int]]] = {}

    def timed_loads(key: tuple[str, str], *args: str) -> None:
        loads = sum(disk_loads(h / "logs") for h in hosts)
        began = time.perf_counter()
        r = fleet(env, *args)
        took = time.perf_counter() - began
        if r.returncode != 0:
            raise RuntimeError(f"fleet {' '.join(args)} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
        measured.setdefault(key, []).append((took, sum(disk_loads(h / "logs") for h in hosts) - loads))

    try:
        for _ in range(runs):
            for name in ("disk", "cached"):
                fleet(env, "fixes", "forget", "--host", ct129, "--every")  # the loop's fixes, not yet learned
                simhost.set_host(hosts[1], graph_mib_per_bs=64)  # the fix loop (see tests/test_weight_cache_ssh.py)
                timed_loads((name, "deploy"), "deploy", name, "--host", ct129)
                timed_loads((name, "restart"), "restart", "--host", f"{ct129}/{name}")
                fleet(env, "stop", "--host", f"{ct129}/{name}")
                fleet(env, "fixes", "forget", "--host", ct129, "--every")
                simhost.set_host(hosts[1], graph_mib_per_bs=0)  # the service starts at once: the roll is measured
                timed_loads((name, "roll"), "up", f"{name}-svc")
                measured[(name, "roll")].pop()  # the service coming up is not what is measured
                timed_loads((name, "roll"), "restart", f"{name}-svc")
                fleet(env, "down", f"{name}-svc")
    finally:
        for h, was in zip(hosts, before, strict=True):
            simhost.set_host(h, **{k: was.get(k) for k in ("sglang_version", "load_s_per_gib", "graph_mib_per_bs")})
    out = [
        title,
        "",
        f"Modelled disk: {load_s_per_gib:g} s per GiB (25.9 GiB per rank, the 2 ranks in parallel); median of {runs}.",
        "",
        "| run | without the cache (s) | loads | with the cache (s) | loads | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for what, label in (
        ("deploy", "deploy through 2 known fixes (3 attempts)"),
        ("restart", "`fleet restart`"),
        ("roll", "rolling restart of a service of 2 replicas"),
    ):
        disk, cached = measured[("disk", what)], measured[("cached", what)]
        d, c = statistics.median(t for t, _ in disk), statistics.median(t for t, _ in cached)
        dl, cl = statistics.median(n for _, n in disk), statistics.median(n for _, n in cached)
        out.append(f"| {label} | {d:.2f} | {dl:g} | {c:.2f} | {cl:g} | {c / d:.2f}x |")
    out += [
        "",
        "A deploy with the cache loads once, in the daemon; its restart and the roll load nothing (each "
        "replica's daemon is kept).",
        "",
    ]
    return out
