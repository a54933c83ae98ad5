"""Deployments in real podman containers on the simulated blackwell, over real sshd.

The images are made here (fleet_testbed.images: a Debian rootfs with python3 and the simulated SGLang at
the tag's version). The host's GPU device files are character devices (mknod), mapped into the
container with --device, as a host without the NVIDIA runtime would need them; the simulated engine in
the container registers its GPU memory by its pid namespace, and NVML (the stand-in) reports it by host
pid, as the real one does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import BLACKWELL, ROOT, run_cli
from fleet.host.common import container_owner
from fleet_testbed import simhost
from simengine import chat, wait_until

pytestmark = [pytest.mark.ssh, pytest.mark.containers]


def _podman_works() -> bool:
    return shutil.which("podman") is not None and os.geteuid() == 0


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    if not _podman_works():
        pytest.fail("podman (as root) is needed: run `make test` (it installs podman, runc and debootstrap)")
    from fleet_testbed import images as built

    return {v: built.sim_sglang(v) for v in ("0.5.11", "0.5.23")}


def _remove_fleet_containers(hdir: Path) -> None:
    """This sandbox's fleet's containers (its state directory's owner label) and the ones its tests plant
    as another's: another fleet's on this machine (another sandbox's, the real vLLM test's) are theirs."""
    owner = container_owner(os.getuid(), str(hdir / "state"))
    listed = subprocess.run(
        ["podman", "ps", "-a", "-q", "--filter", f"label=fleet.owner={owner}"], capture_output=True, text=True
    )
    ids = listed.stdout.split()
    planted = subprocess.run(
        ["podman", "ps", "-a", "-q", "--filter", f"label=fleet-test.sandbox={hdir}"], capture_output=True, text=True
    )
    ids += planted.stdout.split()
    others = subprocess.run(["podman", "ps", "-a", "-q", "--filter", "name=^foreign-"], capture_output=True, text=True)
    ids += others.stdout.split()
    if ids:
        subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True)


@pytest.fixture
def container_host(
    fleet_env: simhost.Sandbox, images: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """blackwell with character-device GPUs and a playbook dir whose playbooks run in containers."""
    hdir = fleet_env.host_dir("blackwell")
    _remove_fleet_containers(hdir)
    devices = sorted((hdir / "dev").glob("nvidia*"))
    for dev in devices:
        dev.unlink()
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, as the driver's are
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(playbooks))
    try:
        yield hdir
    finally:
        _remove_fleet_containers(hdir)
        for dev in devices:
            dev.unlink(missing_ok=True)
            dev.write_text("")


def write_playbook(
    d: Path, hdir: Path, name: str, image: str, *, base: str = "qwen35-nvfp4", extra: str = "", cli: str = "podman"
) -> None:
    from fleet_testbed.images import container_playbook

    (d / f"{name}.yaml").write_text(container_playbook(hdir, image, base=base, extra=extra, cli=cli))


def follow_sees_a_request(hdir: Path) -> bool:
    """`fleet logs --follow` prints what the engine in the container writes after it started following."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "testbed")}
    follow = subprocess.Popen(
        [str(Path(sys.executable).parent / "fleet"), "logs", "--host", "blackwell/qwen35-box", "--follow", "-n", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    timer = threading.Timer(30, follow.kill)  # a follow that never shows the line must not hang the suite
    timer.start()
    try:
        assert follow.stdout is not None and follow.stdout.readline()  # following
        assert chat(BLACKWELL.address, 30000, "The capital of France?", served="qwen35")[0] == 200
        return any('"POST /v1/chat/completions' in line for line in iter(follow.stdout.readline, ""))
    finally:
        timer.cancel()
        follow.send_signal(signal.SIGINT)
        follow.communicate(timeout=10)


def container_check(health_json: str) -> tuple[str, str]:
    checks = json.loads(health_json.splitlines()[0])["checks"]
    found = next(c for c in checks if c["name"] == "container")
    return found["status"], found["detail"]


def podman_json(*args: str) -> list[dict[str, object]]:
    done = subprocess.run(["podman", *args, "--format", "json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    return json.loads(out)


def test_the_motivating_deploy_runs_in_a_container_with_the_images_engine_version(
    container_host: Path, images: dict[str, str], fleet_env: simhost.Sandbox
) -> None:
    hdir = container_host
    simhost.set_host(hdir, sglang_version="0.5.23")  # the host's own environment: not what the image runs
    playbooks = Path(os.environ["FLEET_PLAYBOOKS"])
    # the hand-written command of the story, run as written: NEXTN on a hybrid model without a mamba strategy
    handwritten = (
        "literal: true\n"
        "extra_args: [--tp, '8', --speculative-algorithm, NEXTN, --speculative-num-draft-tokens, '2',"
        " --speculative-eagle-topk, '1']\n"
        "secret_env: [HF_TOKEN]\n"
    )
    write_playbook(playbooks, hdir, "qwen35-box", images["0.5.11"], extra=handwritten)
    secret = "hf_container_secret_5e3c"
    os.environ["HF_TOKEN"] = secret
    try:
        plan = run_cli("plan", "qwen35-box", "--host", "blackwell", "--json")
        assert plan.code == 0, plan.err
        shown = json.loads(plan.out)
        assert shown["plan"]["engine_version"] == "0.5.11"
        run = shown["plan"]["container"]["run"]
        assert run[:3] == ["podman", "run", "-d"] and "--entrypoint" in run
        assert run[3:5] == ["--name", "fleet-qwen35-box"]

        r = run_cli("deploy", "qwen35-box", "--host", "blackwell")
        assert r.code == 0, r.err
        # the NEXTN crash of 0.5.11 inside the container, recognised, fixed, relaunched
        assert "sglang-spec-hybrid-no-buffer" in r.err and "--mamba-scheduler-strategy extra_buffer" in r.err
        rec = json.loads(simhost.record(hdir, "state.json", "qwen35-box").read_text())
        assert rec["status"] == "ready" and rec["engine_version"] == "0.5.11"
        assert rec["container"]["name"] == "fleet-qwen35-box"
        listed = podman_json("ps", "--filter", "label=fleet.deployment=qwen35-box")
        assert [c["Names"] for c in listed] == [["fleet-qwen35-box"]]
        assert listed[0]["Labels"]["fleet.playbook"] == "qwen35-box"
        # the secret reached the engine, and is in no option, no `inspect`, no state and no command line
        inspected = subprocess.run(["podman", "inspect", "fleet-qwen35-box"], capture_output=True, text=True).stdout
        assert secret not in inspected
        assert secret not in json.dumps(rec)
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert secret not in ps
        assert not list((hdir / "state" / "deployments" / "qwen35-box" / "secrets").iterdir())
        logs = run_cli("logs", "--host", "blackwell/qwen35-box", "-n", "200")
        assert logs.code == 0 and "fired up" in logs.out
        assert follow_sees_a_request(hdir)

        status = json.loads(run_cli("status", "--host", "blackwell", "--json").out)
        assert (status["deployment"], status["container"], status["status"]) == (
            "qwen35-box",
            "fleet-qwen35-box",
            "ready",
        )
        facts = json.loads(run_cli("facts", "--host", "blackwell", "--json").out)
        shown = [(c["name"], c["labels"].get("fleet.deployment")) for c in facts["containers"]]
        assert shown == [("fleet-qwen35-box", "qwen35-box")]
        health = run_cli("health", "--host", "blackwell/qwen35-box", "--json")
        assert health.code == 0, health.out + health.err
        assert container_check(health.out) == ("ok", "container fleet-qwen35-box running")

        # the same plan again: the container proved itself and is kept
        kept = run_cli("deploy", "qwen35-box", "--host", "blackwell")
        assert kept.code == 0 and "already running this plan" in kept.out, kept.err
        # a restart: the stale container is stopped and removed, the GPUs proven free, a new one started
        again = run_cli("restart", "--host", "blackwell/qwen35-box")
        assert again.code == 0, again.err
        assert "fleet's container of deployment qwen35-box" in again.err
        after = json.loads(simhost.record(hdir, "state.json", "qwen35-box").read_text())
        assert after["container"]["id"] != rec["container"]["id"]
        assert len(podman_json("ps", "-a", "--filter", "label=fleet.deployment=qwen35-box")) == 1

        # the container killed behind fleet's back: health says so, and --heal starts it again
        on_host = simhost.ssh_argv(fleet_env, BLACKWELL)
        subprocess.run([*on_host, "podman", "kill", "fleet-qwen35-box"], capture_output=True, check=True)
        sick = run_cli("health", "--host", "blackwell/qwen35-box", "--json")
        assert sick.code == 2, sick.out + sick.err
        assert container_check(sick.out)[0] == "critical" and "is exited" in container_check(sick.out)[1]
        healed = run_cli("health", "--host", "blackwell/qwen35-box", "--heal")
        assert "restarted: server ready" in healed.out + healed.err, healed.out + healed.err
        assert podman_json("ps", "--filter", "label=fleet.deployment=qwen35-box")[0]["State"] == "running"

        stop = run_cli("stop", "--host", "blackwell/qwen35-box")
        assert stop.code == 0, stop.err
        assert podman_json("ps", "-a", "--filter", "label=fleet.deployment=qwen35-box") == []
        facts = json.loads(run_cli("facts", "--host", "blackwell", "--json").out)
        assert all(not g["processes"] for g in facts["gpu"]["gpus"])
    finally:
        del os.environ["HF_TOKEN"]


def test_a_foreign_container_on_the_gpus_is_refused_without_force(
    container_host: Path, images: dict[str, str], fleet_env: simhost.Sandbox
) -> None:
    hdir = container_host
    playbooks = Path(os.environ["FLEET_PLAYBOOKS"])
    write_playbook(playbooks, hdir, "small", images["0.5.23"], base="qwen36-27b", extra="gpus: [6, 7]\n")
    # somebody's own SGLang container on GPU 7, started by hand (not fleet's: no labels)
    run = ["podman", "run", "-d", "--name", "foreign-sglang", "--network", "host", "-v", f"{hdir}:{hdir}"]
    run += ["-e", f"SIM_HOST_DIR={hdir}", "--entrypoint", "python3", images["0.5.23"]]
    run += ["-m", "fleet_testbed.sim_child", "sglang::scheduler", "7", "30000"]  # holds GPU 7, 30 GB
    foreign = subprocess.run([*simhost.ssh_argv(fleet_env, BLACKWELL), *run], capture_output=True, text=True)
    assert foreign.returncode == 0, foreign.stderr
    r = run_cli("deploy", "small", "--host", "blackwell")
    assert r.code == 6, r.err
    assert "foreign-sglang" in r.err and "not this deployment's" in r.err
    running = podman_json("ps", "--filter", "name=foreign-sglang")
    assert running and running[0]["State"] == "running"
    facts = json.loads(run_cli("facts", "--host", "blackwell", "--json").out)
    assert facts["gpu_holders"]["7"].startswith("container foreign-sglang (pids ")
    # --force: stopped through its runtime, and left there (exited) for its owner: it is not fleet's
    forced = run_cli("deploy", "small", "--host", "blackwell", "--force")
    assert forced.code == 0, forced.err
    assert "podman stop -t" in forced.err and "not removed: not fleet's" in forced.err
    ended = podman_json("ps", "-a", "--filter", "name=foreign-sglang")
    assert ended and ended[0]["State"] == "exited"

    # another fleet's container (another user, another state directory) with the name this one would give:
    # never removed, --force or not
    write_playbook(playbooks, hdir, "other", images["0.5.23"], base="qwen36-27b", extra="gpus: [4, 5]\n")
    squat = ["podman", "run", "-d", "--name", "fleet-other", "--network", "host", "--label", "fleet.deployment=other"]
    squat += [
        "--label",
        "fleet.owner=someone-else",
        "--label",
        f"fleet-test.sandbox={hdir}",
        "--entrypoint",
        "sleep",
        images["0.5.23"],
        "600",
    ]
    assert subprocess.run([*simhost.ssh_argv(fleet_env, BLACKWELL), *squat], capture_output=True).returncode == 0
    refused = run_cli("deploy", "other", "--host", "blackwell", "--force")
    assert refused.code == 6 and "is not this fleet's" in refused.err, refused.err
    assert podman_json("ps", "--filter", "name=fleet-other")[0]["State"] == "running"


def test_a_stop_never_sweeps_another_containers_engine(
    container_host: Path, images: dict[str, str], fleet_env: simhost.Sandbox
) -> None:
    """A podman container that is not fleet's, running an engine as fleet's user: `fleet stop` said "not
    stopped ... --force stops it" and then a sweep by name SIGKILLed it 2 s later, exit 0 (issue 39). Only
    the groups a stop itself stopped are swept now."""
    hdir = container_host
    run = ["podman", "run", "-d", "--name", "foreign-engine", "--network", "host", "-v", f"{hdir}:{hdir}"]
    run += ["-e", f"SIM_HOST_DIR={hdir}", "--entrypoint", "python3", images["0.5.23"]]
    run += ["-m", "fleet_testbed.sim_child", "sglang::scheduler", "7", "30001"]  # an engine's title, GPU 7
    started = subprocess.run([*simhost.ssh_argv(fleet_env, BLACKWELL), *run], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    stopped = run_cli("stop", "--host", "blackwell")
    assert stopped.code == 0, stopped.err
    assert "foreign-engine" in stopped.out and "--force stops it" in stopped.out
    running = podman_json("ps", "--filter", "name=foreign-engine")
    assert running and running[0]["State"] == "running"


def test_a_container_run_from_a_snapshot_of_fleets_is_not_fleets(
    container_host: Path, images: dict[str, str], fleet_env: simhost.Sandbox
) -> None:
    """`podman commit` copies the labels fleet gave its container into the image; a user's container run
    from that snapshot carries them. `fleet stop` stopped and removed it as the deployment's own."""
    playbooks = Path(os.environ["FLEET_PLAYBOOKS"])
    write_playbook(playbooks, container_host, "small", images["0.5.23"], base="qwen36-27b", extra="gpus: [6, 7]\n")
    assert run_cli("deploy", "small", "--host", "blackwell").code == 0
    snapshot = "localhost/fleet-test-snapshot:1"
    on_host = simhost.ssh_argv(fleet_env, BLACKWELL)
    try:
        assert (
            subprocess.run(
                [*on_host, "podman", "commit", "-q", "fleet-small", snapshot], capture_output=True
            ).returncode
            == 0
        )
        run = [
            "podman",
            "run",
            "-d",
            "--name",
            "foreign-snapshot",
            "--network",
            "host",
            "--entrypoint",
            "sleep",
            snapshot,
        ]
        run += ["600"]
        assert subprocess.run([*on_host, *run], capture_output=True).returncode == 0
        assert podman_json("inspect", "foreign-snapshot")[0]["Config"]["Labels"]["fleet.deployment"] == "small"  # type: ignore[index]
        stopped = run_cli("stop", "--host", "blackwell", "--name", "small")
        assert stopped.code == 0, stopped.err
        assert "foreign-snapshot" not in stopped.out
        assert podman_json("ps", "--filter", "name=foreign-snapshot")[0]["State"] == "running"
        assert podman_json("ps", "-a", "--filter", "name=^fleet-small$") == []
        # the snapshot run again under the name fleet gives, labels and all: its id is in no record of fleet's
        squat = ["podman", "run", "-d", "--name", "fleet-small", "--network", "host", "--entrypoint", "sleep"]
        assert subprocess.run([*on_host, *squat, snapshot, "600"], capture_output=True).returncode == 0
        refused = run_cli("deploy", "small", "--host", "blackwell")
        assert refused.code == 6 and "no record of this fleet names its id" in refused.err, refused.err
        assert run_cli("stop", "--host", "blackwell", "--name", "small").code == 0
        assert podman_json("ps", "--filter", "name=^fleet-small$")[0]["State"] == "running"
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", "foreign-snapshot", "fleet-small"], capture_output=True)
        subprocess.run(["podman", "rmi", "-f", snapshot], capture_output=True)


def test_forget_takes_the_exited_container_with_the_record(
    container_host: Path, images: dict[str, str], fleet_env: simhost.Sandbox
) -> None:
    """A container deployment that stopped by itself, forgotten: its container goes with its record (left
    behind, no record would prove it fleet's, and the next deploy of the name would refuse it)."""
    playbooks = Path(os.environ["FLEET_PLAYBOOKS"])
    write_playbook(playbooks, container_host, "small", images["0.5.23"], base="qwen36-27b", extra="gpus: [6, 7]\n")
    assert run_cli("deploy", "small", "--host", "blackwell").code == 0
    on_host = simhost.ssh_argv(fleet_env, BLACKWELL)
    assert subprocess.run([*on_host, "podman", "stop", "-t", "5", "fleet-small"], capture_output=True).returncode == 0
    forgot = run_cli("forget", "blackwell/small")
    assert forgot.code == 0, forgot.err
    assert podman_json("ps", "-a", "--filter", "name=^fleet-small$") == []
    assert run_cli("deploy", "small", "--host", "blackwell").code == 0


def test_a_container_deploys_when_the_hosts_engine_python_is_gone(
    container_host: Path,
    images: dict[str, str],
    fleet_env: simhost.Sandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container deployment's steps run under the host's engine Python (its NVML bindings), not the
    image's: where the inventory names one the host no longer has (its environment deleted), they run
    under python3, and the deployment in the container comes up all the same."""
    hdir = container_host
    inventory = tmp_path / "inventory.yaml"
    gone = hdir / "env-deleted" / "bin" / "python"
    inventory.write_text(fleet_env.inventory.read_text().replace(f"{hdir}/env/bin/python", str(gone)))
    assert str(gone) in inventory.read_text()
    monkeypatch.setenv("FLEET_INVENTORY", str(inventory))
    write_playbook(Path(os.environ["FLEET_PLAYBOOKS"]), hdir, "boxed", images["0.5.23"])
    deployed = run_cli("deploy", "boxed", "--host", "blackwell")
    assert deployed.code == 0, deployed.err
    rec = json.loads(simhost.record(hdir, "state.json", "boxed").read_text())
    assert rec["status"] == "ready" and rec["container"]["name"] == "fleet-boxed"
    assert run_cli("stop", "--host", "blackwell/boxed").code == 0


def test_pre_flight_refuses_what_cannot_run_before_anything_is_stopped(
    container_host: Path, images: dict[str, str]
) -> None:
    """An image built for a newer CUDA than the driver's; an image that is not there with pull: never; one
    that cannot be pulled (no registry is reachable here: the pull's own output is streamed); a docker
    whose daemon is not running. Each is refused with its reason and exit 4, and nothing is launched."""
    from fleet_testbed import images as built

    hdir = container_host
    playbooks = Path(os.environ["FLEET_PLAYBOOKS"])
    newer = built.sim_sglang("0.5.11", cuda="13.1.0")  # the simulated host's driver supports CUDA 13.0
    write_playbook(playbooks, hdir, "newer-cuda", newer)
    plan = run_cli("plan", "newer-cuda", "--host", "blackwell")
    assert plan.code == 4 and "[image-cuda]" in plan.out and "cuda>=13.1" in plan.out, plan.out

    write_playbook(playbooks, hdir, "absent", "localhost/fleet-absent:1", extra="")
    (playbooks / "absent.yaml").write_text(
        (playbooks / "absent.yaml").read_text().replace("image:", "pull: never\n  image:")
    )
    never = run_cli("deploy", "absent", "--host", "blackwell")
    assert never.code == 4 and "pull: never" in never.err and ": pull " not in never.err, never.err

    write_playbook(playbooks, hdir, "unpullable", "localhost/fleet-absent:1")
    pulled = run_cli("deploy", "unpullable", "--host", "blackwell")
    assert pulled.code == 4, pulled.err
    assert "blackwell: pull localhost/fleet-absent:1: " in pulled.err and "is not on the host" in pulled.err

    write_playbook(playbooks, hdir, "dockerless", images["0.5.11"], cli="docker")
    docker = run_cli("deploy", "dockerless", "--host", "blackwell")  # a client without its daemon, or none
    assert docker.code == 4 and ("is not on the host" in docker.err or "docker is not installed" in docker.err)
    assert podman_json("ps", "-a", "--filter", "label=fleet.deployment") == []
    assert not list((hdir / "logs").glob("*.log"))
    # each deploy started its act step beside the probe (fleet.step_ahead); refused, it never asked it,
    # and the step ended with the connection, having done nothing
    assert wait_until(lambda: not steps_started_ahead(), timeout=30), steps_started_ahead()


def steps_started_ahead() -> list[int]:
    """The host steps waiting for a request they were started ahead of (their one argument says so)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b'{"ahead": true}' in argv:
            found.append(int(pid))
    return found


def test_a_check_that_refuses_a_launch_already_started_takes_it_back(
    container_host: Path, images: dict[str, str]
) -> None:
    """With nothing in its way, the engine's check in the image (it holds no GPU) runs while the engine
    starts, so a new command line costs no container start before the launch. A refusal then removes the
    container, puts the record back as it was and says so in the attempt's log. With a server in the way
    the check comes first, and the server serves on."""
    hdir = container_host
    playbooks = Path(os.environ["FLEET_PLAYBOOKS"])
    good = "gpus: [6, 7]\n"
    bad = good + "extra_args: ['--watchdog-timeout', 'soon']\n"
    write_playbook(playbooks, hdir, "small", images["0.5.23"], base="qwen36-27b", extra=bad)
    refused = run_cli("deploy", "small", "--host", "blackwell")
    assert refused.code == 4, refused.err
    assert "invalid float value: 'soon'" in refused.err and "before anything on the host was stopped" in refused.err
    assert podman_json("ps", "-a", "--filter", "label=fleet.deployment=small") == []
    assert not simhost.record(hdir, "state.json", "small").exists()
    attempt = (hdir / "logs" / "small.latest.log").read_text().splitlines()
    assert attempt[-1].startswith("[fleet] withdrawn: the engine's check refused this command line"), attempt[-3:]
    facts = json.loads(run_cli("facts", "--host", "blackwell", "--json").out)
    assert all(not g["processes"] for g in facts["gpu"]["gpus"])

    write_playbook(playbooks, hdir, "small", images["0.5.23"], base="qwen36-27b", extra=good)
    served = run_cli("deploy", "small", "--host", "blackwell")
    assert served.code == 0, served.err
    record = simhost.record(hdir, "state.json", "small").read_text()
    write_playbook(playbooks, hdir, "small", images["0.5.23"], base="qwen36-27b", extra=bad)
    again = run_cli("deploy", "small", "--host", "blackwell")
    assert again.code == 4 and "invalid float value: 'soon'" in again.err, again.err
    running = podman_json("ps", "-a", "--filter", "label=fleet.deployment=small")
    assert [(c["Names"], c["State"]) for c in running] == [(["fleet-small"], "running")]
    assert simhost.record(hdir, "state.json", "small").read_text() == record
    assert "withdrawn" not in (hdir / "logs" / "small.latest.log").read_text()
    # stopped: nothing in the way again, and the stopped record is the one put back
    assert run_cli("stop", "--host", "blackwell/small").code == 0
    stopped = simhost.record(hdir, "state.json", "small").read_text()
    assert run_cli("deploy", "small", "--host", "blackwell").code == 4
    assert "withdrawn" in (hdir / "logs" / "small.latest.log").read_text()
    assert simhost.record(hdir, "state.json", "small").read_text() == stopped
    assert podman_json("ps", "-a", "--filter", "label=fleet.deployment=small") == []
    forgotten = run_cli("forget", "blackwell/small")  # its secrets directory is fleet's too
    assert forgotten.code == 0, forgotten.err
    assert not simhost.record(hdir, "state.json", "small").parent.exists()


@pytest.fixture
def dockerd(container_host: Path, fleet_env: simhost.Sandbox, images: dict[str, str]) -> Iterator[str]:
    """Debian's dockerd on the simulated blackwell (fleet_testbed.dockerd), the simulated SGLang image
    loaded into it, and the host's `docker` pointed at it."""
    from fleet_testbed import dockerd as daemon

    try:
        with daemon.on_host(fleet_env, BLACKWELL, images["0.5.23"]) as sock:
            yield sock
    except daemon.DockerdMissing as exc:
        pytest.fail(str(exc))


def test_docker_runs_a_deployment_the_same_way(dockerd: str, container_host: Path, images: dict[str, str]) -> None:
    hdir = container_host
    playbooks = Path(os.environ["FLEET_PLAYBOOKS"])
    write_playbook(playbooks, hdir, "small", images["0.5.23"], base="qwen36-27b", extra="gpus: [6, 7]\n", cli="docker")
    plan = json.loads(run_cli("plan", "small", "--host", "blackwell", "--json").out)
    assert plan["plan"]["engine_version"] == "0.5.23" and plan["plan"]["container"]["run"][:3] == [
        "docker",
        "run",
        "-d",
    ]
    r = run_cli("deploy", "small", "--host", "blackwell")
    assert r.code == 0, r.err
    docker = [shutil.which("docker") or "docker", "-H", dockerd]
    listed = subprocess.run(
        [*docker, "ps", "--format", '{{.Names}} {{.Label "fleet.deployment"}}'], capture_output=True, text=True
    )
    assert listed.stdout.split() == ["fleet-small", "small"]
    rec = json.loads(simhost.record(hdir, "state.json", "small").read_text())
    assert rec["status"] == "ready" and rec["container"]["cli"] == "docker"
    assert run_cli("stop", "--host", "blackwell/small").code == 0
    left = subprocess.run(
        [*docker, "ps", "-aq", "--filter", "label=fleet.deployment=small"], capture_output=True, text=True
    )
    assert left.stdout.strip() == ""
