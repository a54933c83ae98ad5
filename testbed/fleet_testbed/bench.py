"""`make bench`: fleet against plain OpenSSH (and Fabric) on the local simulated fleet, real sshd.

Measures (medians with min/max, ratios to a floor measured in the same run):
  1. deploy orchestration: wall time and SSH commands of `fleet deploy` vs the by-hand sequence
     (kill, fuser -k, sleep 2, launch, sleep 15, read the log) and the same without sleeps (the floor);
     the simulated engine starts instantly (SIM_SPEED=0) so what remains is orchestration;
  2. crash-to-relaunch latency: from the crash's last log write on the host to fleet issuing the relaunch;
  3. health sweep over 1, 10, 50 hosts: `fleet health --json` vs parallel plain `ssh` running the same
     probe and a Fabric ThreadingGroup running it (fabric's default: no host-key checking, less work),
     each a whole process, with the CPU time the whole machine spent (the simulated hosts share its CPUs)
     and, for fleet's sweep, how much of it fleet's own processes spent;
     and the same with connections kept between runs: fleet through `fleet pool`, ssh through
     ControlMaster, and the floor (the probe written into remote shells already open);
  4. cold start: `fleet --help` and `fleet health` on one host, whole process;
  5. deploy and sweep again through a TCP proxy adding 20 ms of round-trip time (latency.py);
  6. a service's rolling restart against N single restarts, with failed requests through the router
     during each (bench_service.py);
  7. `fleet pull` of a model from a local stand-in for the Hub against plain `hf download` run on the
     host over ssh (bench_pull.py).
  8. `fleet pull --from` pushing a model host to host against plain `ssh A tar c` piped to `ssh B tar x`, and from
     a directory here against plain `rsync` (bench_pull.py).
  9. what reading the engine's start-up costs the host's watcher, per log line, on the real logs of the crash
     corpus, against decoding the lines only (bench_startup.py).
Results: printed, and written to bench/results/latest.md.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import resource
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from fleet_testbed import simhost
from fleet_testbed.bench_containers import bench_containers
from fleet_testbed.bench_diagnosis import bench_diagnosis
from fleet_testbed.bench_pull import bench_pull, bench_push
from fleet_testbed.bench_service import bench_rolling
from fleet_testbed.bench_startup import bench_startup
from fleet_testbed.bench_weight_cache import bench_weight_cache

REPO = Path(__file__).resolve().parents[2]
FLEET = str(Path(sys.executable).parent / "fleet")
ROOT = Path(os.environ.get("FLEET_BENCH_ROOT", "/tmp/fleet-bench"))
PORT = 2522
# No one fleet command of the benchmark takes more than seconds; one that hangs is reported by name.
FLEET_TIMEOUT_S = 300
STARTED = time.monotonic()


def say(what: str) -> None:
    """Progress on stderr, so that a run that stalls shows where (the table comes at the end)."""
    print(f"bench {time.monotonic() - STARTED:7.1f}s  {what}", file=sys.stderr, flush=True)


def stats(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def machine_cpu_s() -> float:
    """CPU seconds spent by the whole machine so far (user+nice+system+irq+softirq)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:8]
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / ticks


def children_cpu_s() -> float:
    """CPU seconds spent by this benchmark's finished child processes (and the children they waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_cpu(fn: Callable[[], object], n: int, own: list[float] | None = None) -> tuple[list[float], list[float]]:
    """Wall and whole-machine CPU seconds of n runs; `own` collects the CPU of the processes `fn` ran
    (the client's side, where the rest is the simulated hosts' sshd and probes)."""
    walls, cpus = [], []
    for _ in range(n):
        c0, k0, t0 = machine_cpu_s(), children_cpu_s(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(machine_cpu_s() - c0)
        if own is not None:
            own.append(children_cpu_s() - k0)
    return walls, cpus


def timed(fn: Callable[[], object], n: int) -> list[float]:
    return timed_cpu(fn, n)[0]


def row(name: str, xs: list[float], floor: float | None, extra: str = "") -> str:
    med, lo, hi = stats(xs)
    ratio = f"{med / floor:.2f}x" if floor else "-"
    return f"| {name} | {med:.3f} | {lo:.3f} | {hi:.3f} | {ratio} | {extra} |"


def fleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [FLEET, *args], env=env, capture_output=True, text=True, cwd=REPO, timeout=FLEET_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        said = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
        raise RuntimeError(
            f"bench: `fleet {' '.join(args)}` still ran after {FLEET_TIMEOUT_S} s:\n{said[-5000:]}"
        ) from e


@contextmanager
def fleet_pool(sb: simhost.Sandbox, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A `fleet pool` of the benchmark's own; yields the environment whose fleet runs go through it."""
    pool_env = {**env, "XDG_CACHE_HOME": str(sb.root / "pool-cache")}
    subprocess.run([FLEET, "pool", "start"], env=pool_env, check=True, capture_output=True, timeout=FLEET_TIMEOUT_S)
    try:
        yield pool_env
    finally:
        subprocess.run([FLEET, "pool", "stop"], env=pool_env, check=False, capture_output=True, timeout=FLEET_TIMEOUT_S)


