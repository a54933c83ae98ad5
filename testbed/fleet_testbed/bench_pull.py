"""`make bench`, section 7: `fleet pull` of a model from a local stand-in for the Hub (fleet_testbed.fakehub)
onto a simulated host over real SSH, against the floor: the same files fetched by the same client with
the plain command, `hf download` run on the host over plain `ssh` (and `hf download` on this machine).
fleet does more than the floor: the disk check, progress, the checksums and headers of every file, and
the rename into place; the last row is a second pull of a model already there (verified, not fetched).

Section 8: `fleet pull --from` pushing a model from one simulated host to another through this machine,
against plain `ssh A tar c` piped to `ssh B tar x` (the same relay, by hand), and from a directory here against
plain `rsync` over ssh."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fleet_testbed import simhost
from fleet_testbed.fakehub import FakeHub, Repo, make_model

REPO_ID = "acme/bench-model"


def bench_pull(
    sb: simhost.Sandbox,
    env: dict[str, str],
    fleet: Callable[..., subprocess.CompletedProcess[str]],
    row: Callable[..., str],
    runs: int,
    title: str,
    shards: int = 8,
    shard_mib: int = 32,
) -> list[str]:
    spec = sb.specs[1]
    host = sb.host_dir(spec.name)
    source = make_model(sb.root / "bench-hub" / "model", shards=shards, shard_bytes=shard_mib << 20)
    size_mib = sum(p.stat().st_size for p in source.iterdir()) / (1 << 20)
    hub = FakeHub()
    hub.add(REPO_ID, Repo(source))
    repo_files = hub.repos[REPO_ID].files()  # read and hashed once, before anything is timed
    playbook = sb.root / "bench-pull.yaml"
    playbook.write_text(
        "engine: sglang\nmodel: bench-pulled\nserved_name: bench\n"
        f"hf_repo: {REPO_ID}\n"
        'smoke:\n  prompt: "Say hi"\n  expect: "(?i)hi"\n  any_answer: true\n'
    )
    pulled = host / "models" / "bench-pulled"
    env = {**env, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("HF_TOKEN", None)
    hf_on_host = f"{host}/env/bin/python -m huggingface_hub.cli.hf download {REPO_ID} --local-dir {host}/models/by-hand"
    local_dir = sb.root / "bench-local"
    hf = str(Path(sys.executable).parent / "hf")

    def plain_ssh() -> None:
        remote = f"HF_ENDPOINT={hub.url} HF_HUB_DISABLE_PROGRESS_BARS=1 {hf_on_host} >/dev/null"
        subprocess.run([*simhost.ssh_argv(sb, spec), remote], check=True, capture_output=True, timeout=300)
        shutil.rmtree(host / "models" / "by-hand")

    def plain_local() -> None:
        subprocess.run(
            [hf, "download", REPO_ID, "--local-dir", str(local_dir)],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
        shutil.rmtree(local_dir)

    def fleet_pull() -> None:
        r = fleet(env, "pull", str(playbook), "--host", spec.name)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        shutil.rmtree(pulled)

    try:
        ssh_floor = _timed(runs, plain_ssh)
        local = _timed(runs, plain_local)
        fleets = _timed(runs, fleet_pull)
        fleet(env, "pull", str(playbook), "--host", spec.name)
        verified = _timed(runs, lambda: _ok(fleet(env, "pull", str(playbook), "--host", spec.name)))
    finally:
        hub.close()
        shutil.rmtree(pulled, ignore_errors=True)
    floor = statistics.median(ssh_floor)
    mib_s = f"{size_mib / floor:.0f} MiB/s"
    return [
        title,
        "",
        f"{len(repo_files)} files, {size_mib:.0f} MiB, from a local stand-in for the Hub on loopback.",
        "",
        "| what | median | min | max | vs floor | notes |",
        "| --- | --- | --- | --- | --- | --- |",
        row("plain `ssh host hf download` (floor)", ssh_floor, floor, mib_s),
        row("plain `hf download` on this machine", local, floor),
        row("`fleet pull` (disk check, progress, every sha256, rename)", fleets, floor),
        row("`fleet pull` of a model already there (verified)", verified, floor, "nothing fetched"),
        "",
    ]


def _timed(runs: int, fn: Callable[[], None]) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _ok(r: subprocess.CompletedProcess[str]) -> None:
    if r.returncode != 0 or "already there" not in r.stdout:
        raise RuntimeError(r.stdout + r.stderr)


def bench_push(
    sb: simhost.Sandbox,
    env: dict[str, str],
    fleet: Callable[..., subprocess.CompletedProcess[str]],
    row: Callable[..., str],
    runs: int,
    title: str,
    shards: int = 4,
    shard_mib: int = 16,
) -> list[str]:
    a, b = sb.specs[0], sb.specs[1]
    on_a, on_b = sb.host_dir(a.name) / "models", sb.host_dir(b.name) / "models"
    source = make_model(on_a / "bench-pushed", shards=shards, shard_bytes=shard_mib << 20)
    here = make_model(sb.root / "bench-here" / "bench-pushed", shards=shards, shard_bytes=shard_mib << 20)
    size_mib = sum(p.stat().st_size for p in source.iterdir()) / (1 << 20)
    playbook = sb.root / "bench-push.yaml"
    playbook.write_text(
        "engine: sglang\nmodel: bench-pushed\nserved_name: bench\n"
        'smoke:\n  prompt: "hi"\n  expect: "hi"\n  any_answer: true\n'
    )
    pushed, by_hand = on_b / "bench-pushed", on_b / "by-hand"
    ssh_a, ssh_b = simhost.ssh_argv(sb, a), simhost.ssh_argv(sb, b)
    rsh = " ".join(ssh_b[:-1])

    def tar_relay() -> None:
        send = subprocess.Popen([*ssh_a, f"tar -C {source} -cf - ."], stdout=subprocess.PIPE)
        subprocess.run(
            [*ssh_b, f"mkdir -p {by_hand} && tar -C {by_hand} -xf -"], stdin=send.stdout, check=True, timeout=300
        )
        assert send.stdout is not None
        send.stdout.close()
        if send.wait(timeout=60) != 0:
            raise RuntimeError("tar on the source failed")
        shutil.rmtree(by_hand)

    def rsync_here() -> None:
        subprocess.run(["rsync", "-a", "-e", rsh, f"{here}/", f"{b.address}:{by_hand}/"], check=True, timeout=300)
        shutil.rmtree(by_hand)

    def push(source_name: str) -> Callable[[], None]:
        def one() -> None:
            r = fleet(env, "pull", str(playbook), "--host", b.name, "--from", source_name)
            if r.returncode != 0 or "pushed" not in r.stdout:
                raise RuntimeError(r.stdout + r.stderr)
            shutil.rmtree(pushed)

        return one

    try:
        relay_floor = _timed(runs, tar_relay)
        fleets = _timed(runs, push(a.name))
        rsyncs = _timed(runs, rsync_here) if shutil.which("rsync") else []
        from_here = _timed(runs, push(str(here)))
        fleet(env, "pull", str(playbook), "--host", b.name, "--from", a.name)
        present = _timed(runs, lambda: _ok(fleet(env, "pull", str(playbook), "--host", b.name, "--from", a.name)))
    finally:
        for path in (source, here, pushed, by_hand):
            shutil.rmtree(path, ignore_errors=True)
    floor = statistics.median(relay_floor)
    rows = [
        title,
        "",
        f"{shards + 3} files, {size_mib:.0f} MiB, host to host on loopback through this machine.",
        "",
        "| what | median | min | max | vs floor | notes |",
        "| --- | --- | --- | --- | --- | --- |",
        row("plain `ssh A tar c` piped to `ssh B tar x` (floor)", relay_floor, floor, f"{size_mib / floor:.0f} MiB/s"),
        row("`fleet pull --from A` (listing, resume plan, sha256 per file, checks, rename)", fleets, floor),
    ]
    if rsyncs:
        rows.append(row("plain `rsync -a` of a directory here to B", rsyncs, floor))
    rows += [
        row("`fleet pull --from ./dir` (a directory here)", from_here, floor),
        row("`fleet pull --from A` of a model already there", present, floor, "nothing sent"),
        "",
    ]
    return rows
