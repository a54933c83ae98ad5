"""`make tour` as a newcomer runs it: each part's real `fleet` commands on its own simulated hosts, read
for what each command must have said (the structure of the output, not its sentences)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from fleet_testbed import nshost

pytestmark = [pytest.mark.ssh, pytest.mark.skipif(not nshost.available(), reason="needs root, unshare and nsenter")]


def own_environment() -> dict[str, str]:
    """This process's environment without the test session's fleet settings: the run's own hosts only."""
    session = ("FLEET_INVENTORY", "FLEET_PLAYBOOKS", "FLEET_SERVICES", "FLEET_KNOWN_HOSTS", "FLEET_SSH_CONFIG")
    kept = {k: v for k, v in os.environ.items() if k not in session}
    return {**kept, "PYTHONPATH": str(ROOT / "testbed"), "SIM_SPEED": "0"}


def tour(tmp_path: Path, *parts: str) -> str:
    env = own_environment()
    done = subprocess.run(
        [sys.executable, "-m", "fleet_testbed.tour", *parts, "--root", str(tmp_path), "--port", "2344", "--net", "19"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # as a terminal shows them: each command's progress under its own line
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    assert not list(tmp_path.glob("*/*/sshd.outer.pid")), "a part left its hosts up"
    return done.stdout


def part(out: str, name: str) -> str:
    """What the tour printed for one part."""
    return out.split(f"=== {name}: ", 1)[1].split("\n=== ", 1)[0]


def after(out: str, command: str) -> str:
    """What `fleet COMMAND` printed in the tour, up to its [time, exit] line."""
    return out.split(f"$ fleet {command}\n", 1)[1].split("\n[", 1)[0]


def test_the_service_group_and_pull_parts_run_as_shown(tmp_path: Path) -> None:
    both = tour(tmp_path, "service", "group", "pull")
    out = part(both, "service")
    assert "service qwen36 is up at http://127.0.19.3:30080" in after(out, "up qwen36")
    rolled = after(out, "restart qwen36")
    for replica in ("ct129/qwen36-1", "blackwell/qwen36-2"):  # each out of the router, restarted, back in
        assert rolled.index(f"{replica}: deregistered") < rolled.index(f"{replica}: registered")
    assert "router stopped" in after(out, "down qwen36")
    out = part(both, "group")
    deployed = after(out, "deploy two-nodes")
    assert "node-a: ready; smoke answer ' Paris.'" in deployed and "two-nodes over node-a, node-b is up" in deployed
    rows = [line.split() for line in after(out, "status").splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows if r[0].endswith("two-nodes")] == [
        ("node-a/two-nodes", "ready"),
        ("node-b/two-nodes", "ready"),
    ]
    logged = after(out, "logs -H node-a/two-nodes -H node-b/two-nodes -n 2").splitlines()
    assert sorted({line.split(" | ", 1)[0] for line in logged}) == ["node-a/two-nodes", "node-b/two-nodes"]
    assert len(logged) == 4
    out = part(both, "pull")
    pulled = after(out, "pull qwen36-27b --host ct129")
    assert "pulled Qwen/Qwen3.6-27B@" in pulled and "sizes and 5 checksums verified" in pulled
    assert "ct129: qwen36-27b is up at" in after(out, "deploy qwen36-27b --host ct129")  # the pulled model, served


def test_the_hubs_stand_in_serves_a_directory_as_a_command(tmp_path: Path) -> None:
    """`python -m fleet_testbed.fakehub REPO=DIR`: what a reader runs to try `fleet pull` by hand."""
    import json
    import urllib.request

    (tmp_path / "config.json").write_text("{}")
    hub = subprocess.Popen(
        [sys.executable, "-m", "fleet_testbed.fakehub", f"acme/tiny={tmp_path}"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "testbed")},
    )
    try:
        assert hub.stdout is not None and hub.stdout.readline().startswith("serving acme/tiny")
        url = hub.stdout.readline().split("HF_ENDPOINT=", 1)[1].strip()
        with urllib.request.urlopen(f"{url}/api/models/acme/tiny/revision/main", timeout=30) as r:
            assert [f["rfilename"] for f in json.loads(r.read())["siblings"]] == ["config.json"]
    finally:
        hub.terminate()
        hub.communicate(timeout=30)


@pytest.mark.containers
def test_the_container_part_runs_as_shown(tmp_path: Path) -> None:
    if shutil.which("podman") is None:
        pytest.fail("podman (as root) is needed: run `make test` (it installs podman, runc and debootstrap)")
    out = tour(tmp_path, "container")
    assert "is up at http://127.0.19.2:30000" in after(out, "deploy qwen35-box --host blackwell")
    row = after(out, "status").splitlines()[1].split()
    assert row[:2] == ["blackwell/qwen35-box", "ready"] and "fleet-qwen35-box" in row
    assert len(after(out, "logs -H blackwell/qwen35-box -n 3").splitlines()) == 3
    assert "stopped" in after(out, "stop --host blackwell/qwen35-box")


def test_the_demo_runs_beside_another_sandbox_in_its_own_directory_port_and_addresses(tmp_path: Path) -> None:
    """`make demo DEMO_ARGS=...` as the README gives it, with FLEET_SANDBOX naming its directory."""
    env = {**own_environment(), "FLEET_SANDBOX": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "fleet_testbed.demo", "--port", "2345", "--net", "21"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-6000:]
    out = done.stdout
    assert "real sshd on 127.0.21.2 and 127.0.21.3, port 2345" in out
    rows = [line.split() for line in after(out, "status").splitlines()]
    assert rows[0][:2] == ["DEPLOYMENT", "STATUS"] and ["ct129/qwen36-27b", "ready"] in [r[:2] for r in rows]
    assert (tmp_path / "inventory.yaml").exists() and not list(tmp_path.glob("*/sshd.outer.pid"))  # down after
