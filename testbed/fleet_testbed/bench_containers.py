"""`make bench`, section 11: a deployment in a container against the same container started by hand.

On the simulated blackwell, with its GPUs as character devices and its engine starting at the speed a new
user's sandbox has (`startup_scale` 1.0, about 1.3 s to ready), in podman and then in docker (Debian's
dockerd, started on the host for the section). By hand is what an operator types: `ssh HOST CLI run -d`
with the same image, devices, mounts and engine command line as fleet's plan, then polling `/health`
until it answers 200. fleet's deploy is measured three times per run: a plan new to the host (the engine
checks the command line in the image before anything is stopped), the same plan again after `fleet stop`,
and that again with `fleet pool` running (its connection and its imported process kept between runs).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

from fleet_testbed import dockerd, gpustate, images, simhost

Fleet = Callable[..., subprocess.CompletedProcess[str]]
Timed = Callable[[Callable[[], object], int], list[float]]
Row = Callable[..., str]
Pooled = Callable[[simhost.Sandbox, dict[str, str]], AbstractContextManager[dict[str, str]]]


def by_hand_argv(run: list[str]) -> list[str]:
    """fleet's planned `CLI run` as an operator would type it: no labels, no launcher, the engine's own
    command line in the image; fleet's secrets mount left out (it exists once fleet ran)."""
    out: list[str] = []
    words = iter(run)
    for word in words:
        if word in ("--label", "--entrypoint"):
            next(words)
        elif word == "--name":
            out += ["--name", "byhand"]
            next(words)
        elif word == "-v":
            mount = next(words)
            if not mount.endswith(":/run/fleet-secrets"):
                out += ["-v", mount]
        elif word != "<fleet's launcher>":
            out.append(word)
    return out


def health_within(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s} s")


@contextmanager
def character_devices(hdir: Path) -> Iterator[None]:
    """The host's GPU device files as character devices (as the driver's are), for `--device`."""
    devices = sorted((hdir / "dev").glob("nvidia*"))
    for dev in devices:
        dev.unlink()
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
    try:
        yield
    finally:
        for dev in devices:
            dev.unlink(missing_ok=True)
            dev.write_text("")


def measure(
    sb: simhost.Sandbox,
    env: dict[str, str],
    pool_env: dict[str, str],
    fleet: Fleet,
    timed: Timed,
    runs: int,
    cli: str,
    image: str,
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(by hand, fleet with a new plan, fleet with that plan again, and again through the pool `pool_env`
    reaches) in seconds, `runs` of each."""
    spec = sb.specs[0]
    hdir = sb.host_dir(spec.name)
    books = Path(env["FLEET_PLAYBOOKS"])
    ssh = simhost.ssh_argv(sb, spec)
    by_hand: list[float] = []
    new: list[float] = []
    again: list[float] = []
    pooled: list[float] = []
    for i in range(runs):
        # a setting no run chose before: the host has not seen this command line, so the engine checks it
        watchdog = 1000 + (time.time_ns() // 1000) % 1_000_000 + i
        extra = f"gpus: [6, 7]\nextra_args: ['--watchdog-timeout', '{watchdog}']\n"
        (books / "boxed.yaml").write_text(
            images.container_playbook(hdir, image, base="qwen36-27b", extra=extra, cli=cli)
        )
        planned = fleet(env, "plan", "boxed", "--host", spec.name, "--json")
        if planned.returncode != 0:
            raise RuntimeError(f"fleet plan failed: {planned.stdout[-2000:]}{planned.stderr[-2000:]}")
        plan = json.loads(planned.stdout)["plan"]
        argv = plan["argv"]
        url = f"http://{argv[argv.index('--host') + 1]}:{argv[argv.index('--port') + 1]}/health"
        command = " ".join(subprocess.list2cmdline([w]) for w in by_hand_argv(plan["container"]["run"]))

        def manual(command: str = command, url: str = url) -> None:
            subprocess.run([*ssh, command], check=True, capture_output=True, timeout=60)
            health_within(url)

        by_hand += timed(manual, 1)
        subprocess.run([*ssh, f"{cli} kill byhand && {cli} rm -f byhand"], check=True, capture_output=True, timeout=60)

        def deploy(env: dict[str, str] = env) -> None:
            r = fleet(env, "deploy", "boxed", "--host", spec.name)
            if r.returncode != 0:
                raise RuntimeError(f"fleet deploy in {cli} failed: {r.stderr[-2000:]}")

        for into, through in ((new, env), (again, env), (pooled, pool_env)):
            into += timed(lambda through=through: deploy(through), 1)
            fleet(env, "stop", "--host", f"{spec.name}/boxed")
    # its record names the runtime: a later deploy would want to ask it for the deployment's containers
    fleet(env, "forget", f"{spec.name}/boxed")
    return by_hand, new, again, pooled


def bench_containers(
    sb: simhost.Sandbox,
    env: dict[str, str],
    fleet: Fleet,
    timed: Timed,
    row: Row,
    runs: int,
    title: str,
    pool: Pooled,
    runtimes: tuple[str, ...] = ("podman", "docker"),
    startup_scale: float = 1.0,
) -> list[str]:
    """`pool`: starts a `fleet pool` and gives the environment that runs through it; `runtimes`: those
    measured; `startup_scale`: the simulated engine's speed (1.0: a new user's sandbox; the test of the
    benchmark runs it faster)."""
    out = [
        title,
        "",
        "| what | median | min | max | vs by hand | |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    if shutil.which("podman") is None or os.geteuid() != 0:
        raise RuntimeError("section 11 needs podman, as root: `make system-deps` installs it")
    image = images.sim_sglang("0.5.11")
    hdir = sb.host_dir(sb.specs[0].name)
    was = gpustate.load_host(hdir).get("startup_scale")
    books = sb.root / "bench-containers"
    books.mkdir(exist_ok=True)
    env = {**env, "FLEET_PLAYBOOKS": str(books)}
    simhost.set_host(hdir, startup_scale=startup_scale)
    try:
        with character_devices(hdir):
            for cli in runtimes:
                with ExitStack() as runtime:
                    if cli == "docker":
                        runtime.enter_context(dockerd.on_host(sb, sb.specs[0], image))
                    pool_env = runtime.enter_context(pool(sb, env))
                    floor, new, again, pooled = measure(sb, env, pool_env, fleet, timed, runs, cli, image)
                f = statistics.median(floor)
                out += [
                    row(f"by hand: `ssh`, `{cli} run -d`, poll /health until 200 (floor)", floor, f),
                    row(f"fleet deploy in {cli}, a plan new to the host (checked in the image)", new, f),
                    row(f"fleet deploy in {cli}, the same plan again (after `fleet stop`)", again, f),
                    row(f"fleet deploy in {cli}, the same plan again, `fleet pool` running (warm)", pooled, f),
                ]
    finally:
        simhost.set_host(hdir, startup_scale=was)
    return [
        *out,
        "",
        "fleet's deploy also reads the host's facts, takes the lock, checks what holds the GPUs and the port, "
        "records the deployment and sends a prompt once /health answers.",
        "",
    ]
