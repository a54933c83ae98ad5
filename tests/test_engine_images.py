"""`fleet engine pull`: an engine's container image pulled onto a host (reached by `connection: local`) from
a real registry on loopback (Debian's docker-registry) with the host's podman, its progress streamed, and
the engine version read inside it as a deploy reads it; a playbook naming it then plans with that
version."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fleet_testbed import simhost

pytestmark = pytest.mark.containers

PORT = 5051


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Path]]:
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.fail("podman (as root) is needed: run `make test` (it installs podman, runc and docker-registry)")
    from fleet_testbed import images
    from fleet_testbed.registry import Registry

    reg = Registry(tmp_path / "registry", PORT)
    try:
        ref = reg.push(images.sim_sglang("0.5.23"), "sglang:v0.5.23-test")
        subprocess.run(["podman", "rmi", "--ignore", ref], check=True, capture_output=True)
        monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(reg.registries_conf))
        yield ref, tmp_path
    finally:
        subprocess.run(["podman", "rmi", "--ignore", f"{reg.address}/sglang:v0.5.23-test"], capture_output=True)
        reg.close()


def test_an_engine_image_is_pulled_from_a_registry_its_version_read_and_a_playbook_plans_with_it(
    registry: tuple[str, Path],
) -> None:
    ref, tmp_path = registry
    h = simhost.build_host(tmp_path, simhost.CT129)  # SGLang 0.5.11 in its own environment
    for dev in (h / "dev").glob("nvidia*"):  # character devices, as a simulated host's containers get them
        dev.unlink()
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "hosts:\n  ct129:\n    connection: local\n"
        f"    engines: {{sglang: {h}/env/bin/python}}\n    gpu_devices: {h}/dev/nvidia*\n"
        f"    models_dir: {h}/models\n    state_dir: {h}/state\n    log_dir: {h}/logs\n"
    )
    r = run_cli("-i", str(inventory), "engine", "pull", ref, "--host", "ct129", "--container", "podman")
    assert r.code == 0, r.err
    assert f"{ref} pulled with podman" in r.out and "sglang 0.5.23" in r.out
    assert "Writing manifest" in r.err or "Copying" in r.err  # the registry's pull, streamed
    assert subprocess.run(["podman", "image", "exists", ref]).returncode == 0

    playbook = tmp_path / "qwen36-27b.yaml"
    playbook.write_text(
        (ROOT / "playbooks" / "qwen36-27b.yaml").read_text()
        + f"runtime:\n  container: podman\n  image: {ref}\n  pull: never\n"
    )
    plan = json.loads(run_cli("-i", str(inventory), "plan", str(playbook), "--host", "ct129", "--json").out)
    assert plan["plan"] is not None, plan["verdicts"]
    assert plan["plan"]["engine_version"] == "0.5.23"


def test_a_pull_that_fails_says_what_the_runtime_said_and_bad_input_changes_nothing(
    registry: tuple[str, Path],
) -> None:
    ref, tmp_path = registry
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"hosts:\n  box:\n    connection: local\n    engines: {{sglang: {sys.executable}}}\n")
    r = run_cli(
        "-i",
        str(inventory),
        "engine",
        "pull",
        ref.replace("v0.5.23-test", "v9.9.9"),
        "--host",
        "box",
        "--container",
        "podman",
    )
    assert r.code == 7 and "pull" in r.err and "manifest unknown" in r.err.lower()
    r = run_cli("-i", str(inventory), "engine", "pull", ref, "--host", "box")
    assert r.code == 2 and "Pass --container podman" in r.err
    r = run_cli("-i", str(inventory), "engine", "pull", "Bad Image\nname", "--host", "box", "--container", "podman")
    assert r.code == 2 and "is not an image reference" in r.err and "Bad Image\nname" not in r.err