def bench_deploy(sb: simhost.Sandbox, env: dict[str, str], n: int, spec: simhost.HostSpec, title: str) -> list[str]:
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
    # Without the sleep, the least a correct script must wait: the old server draining off the port.
    gone = "while pgrep -f [s]glang.launch_server >/dev/null; do sleep 0.02; done"

    def manual(sleeps: bool) -> None:
        subprocess.run([*ssh, kill + ("sleep 2" if sleeps else gone)], check=False, capture_output=True, timeout=120)
        subprocess.run([*ssh, launch], check=True, capture_output=True, timeout=120)
        if sleeps:
            time.sleep(15)
        wait = f"until grep -q 'fired up' {log}; do sleep 0.02; done; tail -n 20 {log}"
        subprocess.run([*ssh, wait], check=True, capture_output=True, timeout=120)

    manual(False)  # every timed run replaces a running server, as every fleet run below does
    floor = timed(lambda: manual(False), n)
    with_sleeps = timed(lambda: manual(True), 1) if n > 1 else []
    round_trips: list[int] = []

    def deploy(check: bool, env: dict[str, str] = env) -> None:
        r = fleet(env, "deploy", "qwen36-27b", "--host", spec.name, "--json", *([] if check else ["--no-engine-check"]))
        if r.returncode != 0:
            raise SystemExit(f"bench: deploy failed: {r.stderr[-2000:]}")
        round_trips.append(json.loads(r.stdout)["round_trips"])

    state_file = simhost.record(h, "state.json")

    def replacing(check: bool, first_time: bool, env: dict[str, str] = env) -> list[float]:
        """Each timed deploy replaces a server started by hand (a deploy of the plan that already runs
        would only check it). `first_time`: fleet's record of the host is removed first, so the engine's
        own argument check runs (it is skipped for a command line that already ran there)."""
        out = []
        for _ in range(n):
            manual(False)
            if first_time:
                state_file.unlink(missing_ok=True)
            out += timed(lambda: deploy(check, env), 1)
        return out

    fleet_runs = replacing(False, first_time=False)
    rt_plain = sorted(set(round_trips))
    round_trips.clear()
    fleet_checked = replacing(True, first_time=True)
    rt_checked = sorted(set(round_trips))
    round_trips.clear()
    fleet_default = replacing(True, first_time=False)
    rt_default = sorted(set(round_trips))
    round_trips.clear()
    fleet_adopted = timed(lambda: deploy(True), n)  # fleet's own server, this plan: checked, not restarted
    rt_adopted = sorted(set(round_trips))
    round_trips.clear()
    with fleet_pool(sb, env) as pool_env:
        deploy(True, pool_env)  # the pool opens its connection (untimed)
        round_trips.clear()
        fleet_pooled = replacing(True, first_time=False, env=pool_env)
    rt_pooled = sorted(set(round_trips))
    f = statistics.median(floor)
    rows = [
        title,
        "| what | median | min | max | vs floor | SSH connections / commands |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    if with_sleeps:
        rows.append(row("plain ssh, by hand with `sleep 2` and `sleep 15`", with_sleeps, f, "3 connections"))
    return [
        *rows,
        row(
            "plain ssh, same sequence, sleeps replaced by waiting for the old server to exit (floor)",
            floor,
            f,
            "3 connections",
        ),
        row("fleet deploy --no-engine-check", fleet_runs, f, f"1 connection, {rt_plain} commands"),
        row(
            "fleet deploy, a command line new to the host (the engine's own argument check runs)",
            fleet_checked,
            f,
            f"1 connection, {rt_checked} commands",
        ),
        row(
            "fleet deploy, a command line that ran there before (check not needed)",
            fleet_default,
            f,
            f"1 connection, {rt_default} commands",
        ),
        row(
            "fleet deploy again: the server already runs this plan (checked with the smoke prompt, not restarted)",
            fleet_adopted,
            f,
            f"1 connection, {rt_adopted} commands",
        ),
        row(
            "fleet deploy, a command line that ran there before, `fleet pool` running (connection and process warm)",
            fleet_pooled,
            f,
            f"0 new connections, {rt_pooled} commands",
        ),
        "",
    ]


def bench_crash_latency(sb: simhost.Sandbox, n: int) -> list[str]:
    from fleet import events
    from fleet.control.deploy import Deployer
    from fleet.control.gather import model_path, read_facts
    from fleet.control.ops import smoke_of
    from fleet.inventory import load_inventory, load_playbook
    from fleet.model import GENERATE
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

            def progress(event: events.Event, seen: dict[str, object] = seen) -> None:
                if isinstance(event, events.Launched):
                    seen.setdefault("log", event.log)
                if isinstance(event, events.Relaunching):
                    seen.setdefault("relaunch_at", time.time())
                    # The crashed attempt's last write, read now: once the old group is stopped, its
                    # processes may still write to that log. The host is this machine: one clock.
                    seen.setdefault("crash_written", os.path.getmtime(str(seen["log"])))

            d = Deployer(
                t,
                host,
                playbook_name=pb.name,
                smoke=smoke_of(pb, GENERATE),
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
            )
            latencies.append(float(seen["relaunch_at"]) - float(seen["crash_written"]))  # type: ignore[arg-type]
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


FABRIC_SWEEP = """
import sys
from fabric import ThreadingGroup
port, key, remote, *hosts = sys.argv[1:]
g = ThreadingGroup(*hosts, port=int(port), connect_kwargs={"key_filename": [key]})
g.run(remote, hide=True)
g.close()
"""


def probe_command(sb: simhost.Sandbox, spec: simhost.HostSpec) -> str:
    """The shell script `fleet health` sends (its facts probe), for the other tools to run on the host."""
    from fleet.hostscripts import script_for

    home = sb.host_dir(spec.name)
    args = {
        "gpu_devices": f"{home}/dev/nvidia*",
        "engines": {"sglang": f"{home}/env/bin/python"},
        "model_path": None,
        "state_dir": f"{home}/state",
        "disk_paths": [f"{home}/models"],
    }
    return script_for("probe", args, [f"{home}/env/bin/python"])


def fabric_sweep(sb: simhost.Sandbox, specs: list[simhost.HostSpec], remote: str) -> None:
    """A whole `python` process running `remote` on `specs` through a Fabric ThreadingGroup."""
    key = str(sb.root / "keys" / "id_ed25519")
    addresses = [s.address for s in specs]
    subprocess.run(
        [sys.executable, "-c", FABRIC_SWEEP, str(sb.port), key, remote, *addresses],
        check=True,
        capture_output=True,
        timeout=300,
    )


class OpenShells:
    """The warm floor: one remote `sh` per host kept open over plain ssh; a probe is written into each."""

    MARK = "__fleet_bench_done__"

    def __init__(self, sb: simhost.Sandbox, specs: list[simhost.HostSpec]) -> None:
        self.shells = [
            subprocess.Popen(
                [*simhost.ssh_argv(sb, spec), "exec /bin/sh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            for spec in specs
        ]

    def probe(self, script: str) -> None:
        def one(shell: subprocess.Popen[str]) -> None:
            assert shell.stdin is not None and shell.stdout is not None
            shell.stdin.write(f"/bin/sh -c {shlex.quote(script)} </dev/null; echo; echo {self.MARK}\n")
            shell.stdin.flush()
            for line in shell.stdout:
                if line.strip() == self.MARK:
                    return
            raise RuntimeError(f"bench: a remote shell ended before its probe did (exit {shell.poll()})")

        with ThreadPoolExecutor(max_workers=len(self.shells)) as pool:
            list(pool.map(one, self.shells))

    def close(self) -> None:
        for shell in self.shells:
            assert shell.stdin is not None and shell.stdout is not None
            shell.stdin.close()
            shell.wait(timeout=30)
            shell.stdout.close()


class ControlMasters:
    """OpenSSH's own connection keeping: a ControlMaster per host, opened before the timed runs."""

    def __init__(self, sb: simhost.Sandbox, specs: list[simhost.HostSpec]) -> None:
        self.sb, self.specs = sb, specs
        for spec in specs:
            subprocess.run(
                [*self.argv(spec), "-o", "ControlMaster=yes", "-o", "ControlPersist=600", "-fN"], check=True, timeout=60
            )

    def argv(self, spec: simhost.HostSpec) -> list[str]:
        ssh = simhost.ssh_argv(self.sb, spec)
        return [ssh[0], "-o", f"ControlPath={self.sb.root}/cm-{spec.address}", *ssh[1:]]

    def close(self) -> None:
        for spec in self.specs:
            subprocess.run([*self.argv(spec), "-O", "exit"], check=False, capture_output=True, timeout=60)


def bench_sweep(sb: simhost.Sandbox, specs: list[simhost.HostSpec], sizes: list[int], n: int, title: str) -> list[str]:
    """`specs` are the sandbox's hosts as the client sees them (their addresses may be latency proxies).

    Two tables: every tool connecting from scratch (what one cron run pays without the pool), then
    every tool with its connections already open: fleet through `fleet pool`, ssh through ControlMaster,
    and the floor, a probe written into remote shells already open."""
    env = {
        **os.environ,
        **sb.env(),
        "FLEET_PLAYBOOKS": str(REPO / "playbooks"),
        "XDG_CACHE_HOME": str(sb.root / "cache"),
    }
    cores = os.cpu_count() or 1
    lines = [
        title,
        "| hosts | fleet health --json | plain ssh (parallel) | Fabric ThreadingGroup | fleet vs ssh | "
        f"fleet vs Fabric | CPU-s fleet / ssh / Fabric | fleet vs CPU bound ({cores} CPUs) | "
        "CPU-s of fleet's sweep: fleet's processes / the rest (the hosts' sshd and probes) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    warm = [
        f"{title.split('(')[0].strip()}, connections kept between runs (opened before the timed runs)",
        "| hosts | fleet health --json, `fleet pool` running | plain ssh, ControlMaster open | probe into open "
        "remote shells (floor) | fleet vs ControlMaster | fleet vs floor | fleet warm vs cold | CPU-s fleet / ssh "
        "/ floor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    with fleet_pool(sb, env) as pool_env:
        for size in sizes:
            subset = specs[:size]
            inv = sb.root / f"inv{size}-{subset[0].address}.yaml"
            inv.write_text(simhost.inventory_yaml(sb.root, subset, sb.port))
            probe = probe_command(sb, subset[0])
            remote = f"exec /bin/sh -c {shlex.quote(probe)}"

            def fleet_sweep(inv: Path = inv, count: int = size, env: dict[str, str] = env) -> None:
                r = subprocess.run(
                    [FLEET, "-i", str(inv), "health", "--json", "--skip-generation"],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                assert len(r.stdout.splitlines()) == count, r.stderr[-500:]

            def ssh_sweep(
                subset: list[simhost.HostSpec] = subset, remote: str = remote, argv: Callable = simhost.ssh_argv
            ) -> None:
                with ThreadPoolExecutor(max_workers=len(subset)) as pool:
                    list(
                        pool.map(
                            lambda spec: subprocess.run(
                                [*argv(sb, spec), remote], capture_output=True, check=True, timeout=120
                            ),
                            subset,
                        )
                    )

            own: list[float] = []
            f, fc = timed_cpu(fleet_sweep, n, own)
            sh, shc = timed_cpu(ssh_sweep, n)
            fb, fbc = timed_cpu(lambda subset=subset, remote=remote: fabric_sweep(sb, subset, remote), n)
            fm, sm, fbm = (statistics.median(x) for x in (f, sh, fb))
            fcm, shcm, fbcm = (statistics.median(x) for x in (fc, shc, fbc))
            lines.append(
                f"| {size} | {fm:.3f} ({min(f):.3f}-{max(f):.3f}) | {sm:.3f} ({min(sh):.3f}-{max(sh):.3f}) | "
                f"{fbm:.3f} ({min(fb):.3f}-{max(fb):.3f}) | {fm / sm:.2f}x | {fm / fbm:.2f}x | "
                f"{fcm:.2f} / {shcm:.2f} / {fbcm:.2f} | {fm / (fcm / cores):.2f}x | "
                f"{statistics.median(own):.2f} / {fcm - statistics.median(own):.2f} |"
            )

            fleet_sweep(env=pool_env)  # the pool opens this size's connections (untimed)
            wf, wfc = timed_cpu(lambda: fleet_sweep(env=pool_env), n)
            masters = ControlMasters(sb, subset)
            try:
                ws, wsc = timed_cpu(lambda m=masters: ssh_sweep(argv=lambda _sb, spec: m.argv(spec)), n)
            finally:
                masters.close()
            shells = OpenShells(sb, subset)
            try:
                shells.probe("true")  # every shell is up (untimed)
                wfl, wflc = timed_cpu(lambda o=shells, p=probe: o.probe(p), n)
            finally:
                shells.close()
            wfm, wsm, wflm = (statistics.median(x) for x in (wf, ws, wfl))
            warm.append(
                f"| {size} | {wfm:.3f} ({min(wf):.3f}-{max(wf):.3f}) | {wsm:.3f} ({min(ws):.3f}-{max(ws):.3f}) | "
                f"{wflm:.3f} ({min(wfl):.3f}-{max(wfl):.3f}) | {wfm / wsm:.2f}x | {wfm / wflm:.2f}x | "
                f"{wfm / fm:.2f}x | {statistics.median(wfc):.2f} / {statistics.median(wsc):.2f} / "
                f"{statistics.median(wflc):.2f} |"
            )
    lines += [
        "",
        "Every column is a whole process (interpreter start and imports included). fleet health does more "
        "per host than the probe alone (HTTP checks, diagnosis, strict host keys). CPU-s is what the whole "
        "machine spent during the run: the simulated hosts' sshd and probes run on the same CPUs as the "
        "client, so a sweep cannot finish faster than CPU-s / CPUs (the CPU bound); real hosts bring "
        "their own CPUs.",
        "",
    ]
    warm += [
        "",
        "fleet and ssh are whole processes here too; the floor is not (the shells are open in the benchmark "
        "itself), so it is the least any tool could spend: the probe's own run time on each host.",
        "",
    ]
    return lines + warm


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


class LatencyProxy:
    """fleet_testbed.latency in front of some hosts' sshd: host i is reached at `address_of(i)`."""

    def __init__(self, sb: simhost.Sandbox, specs: list[simhost.HostSpec], prefix: str, rtt_ms: float) -> None:
        self.specs = [replace(s, address=f"{prefix}.{i}") for i, s in enumerate(specs, start=1)]
        pairs = [f"{p.address}:{sb.port}={s.address}:{sb.port}" for p, s in zip(self.specs, specs, strict=True)]
        argv = [sys.executable, "-m", "fleet_testbed.latency", "--rtt-ms", str(rtt_ms), *pairs]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout and self.proc.stdout.readline().strip() == "ready"
        with sb.known_hosts.open("a") as f:
            f.writelines(simhost.host_key_line(sb.root, p.address, sb.port) for p in self.specs)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()


def compile_fleet() -> None:
    """Write fleet's .pyc files before timing anything, as `pip install` does for fabric and every other
    installed package: under PYTHONDONTWRITEBYTECODE=1 (set on the machines this was written on) an
    editable install would otherwise recompile fleet, and only fleet, on every run (~30 ms)."""
    import fleet

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(fleet.__file__).parent)], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.bench")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--crashes", type=int, default=20)
    ap.add_argument("--sizes", default="1,10,50")
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("--load-s-per-gib", type=float, default=0.1, help="section 10's modelled disk")
    ap.add_argument("--runtimes", default="podman,docker", help="the container runtimes section 11 measures")
    ap.add_argument("--startup-scale", type=float, default=1.0, help="section 11's engine speed (1: a sandbox's)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "latest.md", help="where the table goes")
    a = ap.parse_args()
    # `kill -USR1` prints where every thread of a run that seems stuck is (tests/test_bench.py does it).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    os.environ["SIM_SPEED"] = "0"
    sizes = [int(x) for x in a.sizes.split(",")]
    compile_fleet()
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
        f"--runs {a.runs} --crashes {a.crashes} --sizes {a.sizes} --rtt-ms {a.rtt_ms:g}`).",
        "",
    ]
    late: list[str] = []
    cold: list[str] = []
    rolling: list[str] = []
    try:
        ct129 = sb.specs[1]
        say("1. deploy")
        out += bench_deploy(
            sb, env, a.runs, ct129, "### 1. Deploy orchestration (engine start ~instant; seconds, whole process)"
        )
        out += [
            "fleet also proves more than the floor: /health and a checked generation; it takes a lock, frees "
            "the GPUs safely and records state.",
            "",
        ]
        say("2. crash to relaunch")
        out += bench_crash_latency(sb, a.crashes)
        say("6. rolling restart")
        rolling = bench_rolling(sb, env, fleet, a.runs, "### 6. Rolling restart of a service (seconds, whole process)")
        say("7. pull")
        rolling += bench_pull(
            sb, env, fleet, row, a.runs, "### 7. Pulling a model onto a host (seconds, whole process)"
        )
        say("8. push")
        rolling += bench_push(
            sb, env, fleet, row, a.runs, "### 8. Pushing a model to a host without internet (seconds, whole process)"
        )
        say("9. watching the start-up")
        rolling += bench_startup(a.runs, "### 9. What watching the start-up costs the host's watcher")
        say("10. weight cache")
        rolling += bench_weight_cache(
            sb,
            env,
            fleet,
            a.runs,
            "### 10. Relaunching without reloading the weights (seconds, whole process)",
            a.load_s_per_gib,
        )
        say("11. containers")
        rolling += bench_containers(
            sb,
            env,
            fleet,
            timed,
            row,
            a.runs,
            "### 11. A deployment in a container against the same container by hand",
            fleet_pool,
            tuple(a.runtimes.split(",")),
            a.startup_scale,
        )
        say("12. diagnosis")
        rolling += bench_diagnosis(row, timed, a.runs, "### 12. Diagnosing a long log (seconds, in process)")
        say("4. cold start")
        cold = bench_cold(env, a.runs)
        proxy = LatencyProxy(sb, [ct129], "127.0.7", a.rtt_ms)
        try:
            proxied_inventory = sb.root / "inventory-latency.yaml"
            proxied_inventory.write_text(simhost.inventory_yaml(sb.root, proxy.specs, sb.port))
            say("5a. deploy through latency")
            late += bench_deploy(
                sb,
                {**env, "FLEET_INVENTORY": str(proxied_inventory)},
                a.runs,
                proxy.specs[0],
                f"### 5a. Deploy through {a.rtt_ms:g} ms of round-trip time (seconds, whole process)",
            )
        finally:
            proxy.close()
    finally:
        simhost.down(ROOT / "main")
    specs = [replace(simhost.extra_host(i), address=f"127.0.5.{i}") for i in range(1, max(sizes) + 1)]
    sweep_sb = simhost.up(ROOT / "sweep", specs, PORT + 1)
    try:
        say("3. health sweep")
        out += bench_sweep(sweep_sb, specs, sizes, a.runs, "### 3. Health sweep (seconds, all hosts in parallel)")
        out += cold
        near = [x for x in sizes if x <= 10] or sizes[:1]
        proxy = LatencyProxy(sweep_sb, specs[: max(near)], "127.0.8", a.rtt_ms)
        try:
            say("5b. health sweep through latency")
            late += bench_sweep(
                sweep_sb, proxy.specs, near, a.runs, f"### 5b. Health sweep through {a.rtt_ms:g} ms of round-trip time"
            )
        finally:
            proxy.close()
    finally:
        simhost.down(ROOT / "sweep")
    say("done")
    text = "\n".join(out + late + rolling) + "\n"
    print(text)
    dest = a.out
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    print(f"written to {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
