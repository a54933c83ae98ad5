"""The host side of containers against real podman (no sshd): fleet's launcher as a container's PID 1,
and what `inspect` says of a container the kernel OOM-killed. Needs root and podman (`make test`
installs it) and the test images (`make images`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.host.common import LAUNCH_MARK
from fleet.host.container import containers, inspect
from fleet.host.launch import CONTAINER_LAUNCHER, launch
from fleet.protocol import LaunchRequest

pytestmark = pytest.mark.containers


@pytest.fixture(scope="module")
def image() -> str:
    if shutil.which("podman") is None or os.geteuid() != 0:
        pytest.fail("podman (as root) is needed: run `make test` (it installs podman, runc and debootstrap)")
    from fleet_testbed import images

    return images.sim_sglang("0.5.11")


@pytest.fixture
def name() -> Iterator[str]:
    chosen = f"fleet-hosttest-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    yield chosen
    subprocess.run(["podman", "rm", "-f", "-t", "0", chosen], capture_output=True)


def wait_for(what: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


ENGINE = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('drained', flush=True), sys.exit(3)))\n"
    "print('token', os.environ.get('HF_TOKEN'), flush=True)\n"
    "time.sleep(120)\n"
)


def test_fleets_launcher_gives_the_engine_its_secret_passes_stop_on_and_records_the_exit(
    tmp_path: Path, image: str, name: str
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    secret = secrets / "env-x-1.json"
    secret.write_text(json.dumps({"HF_TOKEN": "hf_launcher_secret_77"}))
    secret.chmod(0o600)
    log, exit_file = tmp_path / "x.log", tmp_path / "x.exit"
    run = ["podman", "run", "-d", "--name", name, "--label", "test=fleet-host", "-v", f"{tmp_path}:{tmp_path}"]
    run += ["-v", f"{secrets}:/run/fleet-secrets", "--entrypoint", "python3", image]
    run += ["-c", CONTAINER_LAUNCHER, LAUNCH_MARK, str(exit_file), str(log), "/run/fleet-secrets/env-x-1.json"]
    started = subprocess.run([*run, "python3", "-c", ENGINE], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    wait_for(lambda: "token hf_launcher_secret_77" in (log.read_text() if log.exists() else ""))
    assert not secret.exists()  # read once, then deleted
    shown = subprocess.run(["podman", "inspect", name], capture_output=True, text=True).stdout
    assert "hf_launcher_secret_77" not in shown
    state = inspect("podman", name)
    assert state is not None and state["running"] and state["pid"] > 0
    listed, error = containers("podman", "test=fleet-host")
    assert error is None and [c["name"] for c in listed] == [name] and listed[0]["labels"]["test"] == "fleet-host"
    t0 = time.monotonic()
    subprocess.run(["podman", "stop", "-t", "20", name], capture_output=True, check=True)
    assert time.monotonic() - t0 < 10  # SIGTERM reached the engine: no wait for the SIGKILL
    assert "drained" in log.read_text() and exit_file.read_text().strip() == "3"
    assert inspect("podman", name)["exit_code"] == 3  # type: ignore[index]


def test_a_container_killed_at_its_memory_limit_is_read_as_the_runtime_reports_it(
    image: str, name: str, tmp_path: Path
) -> None:
    """The kernel kills it (exit 137). Whether the runtime also sets OOMKilled depends on the host's cgroups:
    podman 4.3 on this machine's hybrid cgroup v1 hierarchy does not (measured), so fleet reports the flag
    exactly as `inspect` has it and diagnoses the exit as a SIGKILL either way. (Its conmon writes an empty
    file `oom` into the directory `podman run` was started in: a temporary one, not the checkout.)"""
    hungry = "x = bytearray(1 << 30)\nimport time\ntime.sleep(30)\n"
    run = ["podman", "run", "-d", "--name", name, "--memory", "64m", "--memory-swap", "64m"]
    started = subprocess.run(
        [*run, "--entrypoint", "python3", image, "-c", hungry], capture_output=True, text=True, cwd=tmp_path
    )
    assert started.returncode == 0, started.stderr
    wait_for(lambda: not (inspect("podman", name) or {}).get("running", True))
    state = inspect("podman", name)
    raw = json.loads(subprocess.run(["podman", "inspect", name], capture_output=True, text=True).stdout)[0]
    assert state is not None and state["exit_code"] == 137 and not state["running"]
    assert state["oom_killed"] is raw["State"]["OOMKilled"]


def podman_launch(
    image: str, name: str, options: list[str], argv: list[str], logs: Path, secrets: Path
) -> LaunchRequest:
    """fleet's launch of `argv` in `image` as container `name` under podman, with `options` before its own."""
    return {
        "name": "tested",
        "attempt": 1,
        "argv": argv,
        "env": {},
        "log_dir": str(logs),
        "container": {
            "cli": "podman",
            "image": image,
            "name": name,
            "options": [*options, "-v", f"{secrets}:/run/fleet-secrets"],
            "python": "python3",
            "secrets_dir": str(secrets),
            "secrets_mount": "/run/fleet-secrets",
        },
    }


