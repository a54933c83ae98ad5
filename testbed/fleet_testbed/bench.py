"""`make bench`: fleet against plain OpenSSH (and Fabric) on the local simulated fleet, real sshd.

Measures (medians with min/max, ratios to a floor measured in the same run):
  1. deploy orchestration: wall time and SSH commands of `fleet deploy` vs the by-hand sequence
     (kill, fuser -k, sleep 2, launch, sleep 15, read the log) and the same without sleeps (the floor);
     the simulated engine starts instantly (SIM_SPEED=0) so what remains is orchestration;
  2. crash-to-relaunch latency: from the crash's last log write on the host to fleet issuing the relaunch;
  3. health sweep over 1, 10, 50 hosts: `fleet health --json` vs parallel plain `ssh` running the same
     probe and a Fabric ThreadingGroup running it (fabric's default: no host-key checking, less work);
  4. cold start: `fleet --help` and `fleet health` on one host, whole process.
Results: printed, and written to bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from fleet_testbed import simhost

REPO = Path(__file__).resolve().parents[2]
FLEET = str(Path(sys.executable).parent / "fleet")
ROOT = Path(os.environ.get("FLEET_BENCH_ROOT", "/tmp/fleet-bench"))
PORT = 2522


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def row(name: str, xs: list[float], floor: float | None, extra: str = "") -> str:
    med, lo, hi = stats(xs)
    ratio = f"{med / floor:.2f}x" if floor else "-"
    return f"| {name} | {med:.3f} | {lo:.3f} | {hi:.3f} | {ratio} | {extra} |"


def fleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FLEET, *args], env=env, capture_output=True, text=True, cwd=REPO)


def bench_deploy(sb: simhost.Sandbox, env: dict[str, str], n: int) -> list[str]:
    spec = sb.specs[1]  # ct129
    h = sb.host_dir(spec.name)
    ssh = simhost.ssh_argv(sb, spec)
    devs = f"{h}/dev/nvidia*"
    log = f"{h}/logs/manual.log"
    launch = (
        f"cd /tmp && setsid -f nohup {h}/env/bin/python -m sglang.launch_server --model-path {h}/models/Qwen3.6-27B "
        f"--host {spec.address} --port 30000 --tp 2 --speculative-algorithm NEXTN --speculative-num-steps 1 "
        f"--speculative-eagle-topk 1 --speculative-num-draft-tokens 2 --mamba-scheduler-strategy extra_buffer "
        f"> {log} 2>&1 < /dev/null"
    )
    kill = f"kill $(pgrep -f [s]glang.launch_server) 2>/dev/null; fuser -k {devs} 2>/dev/null; "

    def manual(sleeps: bool) -> None:
        subprocess.run([*ssh, kill + ("sleep 2" if sleeps else "true")], check=False, capture_output=True)
        subprocess.run([*ssh, launch], check=True, capture_output=True)
        if sleeps:
            time.sleep(15)
        wait = f"until grep -q 'fired up' {log}; do sleep 0.02; done; tail -n 20 {log}"
        subprocess.run([*ssh, wait], check=True, capture_output=True, timeout=120)

    floor = timed(lambda: manual(False), n)
    with_sleeps = timed(lambda: manual(True), 1)
    round_trips: list[int] = []

    def deploy(check: bool) -> None:
        r = fleet(env, "deploy", "qwen36-27b", "--host", spec.name, "--json", *([] if check else ["--no-engine-check"]))
        if r.returncode != 0:
            raise SystemExit(f"bench: deploy failed: {r.stderr[-2000:]}")
        round_trips.append(json.loads(r.stdout)["round_trips"])

    fleet_runs = timed(lambda: deploy(False), n)
    rt_plain = sorted(set(round_trips))
    round_trips.clear()
    fleet_checked = timed(lambda: deploy(True), n)
    f = statistics.median(floor)
    return [
        "### 1. Deploy orchestration (engine start ~instant; seconds, whole process)",
        "| what | median | min | max | vs floor | SSH connections / commands |",
        "| --- | --- | --- | --- | --- | --- |",
        row("plain ssh, by hand with `sleep 2` and `sleep 15`", with_sleeps, f, "3 connections"),
        row("plain ssh, same sequence without sleeps (floor)", floor, f, "3 connections"),
        row("fleet deploy --no-engine-check", fleet_runs, f, f"1 connection, {rt_plain} commands"),
        row(
            "fleet deploy (with the engine's own argument check)",
            fleet_checked,
            f,
            f"1 connection, {sorted(set(round_trips))} commands",
        ),
        "",
        "fleet also proves more than the floor: /health and a checked generation; it takes a lock, frees the "
        "GPUs safely and records state.",
        "",
    ]


def bench_crash_latency(sb: simhost.Sandbox, n: int) -> list[str]:
    from fleet.control.deploy import Deployer
    from fleet.control.facts import model_path, read_facts
    from fleet.control.ops import _smoke
    from fleet.inventory import load_inventory, load_playbook
    from fleet.plan.build import build_plan
    from fleet.transport import SshOptions, connect

    inv = load_inventory(sb.inventory)
    host = inv.hosts["ct129"]
    pb = load_playbook("qwen36-27b", REPO / "playbooks")
    hdir = sb.host_dir("ct129")
    simhost.set_host(
        hdir,
        inject_scheduler_error=(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
            "mem_fraction_static=0.85"
        ),
    )
    latencies: list[float] = []
    options = SshOptions(sb.known_hosts, sb.root / "ssh_config")
    t = connect(host, options)
    try:
        for _ in range(n):
            path = model_path(host, pb.spec.model)
            f = read_facts(t, host, model=path, engine="sglang")
            result = build_plan(host, pb, f, path)
            assert result.plan and result.model and result.gpus
            seen: dict[str, object] = {}

            def progress(event: str, data: dict[str, object], seen: dict[str, object] = seen) -> None:
                if event == "launched":
                    seen.setdefault("log", data["log"])
                if event == "relaunching":
                    seen.setdefault("relaunch_at", time.time())

            d = Deployer(
                t,
                host,
                playbook_name=pb.name,
                smoke=_smoke(pb),
                kill_policy="safe",
                secrets={},
                progress=progress,
                engine_check=False,
                max_attempts=2,
            )
            d.run(
                result.plan,
                result.model,
                result.gpus,
                result.wishes,
                learned_key="bench",
                learned_existing=[],
                recorded_pgid=None,
            )
            # The first attempt's log: its last write is the crash. The host is this machine: one clock.
            crash_written = os.path.getmtime(str(seen["log"]))
            latencies.append(float(seen["relaunch_at"]) - crash_written)  # type: ignore[arg-type]
    finally:
        t.close()
        simhost.set_host(hdir, inject_scheduler_error=None)
    qs = statistics.quantiles(latencies, n=20)
    return [
        f"### 2. Crash → relaunch issued ({n} crashes)",
        "| median | p95 | min | max |",
        "| --- | --- | --- | --- |",
        f"| {statistics.median(latencies):.3f} | {qs[18]:.3f} | {min(latencies):.3f} | {max(latencies):.3f} |",
        "",
    ]


def bench_sweep(sizes: list[int], n: int) -> list[str]:
    from fabric import ThreadingGroup

    from fleet.facts import probe_script

    specs = [replace(simhost.extra_host(i), address=f"127.0.5.{i}") for i in range(1, max(sizes) + 1)]
    sb = simhost.up(ROOT / "sweep", specs, PORT + 1)
    env = {
        **os.environ,
        **sb.env(),
        "FLEET_PLAYBOOKS": str(REPO / "playbooks"),
        "XDG_CACHE_HOME": str(sb.root / "cache"),
    }
    lines = [
        "### 3. Health sweep (seconds, whole run, all hosts in parallel)",
        "| hosts | fleet health --json | plain ssh (parallel) | Fabric ThreadingGroup | fleet vs ssh | "
        "fleet vs Fabric |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    try:
        for size in sizes:
            subset = specs[:size]
            inv = sb.root / f"inv{size}.yaml"
            inv.write_text(simhost.inventory_yaml(sb.root, subset, sb.port))
            h0 = sb.host_dir(subset[0].name)
            probe = probe_script(
                python_candidates=[f"{h0}/env/bin/python"],
                gpu_devices=f"{h0}/dev/nvidia*",
                engines={"sglang": f"{h0}/env/bin/python"},
                model_path=None,
                state_dir=f"{h0}/state",
                disk_paths=[f"{h0}/models"],
            )
            remote = f"exec /bin/sh -c {shlex.quote(probe)}"

            def fleet_sweep(inv: Path = inv, count: int = size) -> None:
                r = subprocess.run(
                    [FLEET, "-i", str(inv), "health", "--json", "--skip-generation"],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                assert len(r.stdout.splitlines()) == count, r.stderr[-500:]

            def ssh_sweep(subset: list[simhost.HostSpec] = subset, remote: str = remote) -> None:
                with ThreadPoolExecutor(max_workers=len(subset)) as pool:
                    list(
                        pool.map(
                            lambda spec: subprocess.run(
                                [*simhost.ssh_argv(sb, spec), remote], capture_output=True, check=True
                            ),
                            subset,
                        )
                    )

            def fabric_sweep(subset: list[simhost.HostSpec] = subset, remote: str = remote) -> None:
                g = ThreadingGroup(
                    *[s.address for s in subset],
                    port=sb.port,
                    connect_kwargs={"key_filename": [str(sb.root / "keys" / "id_ed25519")]},
                )
                g.run(remote, hide=True)
                g.close()

            f = timed(fleet_sweep, n)
            sh = timed(ssh_sweep, n)
            fb = timed(fabric_sweep, n)
            fm, sm, fbm = (statistics.median(x) for x in (f, sh, fb))
            lines.append(
                f"| {size} | {fm:.3f} ({min(f):.3f}-{max(f):.3f}) | {sm:.3f} ({min(sh):.3f}-{max(sh):.3f}) | "
                f"{fbm:.3f} ({min(fb):.3f}-{max(fb):.3f}) | {fm / sm:.2f}x | {fm / fbm:.2f}x |"
            )
    finally:
        simhost.down(ROOT / "sweep")
    lines += [
        "",
        "fleet health does more per host than the probe alone (HTTP checks, diagnosis, strict host keys).",
        "",
    ]
    return lines


def bench_cold(env: dict[str, str], n: int) -> list[str]:
    help_runs = timed(lambda: fleet(env, "--help"), n)
    health_runs = timed(lambda: fleet(env, "health", "--host", "ct129", "--skip-generation"), n)
    return [
        "### 4. Cold start (whole process, seconds)",
        "| what | median | min | max | vs floor | |",
        "| --- | --- | --- | --- | --- | --- |",
        row("fleet --help", help_runs, None),
        row("fleet health --host ct129", health_runs, None),
        "",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.bench")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--crashes", type=int, default=20)
    ap.add_argument("--sizes", default="1,10,50")
    a = ap.parse_args()
    os.environ["SIM_SPEED"] = "0"
    sb = simhost.up(
        ROOT / "main",
        [replace(simhost.BLACKWELL, address="127.0.6.2"), replace(simhost.CT129, address="127.0.6.3")],
        PORT,
    )
    env = {
        **os.environ,
        **sb.env(),
        "FLEET_INVENTORY": str(sb.inventory),
        "FLEET_PLAYBOOKS": str(REPO / "playbooks"),
        "XDG_CACHE_HOME": str(sb.root / "cache"),
    }
    out = [
        f"# fleet benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, loopback sshd)",
        "",
        "Reproduce: `make bench` (or `PYTHONPATH=testbed .venv/bin/python -m fleet_testbed.bench "
        f"--runs {a.runs} --crashes {a.crashes} --sizes {a.sizes}`).",
        "",
    ]
    try:
        out += bench_deploy(sb, env, a.runs)
        out += bench_crash_latency(sb, a.crashes)
        out += bench_cold(env, a.runs)
    finally:
        simhost.down(ROOT / "main")
    out += bench_sweep([int(x) for x in a.sizes.split(",")], a.runs)
    text = "\n".join(out) + "\n"
    print(text)
    dest = REPO / "bench" / "results" / "latest.md"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    print(f"written to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
