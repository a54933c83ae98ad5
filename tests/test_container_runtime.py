"""The host's container code against stand-in `docker` and `podman` (fleet_testbed.fakeruntime): how it
reads each runtime's listing, which containers it takes for fleet's, what it stops and removes (and what
it never removes), how an image's engine version is read once, how GPUs reach a container, and how a
container launch that fails becomes the attempt's log. Real podman and docker run the same code in the
containers tier."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleet.host import container
from fleet.host.launch import launch
from fleet_testbed.fakeruntime import FakeRuntime

ID_A, ID_B, ID_C = "a" * 64, "b" * 64, "c" * 64
NO_DAEMON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    fake = FakeRuntime(tmp_path)
    monkeypatch.setenv("PATH", str(fake.bin))  # no real docker or podman is found
    return fake


def ours(name: str, deployment: str, owner: str = "ops") -> dict[str, object]:
    return {"name": name, "labels": {"fleet.deployment": deployment, "fleet.owner": owner}}


def test_podman_and_docker_listings_read_as_one_shape(runtime: FakeRuntime) -> None:
    """podman prints one array (Names a list, Labels a map, Pid); docker a line per container (Names a
    string, Labels joined by commas, no Pid): a docker container with fleet's labels has them asked as a
    map, since a label's value may hold a comma."""
    labels = {"fleet.deployment": "qwen", "fleet.owner": "ops"}
    for cli in ("podman", "docker"):
        runtime.add(cli, id=ID_A, name="fleet-qwen", image="lmsysorg/sglang:v0.5.23", labels=labels, pid=4242)
        runtime.add(cli, id=ID_B, name="db", image="postgres", labels={}, state="exited")
    podman, docker = (container.containers(cli)[0] for cli in ("podman", "docker"))
    assert podman[0] == {"id": ID_A, "name": "fleet-qwen", "image": "lmsysorg/sglang:v0.5.23", "state": "running",
                         "labels": labels, "pid": 4242}  # fmt: skip
    assert docker[0] == dict(podman[0], pid=None)
    assert [c["name"] for c in docker] == [c["name"] for c in podman] == ["fleet-qwen", "db"]
    assert ["inspect", "--type", "container", "--format", "{{json .Config.Labels}}", ID_A] in runtime.calls("docker")
    assert not any(call[0] == "inspect" for call in runtime.calls("podman"))  # podman's map needs no asking
    assert container.containers("podman", label="fleet.deployment=qwen")[0][0]["id"] == ID_A
    assert runtime.calls("podman")[-1][2:4] == ["--filter", "label=fleet.deployment=qwen"]


def test_a_runtime_that_cannot_list_says_why_and_lists_nothing(runtime: FakeRuntime) -> None:
    runtime.fail("docker", "ps", 1, NO_DAEMON)
    assert container.containers("docker") == ([], NO_DAEMON)
    (runtime.bin / "podman").write_text("#!/bin/sh\necho '[{\"Id\": '\n")  # cut short
    found, error = container.containers("podman")
    assert found == [] and error is not None and error.startswith("unreadable `podman ps` output")


def test_fleets_own_containers_are_told_from_everyone_elses(runtime: FakeRuntime) -> None:
    """Only the containers whose ids the deployments' records name, with their labels (deployment, this
    fleet's owner) and under the name fleet gives them, are fleet's, in either runtime; a container that
    has the name fleet is about to give is refused, never taken. Another owner's container of the same
    deployment is left alone, and so is a container run from a snapshot of fleet's (`commit` copies the
    labels), under another name or, once fleet's is gone, under fleet's own."""
    runtime.add("podman", id=ID_A, **ours("fleet-qwen", "qwen"))
    runtime.add("docker", id=ID_B, **ours("fleet-old", "old"))  # a deployment this one replaces
    runtime.add("podman", id=ID_C, **ours("fleet-qwen-theirs", "qwen", owner="someone-else"))
    runtime.add("docker", id="d" * 64, name="fleet-qwen-2", labels={})
    runtime.add("podman", id="e" * 64, **ours("users-snapshot-job", "qwen"))
    recorded = {ID_A, ID_B, ID_C, "e" * 64}
    mine, refused = container.fleet_containers(["podman"], ["qwen", "old"], "fleet-qwen-2", "ops", recorded)
    assert sorted((c["cli"], c["id"]) for c in mine) == [("docker", ID_B), ("podman", ID_A)]
    assert [r["cmdline"] for r in refused] == ["container fleet-qwen-2 (img)"]
    assert "not this fleet's" in refused[0]["why"]
    # a snapshot run under fleet's name after fleet's own container went: its id is no record's
    mine, refused = container.fleet_containers(["podman"], ["qwen"], "fleet-qwen", "ops", {ID_B})
    assert mine == [] and [r["cmdline"] for r in refused] == ["container fleet-qwen (img)"]
    assert "no record of this fleet names its id: `podman rm -f fleet-qwen`" in refused[0]["why"]


