"""`make bench`, section 7: `fleet pull` of a model from a local stand-in for the Hub (fleet_testbed.fakehub)
onto a simulated host over real SSH, against the floor: the same files fetched by the same client with
the plain command, `hf download` run on the host over plain `ssh` (and `hf download` on this machine).
fleet does more than the floor: the disk check, progress, the checksums and headers of every file, and
the rename into place; the last row is a second pull of a model already there (verified, not fetched)."""

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
        'smoke:\n  prompt: "Say hi"\n  expect: "(?i)hi"\n'
    )
    pulled = host / "models" / "bench-pulled"
    env = {**env, "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    env.pop("HF_TOKEN", None)
    hf_on_host = f"{host}/env/bin/python -m huggingface_hub.cli.hf download {REPO_ID} --local-dir {host}/models/by-hand"
    local_dir = sb.root / "bench-local"
    hf = str(Path(sys.executable).parent / "hf")

    def plain_ssh() -> None:
        remote = f"HF_ENDPOINT={hub.url} HF_HUB_DISABLE_PROGRESS_BARS=1 {hf_on_host} >/dev/null"
        subprocess.run([*simhost.ssh_argv(sb, spec), remote], check=True, capture_output=True)
        shutil.rmtree(host / "models" / "by-hand")

    def plain_local() -> None:
        subprocess.run(
            [hf, "download", REPO_ID, "--local-dir", str(local_dir)], env=env, check=True, capture_output=True
        )
        shutil.rmtree(local_dir)

    def fleet_pull() -> None:
        r = fleet(env, "pull", str(playbook), "--host", spec.name)
        if r.returncode != 0:
            raise RuntimeError(r.stderr)
        shutil.rmtree(pulled)

    def timed(fn: Callable[[], None]) -> list[float]:
        out = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    try:
        ssh_floor = timed(plain_ssh)
        local = timed(plain_local)
        fleets = timed(fleet_pull)
        fleet(env, "pull", str(playbook), "--host", spec.name)
        verified = timed(lambda: _ok(fleet(env, "pull", str(playbook), "--host", spec.name)))
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


def _ok(r: subprocess.CompletedProcess[str]) -> None:
    if r.returncode != 0 or "already there" not in r.stdout:
        raise RuntimeError(r.stdout + r.stderr)