def test_fleets_own_run_of_a_container_killed_at_its_memory_limit_leaves_nothing_where_fleet_was_started(
    image: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conmon's `oom` file lands in the attempt's log directory, not in the directory the host step runs in
    (on a real host: the user's home)."""
    home, logs, secrets = tmp_path / "home", tmp_path / "logs", tmp_path / "secrets"
    home.mkdir()
    monkeypatch.chdir(home)
    go = logs / "go"  # it takes its memory only once it is running: launch must see it started
    hungry = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nx = bytearray(1 << 30)\n"
    options = ["--name", name, "--memory", "64m", "--memory-swap", "64m", "-v", f"{logs}:{logs}"]
    launched = launch(podman_launch(image, name, options, ["python3", "-c", hungry], logs, secrets), {})
    assert launched["pid"] > 0
    go.touch()
    wait_for(lambda: not (inspect("podman", name) or {}).get("running", True))
    assert inspect("podman", name)["exit_code"] == 137  # type: ignore[index]
    assert list(home.iterdir()) == []


def test_a_launch_that_finds_its_name_taken_leaves_the_other_container_running(
    image: str, name: str, tmp_path: Path
) -> None:
    """Another fleet's container took the name after fleet looked (two owners launching one deployment
    name at once): fleet's run fails, the other container runs on, and fleet's own failed run leaves
    nothing behind. Real podman writes the id of what a run made to --cidfile, and no file for a run
    that made nothing."""
    theirs = subprocess.run(["podman", "run", "-d", "--name", name, "--entrypoint", "sleep", image, "600"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    logs, secrets = tmp_path / "logs", tmp_path / "secrets"
    sleeper = ["python3", "-c", "import time; time.sleep(600)"]
    launched = launch(podman_launch(image, name, ["--name", name], sleeper, logs, secrets), {"HF_TOKEN": "hf_x"})
    assert launched["pid"] == -1 and launched["container"] == {"cli": "podman", "name": name, "id": None}
    assert "already in use" in Path(launched["log"]).read_text()
    state = inspect("podman", name)
    assert state is not None and state["running"] and state["id"] == theirs
    assert sorted(p.suffix for p in logs.iterdir()) == [".exit", ".log", ".log"]  # and NAME.latest.log
    assert list(secrets.iterdir()) == []


def test_the_engine_check_in_a_container_killed_at_its_memory_limit_leaves_nothing_where_fleet_was_started(
    image: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's check runs in the deployment's image too (`run --rm`): conmon's `oom` file lands in a
    directory of the check's own, removed with it, not in the directory the host step runs in."""
    from fleet.host.check import engine_check

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.chdir(home)
    request = {
        "engine": "sglang",
        "python": "python3",
        "args": [],
        "prelude": "x = bytearray(1 << 30)\n",  # before the check's own code: killed at the limit
        "container": {
            "cli": "podman",
            "name": name,
            "image": image,
            "options": ["--memory", "64m", "--memory-swap", "64m"],
        },
    }
    checked = engine_check(request, lambda: False)  # type: ignore[arg-type]
    assert checked["verdict"] != "accepted", checked
    assert list(home.iterdir()) == []


def test_an_engine_check_whose_client_left_has_its_own_container_removed_by_id(image: str, name: str) -> None:
    """The client went while the check ran in its container: that container (the one the check's run
    made, named by the id the runtime wrote) is removed; nothing is removed by name."""
    from fleet.host.check import engine_check

    started = time.monotonic()
    request = {
        "engine": "sglang",
        "python": "python3",
        "args": [],
        "prelude": "import time; time.sleep(600)\n",
        "container": {"cli": "podman", "name": name, "image": image, "options": []},
    }
    running = lambda: (inspect("podman", name) or {}).get("running", False)  # noqa: E731
    checked = engine_check(request, lambda: running() or time.monotonic() - started > 60)  # type: ignore[arg-type]
    assert checked["verdict"] == "client_gone"
    assert inspect("podman", name) is None  # the check's own container, gone