def test_the_host_names_a_deployments_container_as_the_plan_does() -> None:
    from fleet.plan.container import container_name

    assert container.fleet_name("qwen36-27b") == container_name("qwen36-27b") == "fleet-qwen36-27b"


def test_a_runtime_the_deployment_needs_must_be_able_to_list(runtime: FakeRuntime) -> None:
    """docker without its daemon runs nobody's containers: ignored, unless the deployment runs in docker,
    where 'no containers' could not be told from 'could not ask'."""
    runtime.fail("docker", "ps", 1, NO_DAEMON)
    assert container.fleet_containers(["podman"], ["qwen"], None, "ops", set()) == ([], [])
    _, refused = container.fleet_containers(["docker"], ["qwen"], None, "ops", set())
    why = f"cannot list containers: {NO_DAEMON}"
    assert refused == [{"pid": None, "user": "?", "cmdline": "docker", "why": why, "forceable": False}]
    runtime.only("podman")
    assert container.each_runtime(["docker", "podman"]) == [("podman", [], None)]


def test_fleets_containers_are_stopped_with_the_drain_then_removed(runtime: FakeRuntime) -> None:
    runtime.add("podman", id=ID_A, **ours("fleet-qwen", "qwen"), pid=77)
    runtime.add("podman", id=ID_B, **ours("fleet-old", "old"), state="exited")
    mine, _ = container.fleet_containers([], ["qwen", "old"], None, "ops", {ID_A, ID_B})
    stopped = container.stop_containers(mine, drain_s=15)
    assert [s["stop"] for s in stopped] == ["podman stop -t 15, removed", "removed (exited)"]
    assert stopped[0]["pid"] == stopped[0]["pgid"] == 77 and "deployment qwen" in stopped[0]["why"]
    changes = [c for c in runtime.calls("podman") if c[0] in ("stop", "rm")]
    assert changes == [["stop", "-t", "15", ID_A], ["rm", "-f", ID_A], ["rm", "-f", ID_B]]
    assert runtime.containers("podman") == []


def test_a_stop_the_runtime_refuses_is_said_and_the_container_still_removed(runtime: FakeRuntime) -> None:
    runtime.add("docker", id=ID_A, **ours("fleet-qwen", "qwen"))
    runtime.fail("docker", "stop", 1, "Error response from daemon: cannot stop container: permission denied")
    mine, _ = container.fleet_containers([], ["qwen"], None, "ops", {ID_A})
    (stopped,) = container.stop_containers(mine, drain_s=5)
    assert stopped["stop"] == "stop failed: Error response from daemon: cannot stop container: permission denied\n"
    assert runtime.calls("docker")[-1] == ["rm", "-f", ID_A]


def test_a_foreign_container_forced_out_of_the_way_is_stopped_never_removed(runtime: FakeRuntime) -> None:
    """Kill policy "force": somebody's container holding the GPUs is stopped through its runtime; it stays,
    with how it ended, for its owner to read. Its processes leave the targets the kill policy signals."""
    runtime.add("docker", id=ID_A, name="their-server", labels={}, pid=900)
    target = {"pgid": 900, "user": "alice", "cmdline": "python -m sglang.launch_server", "why": "holds GPU 0"}
    targets = {900: dict(target, container_id=ID_A, container_cli="docker"), 901: dict(target, pgid=901)}
    (stopped,) = container.stop_foreign_containers(targets, drain_s=10)
    assert stopped["stop"] == "docker stop -t 10 (not removed: not fleet's)" and stopped["user"] == "alice"
    assert list(targets) == [901]
    assert runtime.containers("docker")[0]["state"] == "exited"
    assert not any(c[0] == "rm" for c in runtime.calls("docker"))


def test_inspect_reads_the_state_fleet_diagnoses_with(runtime: FakeRuntime) -> None:
    runtime.add("podman", id=ID_A, name="fleet-qwen", pid=55, oom_killed=True)
    seen = container.inspect("podman", "fleet-qwen")
    assert seen == {"id": ID_A, "pid": 55, "running": True, "exit_code": 0, "oom_killed": True, "restart_count": 0,
                    "status": "running"}  # fmt: skip
    assert container.inspect("podman", "nothing-by-that-name") is None


