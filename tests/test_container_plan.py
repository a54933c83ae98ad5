"""The `docker|podman run` fleet plans for a deployment in a container (pure), and the runtime: settings.

docker is not run in these tests (no dockerd here): its command line is podman's for everything fleet
uses, checked here option by option; the GPU options differ by the host's runtime (toolkit, CDI).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.errors import ConfigError
from fleet.inventory import load_playbook
from fleet.inventory.runtime import Container, chosen_runtime
from fleet.plan import EnvVar, Flag, LaunchPlan
from fleet.plan.container import ContainerPlan, container_plan, model_mount_path


def plan(env: tuple[EnvVar, ...] = ()) -> LaunchPlan:
    return LaunchPlan(
        engine="sglang",
        engine_version=(0, 5, 11),
        python="python3",
        model_path="/models/Qwen3.6-27B",
        served_name="qwen36",
        port=30000,
        check_address="127.0.0.1",
        flags=(Flag("--model-path", "/models/Qwen3.6-27B", "model", "m"), Flag("--tp-size", "2", "tp", "t")),
        env=env,
        secret_env=("HF_TOKEN",),
        verdicts=(),
    )


def run_for(access: str, indices: tuple[int, ...] | None, spec: Container | None = None) -> ContainerPlan:
    return container_plan(
        spec or Container(container="docker", image="lmsysorg/sglang:v0.5.11-cu129"),
        deployment="qwen36",
        playbook="qwen36-27b",
        model_host_path="/data/models/Qwen3.6-27B",
        gpu_access=access,
        gpu_indices=indices,
        device_files=[f"/dev/nvidia{i}" for i in range(8)],
        log_dir="/home/op/.fleet/logs",
        secrets_dir="/home/op/.fleet/state/deployments/qwen36/secrets",
        hf_cache=None,
        fleet_version="0.1.0",
        owner="0123456789abcdef",
    )


PLACED = (EnvVar("CUDA_VISIBLE_DEVICES", "6,7", "placement", "p"), EnvVar("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "p", "p"))


def test_a_toolkit_host_gets_the_deployments_gpus_by_device_and_no_host_indices_inside() -> None:
    argv = run_for("toolkit", (6, 7)).run_argv(plan(PLACED), ["LAUNCHER"])
    assert argv[:5] == ["docker", "run", "-d", "--name", "fleet-qwen36"]
    assert argv[argv.index("--gpus") + 1] == '"device=6,7"'
    assert "CUDA_VISIBLE_DEVICES=6,7" not in argv  # inside, the two GPUs are 0 and 1
    assert argv[argv.index("--network") : argv.index("--network") + 2] == ["--network", "host"]
    assert argv[argv.index("--ipc") + 1] == "host"
    assert "/data/models/Qwen3.6-27B:/models/Qwen3.6-27B:ro" in argv
    assert "/home/op/.fleet/logs:/home/op/.fleet/logs" in argv
    tail = argv[argv.index("--entrypoint") :]
    assert tail[:4] == ["--entrypoint", "python3", "lmsysorg/sglang:v0.5.11-cu129", "LAUNCHER"]
    assert tail[4:7] == ["python3", "-m", "sglang.launch_server"]
    labels = [argv[i + 1] for i, w in enumerate(argv) if w == "--label"]
    assert {x.split("=")[0] for x in labels} == {
        "fleet.deployment",
        "fleet.playbook",
        "fleet.plan",
        "fleet.version",
        "fleet.owner",
    }


def test_cdi_and_simulated_device_files_map_only_the_deployments_gpus() -> None:
    cdi = run_for("cdi", (6, 7)).run_argv(plan(PLACED))
    assert [cdi[i + 1] for i, w in enumerate(cdi) if w == "--device"] == ["nvidia.com/gpu=6", "nvidia.com/gpu=7"]
    devices = run_for("devices", (6, 7)).run_argv(plan(PLACED))
    assert [devices[i + 1] for i, w in enumerate(devices) if w == "--device"] == [
        "/dev/nvidia6:/dev/nvidia6",
        "/dev/nvidia7:/dev/nvidia7",
    ]
    assert "CUDA_VISIBLE_DEVICES=6,7" in devices  # the device files keep their host numbers
    everything = run_for("toolkit", None).run_argv(plan())
    assert everything[everything.index("--gpus") + 1] == "all"


def test_secrets_are_never_options_and_the_plan_hash_follows_the_plan() -> None:
    c = run_for("toolkit", None)
    argv = c.run_argv(plan())
    assert not any("HF_TOKEN" in w for w in argv) and "--env-file" not in argv
    other = c.run_argv(plan((EnvVar("NCCL_P2P_DISABLE", "1", "rule", "r"),)))
    hashes = [next(w for w in a if w.startswith("fleet.plan=")) for a in (argv, other)]
    assert hashes[0] != hashes[1] and "NCCL_P2P_DISABLE=1" in other


def test_shm_size_replaces_the_host_ipc_and_run_args_come_last() -> None:
    spec = Container(container="podman", image="x/y:1", shm_size="32g", run_args=["--ulimit=memlock=-1"])
    argv = run_for("cdi", None, spec).run_argv(plan())
    assert "--ipc" not in argv and argv[argv.index("--shm-size") + 1] == "32g"
    assert argv[argv.index("--entrypoint") - 1] == "--ulimit=memlock=-1"


def test_a_recorded_container_plan_is_read_back_exactly() -> None:
    c = run_for("cdi", (6, 7), Container(container="podman", image="x/y:1", run_args=["--ulimit=memlock=-1"]))
    assert ContainerPlan.from_json(c.to_json()) == c
    assert model_mount_path("/data/models/Qwen3.6-27B/") == "/models/Qwen3.6-27B"


def test_the_playbooks_runtime_wins_over_the_hosts() -> None:
    box = Container(container="docker", image="a/b:1")
    assert chosen_runtime(None, box) is box
    assert chosen_runtime("process", box) is None
    assert chosen_runtime(None, None) is None


BAD_RUNTIMES = [  # (runtime:, what the error says): each would run something fleet did not check or place
    ("{container: podman, image: x, run_args: [--gpus=all]}", 'field "runtime.run_args" sets --gpus'),
    ("{container: podman, image: x, run_args: [--network=bridge]}", "sets --network"),
    ("{container: podman, image: x, run_args: [--restart=always]}", "sets --restart"),
    ("{container: podman, image: x, run_args: [--privileged]}", "every GPU of the host"),
    ("{container: podman, image: x, run_args: [--pull=always]}", "use pull:"),
    ("{container: podman, image: x, run_args: ['--device-cgroup-rule=c 195:* rmw']}", "not the deployment's"),
    ("{container: podman, image: x, run_args: [--label=fleet.deployment=y]}", "fleet.* labels"),
    ("{container: podman, image: x, run_args: [-lfleet.deployment=other]}", "fleet.* labels"),
    ("{container: podman, image: x, run_args: [--device=/dev/nvidia3]}", "maps an NVIDIA device"),
    ("{container: podman, image: x, run_args: [--device=/dev/char/195:0]}", "maps an NVIDIA device"),
    ("{container: podman, image: x, run_args: [-v, '/a:/models']}", "mounts over /models"),
    ("{container: podman, image: x, run_args: ['-v/x:/models/Q/config.json']}", "mounts over /models"),
    ("{container: podman, image: x, run_args: ['-v', '/dev:/dev']}", "mounts device files"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/a,destination=/models/Q']}", "mounts over"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/a,dst=//run/fleet-secrets']}", "mounts over"),
    ("{container: podman, image: x, run_args: [evil/img:latest]}", "would be taken as the image"),
    ("{container: podman, image: x, run_args: [--workdir]}", "write --workdir=VALUE"),
    ("{container: podman, image: x, run_args: [--ulimit, memlock=-1]}", "write --ulimit=VALUE"),
    ("{container: podman, image: x, run_args: [-dit]}", "combines short options"),
    # issue 39's escapes in new spellings, and more of their kind: refused for what they reach, not by name
    ("{container: podman, image: x, run_args: [--pid=host]}", "sets --pid, which run_args may not"),
    ("{container: podman, image: x, run_args: [-v, '/:/host']}", "mounts /, which is the host's own"),
    ("{container: podman, image: x, run_args: ['-v', '/etc/shadow:/s:ro']}", "which is the host's own"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/proc,dst=/p']}", "the host's own"),
    ("{container: podman, image: x, run_args: ['-v', '/srv/podman.sock:/s']}", "mounts the socket"),
    ("{container: podman, image: x, run_args: ['-v', '/root:/r']}", "which is the host's own"),
    ("{container: podman, image: x, run_args: ['-v', '/home/ann:/h']}", "which is the host's own"),
    ("{container: podman, image: x, mounts: ['/home/ann/.ssh:/k:ro']}", "where credentials are kept"),
    ("{container: podman, image: x, run_args: [--cap-add=ALL]}", "sets --cap-add, which run_args may not"),
    ("{container: podman, image: x, run_args: [--security-opt=seccomp=unconfined]}", "sets --security-opt"),
    ("{container: podman, image: x, run_args: [--runtime=nvidia]}", "sets --runtime, which run_args may not"),
    ("{container: podman, image: x, run_args: [-e, NVIDIA_VISIBLE_DEVICES=all]}", "sets NVIDIA_VISIBLE_DEVICES"),
    ("{container: podman, image: x, run_args: [-e, 'CUDA_VISIBLE_DEVICES=0,1']}", "sets CUDA_VISIBLE_DEVICES"),
    ("{container: podman, image: x, run_args: [--env=HIP_VISIBLE_DEVICES=0]}", "sets HIP_VISIBLE_DEVICES"),
    ("{container: podman, image: x, run_args: [-e, LD_PRELOAD=/x.so]}", "changes what program or library runs"),
    ("{container: podman, image: x, run_args: [-e, PYTHONPATH=/x]}", "changes what program or library runs"),
    ("{container: podman, image: x, run_args: [--userns=host]}", "sets --userns"),
    ("{container: podman, image: x, run_args: [--sysctl=net.ipv4.ip_forward=1]}", "sets --sysctl"),
    ("{container: podman, image: x, run_args: [-p, '8080:30000']}", "sets -p"),
    ("{container: podman, image: x, run_args: [--device=/dev/fuse]}", "sets --device, which run_args may not"),
    ("{container: podman, image: x, run_args: [--volumes-from=other]}", "sets --volumes-from"),
    ("{container: podman, image: x, run_args: [-e]}", "ends with -e"),
    ("{container: podman, image: x, run_args: ['-e', 'A=$(id)']}", "refuses to send"),
    # the third pass's review: mounts read as docker and podman read them, and what a mount may reach
    ("{container: podman, image: x, run_args: ['--mount=type=bind,Source=/,Target=/h']}", "which is the host's own"),
    ("{container: podman, image: x, run_args: ['--mount=TYPE=bind,SRC=/etc,DST=/h']}", "which is the host's own"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,\"src=/proc\",dst=/h']}", "the host's own"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/d,src=/,dst=/h']}", "gives 'src' twice"),
    ("{container: podman, image: x, run_args: ['--mount=src=/d,dst=/h']}", "mounts a volume"),
    (
        "{container: podman, image: x, run_args: ['--mount=type=volume,dst=/h,volume-opt=device=/,volume-opt=o=bind']}",
        "mounts with 'volume-opt'",
    ),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/d,dst=/h,bind-propagation=rshared']}", "'bind-"),
    ("{container: podman, image: x, run_args: ['--mount=type=image,src=x,dst=/h']}", "mounts a image"),
    ("{container: podman, image: x, run_args: [-v, '.:/x']}", "must be an absolute host path"),
    ("{container: podman, image: x, run_args: [-v, 'vol:/x']}", "named volumes"),
    ("{container: podman, image: x, run_args: [-v, '/d:/x:U']}", "with options other than"),
    ("{container: podman, image: x, run_args: [-v, '/d:/x:z']}", "with options other than"),
    ("{container: podman, image: x, run_args: [-v, '/usr:/u']}", "mount it read-only"),
    ("{container: podman, image: x, run_args: [-v, '/lib/x86_64-linux-gnu:/l']}", "mount it read-only"),
    ("{container: podman, image: x, run_args: [-v, '/opt:/o']}", "mount it read-only"),
    ("{container: podman, image: x, run_args: [-v, '/var/lib/dpkg:/c']}", "mount it read-only"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/usr,dst=/u,readonly=false']}", "read-only"),
    ("{container: podman, image: x, run_args: [-v, '/root/.pyenv:/p']}", "mount it read-only"),
    ("{container: podman, image: x, run_args: [-v, '/home/ann/.config:/c:ro']}", "where credentials are kept"),
    ("{container: podman, image: x, run_args: [-v, '/home/ann/.config/gh:/c:ro']}", "where credentials are kept"),
    ("{container: podman, image: x, run_args: [-v, '/tmp:/t']}", "which is the host's own"),
    ("{container: podman, image: x, run_args: ['--tmpfs=/dev/shm']}", "mounts device files"),
    ("{container: podman, image: x, run_args: [--log-driver=syslog]}", "sets --log-driver, which run_args may not"),
    ("{container: podman, image: x, run_args: ['--log-opt=syslog-address=tcp://x:514']}", "sets --log-opt"),
    ("{container: podman, image: x, mounts: ['/usr/lib:/l']}", "mount it read-only"),
    # spellings of a path the kernel resolves elsewhere, tried on the way out
    ("{container: podman, image: x, run_args: [-v, '/usr/../etc:/x:ro']}", "which is the host's own"),
    ("{container: podman, image: x, run_args: [-v, '/proc/..:/x:ro']}", "which is the host's own"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/usr/../home/ann,dst=/h,readonly']}", "own"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/d,dst=/x/../models']}", "mounts over /models"),
    ("{container: podman, image: x, run_args: [-v, '/home/ann/./.ssh:/k:ro']}", "where credentials are kept"),
    ("{container: podman, image: x, run_args: ['--mount=type=bind,src=/usr,dst=/u,ro=yes']}", "mount it read-only"),
    ("{container: podman, image: x, mounts: ['/a']}", "HOST_PATH:CONTAINER_PATH"),
    ("{container: podman, image: x, mounts: ['/a/../etc:/b']}", "'..'"),
    ("{container: podman, image: x, mounts: ['/x://models/Q/config.json']}", "mounts over /models"),
    ("{container: podman, image: x, mounts: ['~/data:/data']}", "must be absolute"),
    ("{container: podman, image: x, mounts: ['/dev/infiniband:/dev/infiniband']}", "mounts device files"),
    ("{container: podman, image: x, shm_size: lots}", "must be a size"),
    ("{container: podman, image: 'Bad Image'}", "must be an image reference"),
    ("{container: podman, image: x, pull: sometimes}", "'never', 'missing', 'always'"),
    ("{container: lxc, image: x}", "'docker', 'podman'"),
    ("{container: podman}", 'required field "runtime.image"'),
    ("docker", "must be 'process' or a mapping"),
]


def test_run_args_as_docker_reads_them_pass() -> None:
    ok = "{container: podman, image: x, run_args: [--ulimit=memlock=-1, -e, A=1, -v, '/d:/data:ro', --init]}"
    assert chosen_runtime(load_runtime(ok), None) is not None
    # data and programs inside a home are the operator's to mount (a Python install for a venv, say)
    python = "/root/.pyenv/versions/3.11.7"
    assert isinstance(load_runtime(f"{{container: podman, image: x, mounts: ['{python}:{python}:ro']}}"), Container)
    # programs read-only, data as the operator likes, a tmpfs; the key's case and CSV quotes as docker reads
    for fine in (
        "run_args: [-v, '/usr:/usr:ro', -v, '/opt/models:/m', -v, '/tmp/x:/x:ro,nosuid']",
        "run_args: ['--mount=Type=bind,Source=/usr/lib,Target=/l,ReadOnly', '--mount=type=tmpfs,dst=/scratch']",
        "run_args: ['--mount=type=bind,\"src=/data/a,b\",dst=/d', '--tmpfs=/scratch:size=1g']",
    ):
        assert isinstance(load_runtime(f"{{container: podman, image: x, {fine}}}"), Container), fine


def load_runtime(runtime: str, tmp: Path | None = None) -> Container | str | None:
    import tempfile

    path = Path(tmp or tempfile.mkdtemp()) / "pb.yaml"
    smoke = "smoke: {prompt: p, expect: Paris}"
    path.write_text(f"engine: sglang\nmodel: m\nserved_name: s\n{smoke}\nruntime: {runtime}\n")
    return load_playbook(str(path), path.parent).spec.runtime


@pytest.mark.parametrize(("runtime", "message"), BAD_RUNTIMES)
def test_a_bad_runtime_names_file_line_and_what_to_do(tmp_path: Path, runtime: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_runtime(runtime, tmp_path)
    assert f"{tmp_path / 'pb.yaml'}:5:" in err.value.message and message in err.value.message, err.value.message


RUNTIME_FAILURES = [  # what docker/podman, the toolkit, CUDA and NCCL print when a container cannot run
    (
        '[fleet] podman run: Error: could not select device driver "" with capabilities: [[gpu]]',
        "container-no-gpu-runtime",
    ),
    ("Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=3", "container-no-gpu-runtime"),
    ("nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.9, please update", "driver-mismatch"),
    ("RuntimeError: CUDA error: Error 804: forward compatibility was attempted on non supported HW", "driver-mismatch"),
    (
        "shmutils.cc:72 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-5Q6d",
        "container-shm-too-small",
    ),
    ("[fleet] container OOM-killed: its memory limit was reached (exit 137)", "container-oom-killed"),
]


@pytest.mark.parametrize(("line", "signature"), RUNTIME_FAILURES)
def test_what_a_container_runtime_says_when_it_fails_is_diagnosed(line: str, signature: str) -> None:
    from fleet.crashes import LogContext, diagnose

    ctx = LogContext(engine="sglang", version=(0, 5, 11), hybrid=False, nvfp4=False, moe=False, sm=120, argv=())
    assert diagnose([line], ctx).signature == signature


def test_an_oom_killed_exit_becomes_a_line_the_knowledge_base_reads() -> None:
    from fleet.control.answers import synthetic_line

    assert synthetic_line({"e": "exit", "code": 137, "oom_killed": True}) == (
        "[fleet] container OOM-killed: its memory limit was reached (exit 137)"
    )
    assert synthetic_line({"e": "exit", "code": 137}) == "[fleet] engine killed by signal 9"


@pytest.mark.parametrize(
    ("seen", "status", "words"),
    [
        ({"running": True, "restart_count": 0}, "ok", "running"),
        ({"running": True, "restart_count": 2}, "warning", "restarted 2 time(s)"),
        ({"running": False, "oom_killed": True, "exit_code": 137}, "critical", "OOM-killed (exit 137)"),
        ({"running": False, "status": "exited", "exit_code": 1}, "critical", "is exited (exit 1)"),
        ({"missing": True}, "critical", "is gone"),
    ],
)
def test_health_reads_a_containers_state_as_its_runtime_reports_it(seen: dict, status: str, words: str) -> None:
    from fleet.health.checks import _container_check

    name, level, detail = _container_check({**seen, "name": "fleet-qwen36"})
    assert (name, level) == ("container", status) and words in detail and "fleet-qwen36" in detail


def test_golden_the_motivating_deployment_in_a_docker_container_on_gpus_6_and_7() -> None:
    """The whole `docker run` for Qwen3.6-27B placed on blackwell's GPUs 6 and 7 with the NVIDIA runtime,
    one option per line (tests/golden/...-docker.txt; UPDATE_GOLDEN=1 rewrites it)."""
    import dataclasses
    import os
    import shlex

    import msgspec

    from factsdata import RTX_PRO_6000, facts
    from fleet.facts.parse import ContainerFacts
    from fleet.inventory import load_inventory
    from fleet.plan.build import build_plan

    root = Path(__file__).resolve().parents[1]
    blackwell = load_inventory(root / "inventory" / "hosts.yaml").hosts["blackwell"]
    pb = load_playbook("qwen36-27b", root / "playbooks")
    pb = dataclasses.replace(
        pb,
        spec=msgspec.structs.replace(
            pb.spec, runtime=Container(container="docker", image="lmsysorg/sglang:v0.5.11-cu129")
        ),
    )
    f = dataclasses.replace(
        facts("blackwell", RTX_PRO_6000, 8, model="Qwen3.6-27B"),
        container=ContainerFacts(cli="/usr/bin/docker", gpu_access="toolkit", image_present=True, image_cuda="12.9.1"),
        paths={"log_dir": "/home/op/.fleet/logs", "state_dir": "/home/op/.fleet/state"},
    )
    r = build_plan(blackwell, pb, f, "/models/Qwen3.6-27B", gpu_indices=(6, 7), port=30010)
    assert r.plan is not None and r.plan.container is not None and not r.errors, r.verdicts
    c = r.plan.container
    lines = [
        f"{c.cli} run -d",
        *(shlex.join(o.words) for o in c.options_for(r.plan)),
        f"--entrypoint python3 {c.image}",
    ]
    lines += ["<fleet's launcher>", shlex.join(r.plan.argv()[:3]), *(shlex.join(x.words()) for x in r.plan.flags)]
    text = " \\\n  ".join(lines) + "\n"
    path = root / "tests" / "golden" / "qwen36-27b-blackwell-gpus-6-7-sglang-0.5.11-docker.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"the run differs from {path} (UPDATE_GOLDEN=1 rewrites it)"


@pytest.mark.parametrize(
    "damage",
    [{"cli": "/bin/sh"}, {"options": None}, {"options": {}}, {"options": [{"words": []}]}, {"run_args": "--init"}],
)
def test_a_damaged_recorded_container_is_refused_not_run(damage: dict) -> None:
    """The record is a file on the host: restart runs only what fleet itself would have written."""
    recorded = {**run_for("cdi", (6, 7)).to_json(), **damage}
    with pytest.raises(ValueError):
        ContainerPlan.from_json(recorded)


def test_fleet_and_its_launcher_agree_on_whose_container_it_is() -> None:
    from fleet.host.common import container_owner

    assert container_owner(1000, "/home/op/.fleet/state/") == container_owner(1000, "/home/op/.fleet/state")
    assert container_owner(1000, "/home/op/.fleet/state") != container_owner(1001, "/home/op/.fleet/state")


@pytest.mark.parametrize(
    ("seen", "rule", "words"),
    [
        (None, "container-runtime", "podman is not installed"),
        ({"cli": None, "error": "podman is not installed (not on PATH)"}, "container-runtime", "not on PATH"),
        ({"cli": "/usr/bin/podman", "gpu_access": None, "image_present": True}, "container-gpus", "see no GPU"),
        ({"cli": "/usr/bin/podman", "gpu_access": "cdi", "image_present": False}, "image-missing", "pull: never"),
        (
            {"cli": "/usr/bin/podman", "gpu_access": "cdi", "image_present": True, "image_cuda": "13.1.0"},
            "image-cuda",
            "cuda>=13.1",
        ),
    ],
)
def test_pre_flight_refuses_a_container_the_host_cannot_run(seen: dict | None, rule: str, words: str) -> None:
    import dataclasses

    from factsdata import RTX_PRO_6000, facts
    from fleet.facts.parse import ContainerFacts
    from fleet.plan.build import container_preflight

    f = dataclasses.replace(
        facts("blackwell", RTX_PRO_6000, 8, model="Qwen3.6-27B"),
        container=ContainerFacts(**seen) if seen is not None else None,
    )
    spec = Container(container="podman", image="lmsysorg/sglang:v0.5.11-cu129", pull="never")
    verdicts = container_preflight("qwen36 on blackwell", spec, dataclasses.replace(f, cuda_version="13.0"))
    assert [(v.level, v.rule) for v in verdicts] == [("error", rule)] and words in verdicts[0].message, verdicts
