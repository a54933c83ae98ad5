"""`make bench`, section 6: a service's rolling restart (`fleet restart SERVICE`) against the same N
replicas restarted one by one with `fleet restart --host H/NAME` (the floor: the same redeployments
without the router's work), each under a steady stream of requests through the real SGLang router,
counting the requests that failed (the rolling restart's target is 0)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from fleet_testbed import simhost

ROUTER_PORT = 30080


class Requests:
    """Requests through the router, one after another, while a block runs: answered and failed counts."""

    def __init__(self, url: str) -> None:
        self.url, self.answered, self.failed = url, 0, 0
        self.errors: list[str] = []  # the first few failures, as they came
        self._stop = threading.Event()

    def _ask(self) -> None:
        body = json.dumps({"model": "qwen36", "messages": [{"role": "user", "content": "The capital of France?"}]})
        while not self._stop.is_set():
            request = urllib.request.Request(
                self.url + "/v1/chat/completions", body.encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    text = r.read().decode()
                    ok = r.status == 200 and "Paris" in text
            except Exception as exc:  # refused, 5xx, timed out: a failed request
                ok, text = False, f"{type(exc).__name__}: {exc} {getattr(exc, 'read', lambda: b'')()[:200]!r}"
            if not ok and len(self.errors) < 5:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {text[:300]}")
            self.answered += ok
            self.failed += not ok

    @contextmanager
    def running(self) -> Iterator[Requests]:
        thread = threading.Thread(target=self._ask, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(60)


def bench_rolling(
    sb: simhost.Sandbox,
    env: dict[str, str],
    fleet: Callable[..., subprocess.CompletedProcess[str]],
    runs: int,
    title: str,
) -> list[str]:
    """Three replicas (ct129; blackwell GPUs 0,1; blackwell GPUs 2,3), the router on ct129."""
    services = sb.root / "bench-services"
    services.mkdir(exist_ok=True)
    (services / "bench.yaml").write_text(
        "playbook: qwen36-27b\nreplicas:\n  - host: ct129\n  - host: blackwell\n    gpus: [0, 1]\n"
        f"  - host: blackwell\n    gpus: [2, 3]\nrouter: {{host: ct129, port: {ROUTER_PORT}, policy: round_robin}}\n"
        "drain_s: 10\n"
    )
    env = {**env, "FLEET_SERVICES": str(services)}
    up = fleet(env, "up", "bench")
    if up.returncode != 0:
        raise SystemExit(f"bench: fleet up failed: {up.stderr[-2000:]}")
    url = f"http://{sb.specs[1].address}:{ROUTER_PORT}"
    replicas = [("ct129", "bench-1"), ("blackwell", "bench-2"), ("blackwell", "bench-3")]

    def one_by_one() -> None:
        for host, name in replicas:
            r = fleet(env, "restart", "--host", f"{host}/{name}")
            if r.returncode != 0:
                raise SystemExit(f"bench: restart {host}/{name} failed: {r.stderr[-2000:]}")

    def rolling() -> None:
        r = fleet(env, "restart", "bench")
        if r.returncode != 0:
            raise SystemExit(f"bench: rolling restart failed: {r.stderr[-2000:]}")

    rows = []
    results: dict[str, tuple[list[float], int, int]] = {}
    for name, fn in (("N single restarts (`fleet restart --host H/NAME` each)", one_by_one), ("rolling", rolling)):
        times, answered, failed = [], 0, 0
        for _ in range(runs):
            with Requests(url).running() as loop:
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            answered, failed = answered + loop.answered, failed + loop.failed
            if loop.errors:
                print(f"bench: {name}: failed requests: {loop.errors}", file=sys.stderr)
        results[name] = (times, answered, failed)
    floor = sorted(results[next(iter(results))][0])[len(results[next(iter(results))][0]) // 2]
    for name, (times, answered, failed) in results.items():
        times.sort()
        med = times[len(times) // 2]
        label = name if name != "rolling" else "`fleet restart SERVICE` (rolling, through the router)"
        rows.append(
            f"| {label} | {med:.2f} | {times[0]:.2f} | {times[-1]:.2f} | {med / floor:.2f}x | "
            f"{failed} failed of {answered + failed} requests |"
        )
    fleet(env, "down", "bench")
    return [
        title,
        "",
        f"{len(replicas)} replicas of qwen36-27b (engine start ~instant), {runs} runs each, requests through the",
        "real SGLang router all the while (the single restarts do not take a replica out of the router first).",
        "",
        "| what | median | min | max | vs N singles | requests |",
        "| --- | --- | --- | --- | --- | --- |",
        *rows,
        "",
    ]