def test_an_images_engine_version_is_read_once_per_image_and_mounts(runtime: FakeRuntime, tmp_path: Path) -> None:
    """Reading it starts a container (seconds): kept on the host by image id, and read again for other
    mounts (an engine environment mounted in runs as the server will)."""
    cache = str(tmp_path / "cache" / "images.json")
    runtime.image("podman", "sglang:dev", id="sha256:1", env=["CUDA_VERSION=12.9.1"], packages={"sglang": "0.5.23"})
    first = container.image_facts("podman", "sglang:dev", cache)
    assert first == {"present": True, "id": "sha256:1", "cuda": "12.9.1", "packages": {"sglang": "0.5.23"}}
    assert container.image_facts("podman", "sglang:dev", cache) == first
    runs = [c for c in runtime.calls("podman") if c[0] == "run"]
    assert len(runs) == 1 and runs[0][1:4] == ["--rm", "--network", "host"]
    container.image_facts("podman", "sglang:dev", cache, mounts=["/opt/env:/opt/env:ro"])
    runs = [c for c in runtime.calls("podman") if c[0] == "run"]
    assert len(runs) == 2 and runs[1][4:6] == ["-v", "/opt/env:/opt/env:ro"]
    assert {"sha256:1", "sha256:1|/opt/env:/opt/env:ro"} <= json.loads(Path(cache).read_text()).keys()


def test_an_image_that_is_missing_or_cannot_say_its_version(runtime: FakeRuntime, tmp_path: Path) -> None:
    cache = str(tmp_path / "images.json")
    missing = container.image_facts("docker", "nope:1", cache)
    assert missing == {"present": False, "error": "Error: nope:1: image not known"}
    runtime.image("docker", "broken:1", id="sha256:2", labels={"com.nvidia.cuda.version": "12.8"})
    runtime.fail("docker", "run", 127, 'exec: "python3": executable file not found in $PATH')
    facts = container.image_facts("docker", "broken:1", cache)
    assert facts["present"] and facts["cuda"] == "12.8" and "python3" in facts["error"]
    assert not Path(cache).exists()  # nothing kept: read again next time


def test_how_gpus_reach_a_container(runtime: FakeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docker's NVIDIA runtime first; then a CDI spec naming nvidia.com/gpu (docker only reads them when
    its CDI is on); then a simulated host's marked device files; else no way at all."""
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    monkeypatch.setattr(container, "CDI_DIRS", (str(tmp_path / "absent"), str(cdi)))
    runtime.set_info("docker", '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{}} ["/etc/cdi"]')
    assert container.gpu_access("docker", []) == "toolkit"
    assert container.gpu_access("podman", []) is None
    (cdi / "nvidia.yaml").write_text("kind: nvidia.com/gpu\ndevices: []\n")
    assert container.gpu_access("podman", []) == "cdi"
    runtime.set_info("docker", '{"runc":{}} null')  # docker with CDI off reads no spec
    assert container.gpu_access("docker", []) is None
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").symlink_to(os.devnull)  # a character device, as a simulated host's are
    assert container.gpu_access("docker", [str(dev / "nvidia0")]) is None  # not marked: not a GPU's
    (dev / ".fleet-simulated-gpus").touch()
    assert container.gpu_access("docker", [str(dev / "nvidia0")]) == "devices"


def test_containers_are_asked_only_when_an_engine_or_a_record_needs_them(runtime: FakeRuntime) -> None:
    """A `podman ps` costs more than the rest of the probe: without a containerised process or a
    deployment recorded in a container, no runtime is asked."""
    runtime.add("podman", id=ID_A, name="fleet-qwen", labels={"fleet.deployment": "qwen"})
    runtime.add("podman", id=ID_B, name="web", labels={})
    assert container.engine_containers([{"pid": 5}], {"deployments": {}}) == []
    assert runtime.calls("podman") == []
    recorded = {"deployments": {"qwen": {"state": {"container": {"cli": "podman"}}}}}
    assert [c["name"] for c in container.engine_containers([], recorded)] == ["fleet-qwen"]
    running = [{"pid": 5, "container": ID_B}]
    assert [c["name"] for c in container.engine_containers(running, {})] == ["fleet-qwen", "web"]
    assert container.container_names(["podman", ""]) == {ID_A: ("podman", "fleet-qwen (img)"),
                                                          ID_B: ("podman", "web (img)")}  # fmt: skip


def container_launch(tmp_path: Path, cli: str) -> dict[str, object]:
    secrets = tmp_path / "secrets"
    return {
        "name": "qwen",
        "attempt": 2,
        "argv": ["python3", "-m", "sglang.launch_server", "--api-key", "fleet-secret:KEY"],
        "env": {},
        "log_dir": str(tmp_path / "logs"),
        "container": {
            "cli": cli,
            "image": "sglang:dev",
            "name": "fleet-qwen",
            "options": ["--name", "fleet-qwen", "--label", "fleet.deployment=qwen", "-v", f"{secrets}:/run/fleet:ro"],
            "python": "python3",
            "secrets_dir": str(secrets),
            "secrets_mount": "/run/fleet",
        },
    }


def test_a_container_launch_starts_the_launcher_and_leaves_no_secret(runtime: FakeRuntime, tmp_path: Path) -> None:
    runtime.starts_as("podman", os.getpid())  # a live process plays the container's PID 1
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "env-qwen-1.json").write_text("{}")  # left by a step killed mid-launch
    started = launch(container_launch(tmp_path, "podman"), {"KEY": "sk-secret"})  # type: ignore[arg-type]
    (run,) = [c for c in runtime.calls("podman") if c[0] == "run"]
    assert run[:2] == ["run", "-d"] and run[run.index("--entrypoint") + 1 : run.index("--entrypoint") + 4] == [
        "python3", "sglang:dev", "-c"]  # fmt: skip
    assert run[-5:] == ["python3", "-m", "sglang.launch_server", "--api-key", "fleet-secret:KEY"]
    assert "sk-secret" not in json.dumps(runtime.calls("podman"))  # never an option `inspect` shows
    assert started["pid"] == started["pgid"] == os.getpid()
    assert started["container"] == {"cli": "podman", "name": "fleet-qwen", "id": runtime.containers("podman")[0]["id"]}
    assert os.listdir(tmp_path / "secrets") == []  # the launcher read its file; the old one went too
    assert not os.path.exists(str(started["exit_file"]))


def test_a_container_that_would_not_start_is_the_attempts_log(runtime: FakeRuntime, tmp_path: Path) -> None:
    """What the runtime said is written to the attempt's log with its exit code, to be diagnosed like a
    crash; the container the run made before its start failed is removed, by its id."""
    runtime.start_fails("docker", "docker: Error response from daemon: could not select device driver \"\" "
                        "with capabilities: [[gpu]].")  # fmt: skip
    started = launch(container_launch(tmp_path, "docker"), {"KEY": "k"})  # type: ignore[arg-type]
    log = Path(str(started["log"])).read_text()
    assert log == '[fleet] docker run: docker: Error response from daemon: could not select device driver "" ' \
                  "with capabilities: [[gpu]].\n"  # fmt: skip
    assert Path(str(started["exit_file"])).read_text() == "126\n" and started["pid"] == -1
    assert runtime.calls("docker")[-1] == ["rm", "-f", "1".zfill(64)] and runtime.containers("docker") == []
    assert started["container"] == {"cli": "docker", "name": "fleet-qwen", "id": None}  # nothing left to withdraw
    assert os.listdir(tmp_path / "secrets") == [] and not list((tmp_path / "logs").glob("*.cid"))


def test_a_run_that_loses_the_name_to_another_container_never_removes_that_one(
    runtime: FakeRuntime, tmp_path: Path
) -> None:
    """Another fleet's container (another owner's, or one taken after fleet looked) with the name this
    launch gives: the run fails, and nothing is removed by that name nor read from it."""
    for cli in ("podman", "docker"):
        runtime.add(cli, id=ID_B, **ours("fleet-qwen", "qwen", owner="someone-else"), logs="their secret")
        started = launch(container_launch(tmp_path, cli), {"KEY": "k"})  # type: ignore[arg-type]
        assert [c["id"] for c in runtime.containers(cli)] == [ID_B]
        assert [c[0] for c in runtime.calls(cli)] == ["run"]  # no rm, no logs, no inspect by the name
        assert "already in use" in Path(str(started["log"])).read_text() and started["pid"] == -1


def test_a_container_that_ended_at_once_leaves_its_own_words(runtime: FakeRuntime, tmp_path: Path) -> None:
    runtime.starts_as("podman", 0)
    launched = container_launch(tmp_path, "podman")
    started = launch(launched, {})  # type: ignore[arg-type]
    assert started["pid"] == -1
    assert Path(str(started["exit_file"])).read_text() == "3\n"  # the container's own exit code
    assert [c[0] for c in runtime.calls("podman")][-3:] == ["inspect", "logs", "rm"]
    assert Path(str(started["log"])).read_text() == "[fleet] podman run: exited at once\n"


def test_a_refusal_no_force_can_lift_does_not_advise_force(runtime: FakeRuntime) -> None:
    """A container holding fleet's name (or a runtime that cannot list) is never removed, --force or not:
    the refusal says what to do instead; a GPU holder's refusal still names --force."""
    from fleet.control.answers import act_refusal

    runtime.add("podman", id=ID_A, **ours("fleet-qwen", "qwen", owner="someone-else"))
    _, refused = container.fleet_containers(["podman"], ["qwen"], "fleet-qwen", "ops", set())
    said = act_refusal("blackwell", "qwen", {"lock": {"status": "taken"}, "refused": refused})  # type: ignore[typeddict-item]
    assert said is not None and "never stopped or removed by fleet" in str(said) and "--force never" in said.hint
    holder = {"pid": 7, "user": "bob", "cmdline": "python train.py", "why": "another user's"}
    said = act_refusal("blackwell", "qwen", {"lock": {"status": "taken"}, "refused": [holder]})  # type: ignore[typeddict-item]
    assert said is not None and "(or pass --force)" in said.hint


def test_forget_removes_the_exited_container_its_record_names_and_never_a_running_one(
    runtime: FakeRuntime, tmp_path: Path
) -> None:
    """Without its record nothing proves a container fleet's (a later deploy would refuse it): `fleet
    forget` removes the deployment's stopped container with the record, by the id the record keeps."""
    import fleet.host.lock as lock
    from fleet.host.records import write_record

    directory = tmp_path / "deployments" / "qwen"
    directory.mkdir(parents=True)
    record = {"status": "failed", "container": {"cli": "podman", "name": "fleet-qwen", "id": ID_A}}
    runtime.add("podman", id=ID_A, **ours("fleet-qwen", "qwen"), state="running", pid=77)
    runtime.add("podman", id=ID_B, **ours("fleet-other", "other"), state="exited")
    write_record(str(directory / "state.json"), record)
    write_record(str(directory / "lock.json"), {"run_id": "r1"})
    said = lock.forget(str(directory), container.remove_recorded)
    assert said == {"forgotten": False, "container": "it is running"}
    assert [c["id"] for c in runtime.containers("podman")] == [ID_A, ID_B]
    assert container.run_cli(["podman", "stop", ID_A])[0] == 0  # it stopped since
    assert lock.forget(str(directory), container.remove_recorded) == {"forgotten": True}
    assert [c["id"] for c in runtime.containers("podman")] == [ID_B]  # another deployment's stays


def test_forget_keeps_the_record_while_the_runtime_cannot_answer(runtime: FakeRuntime, tmp_path: Path) -> None:
    """docker's daemon down: whether the container is still there is not known, so the record that proves
    it fleet's stays (and the secrets with it: a refused forget changes nothing)."""
    import fleet.host.lock as lock
    from fleet.host.records import write_record

    directory = tmp_path / "deployments" / "qwen"
    (directory / "secrets").mkdir(parents=True)
    write_record(str(directory / "state.json"), {"container": {"cli": "docker", "name": "fleet-qwen", "id": ID_A}})
    write_record(str(directory / "lock.json"), {"run_id": "r1"})
    runtime.fail("docker", "inspect", 1, NO_DAEMON)
    assert lock.forget(str(directory), container.remove_recorded) == {"forgotten": False, "container": NO_DAEMON}
    assert (directory / "secrets").is_dir() and (directory / "state.json").is_file()


def test_a_cidfile_another_user_planted_in_the_log_directory_names_nothing_removed(
    runtime: FakeRuntime, tmp_path: Path
) -> None:
    """The id fleet removes after a failed run is read from a directory of fleet's own, made for that run:
    a file by the attempt's name in a log directory others can write to is never read."""
    runtime.fail("podman", "run", 125, "Error: something failed")
    logs = tmp_path / "logs"
    logs.mkdir()
    for stamp in ("", ".1"):  # whatever name the attempt's files get
        (logs / f"planted{stamp}.cid").write_text(ID_B)
    started = launch(container_launch(tmp_path, "podman"), {})  # type: ignore[arg-type]
    assert started["pid"] == -1 and [c[0] for c in runtime.calls("podman")] == ["run"]
    run = runtime.calls("podman")[0]
    assert not run[run.index("--cidfile") + 1].startswith(str(logs))
