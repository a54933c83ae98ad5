"""Which program holds the GPU's device files, as the host-side script decides it (fleet.host.act
runs on the host; these are its pure parts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import classify_table
from fleet.host.common import program, safelisted

# Seen on a real H200 box (docs/real-gpu.md): its monitoring runs nvidia-smi through a bundled loader.
H200_MONITORING = (
    "/glibc/ld-linux-x86-64.so.2 --inhibit-cache --library-path /glibc:/lib64 /bin/nvidia-smi "
    "--query-compute-apps=pid --format=csv,noheader"
)


@pytest.mark.parametrize(
    ("cmdline", "runs"),
    [
        ("/usr/bin/nvidia-persistenced --user nvidia-persistenced", "nvidia-persistenced"),
        (H200_MONITORING, "nvidia-smi"),
        ("/lib64/ld-linux-x86-64.so.2 /usr/bin/nvidia-smi -q", "nvidia-smi"),
        ("ld.so --preload /x.so --argv0 top /usr/bin/nv-hostengine", "nv-hostengine"),
        ("python3 nvidia-smi", "python3"),
        ("/opt/venv/bin/python -m sglang.launch_server --model-path /m", "python"),
    ],
)
def test_the_program_is_found_also_behind_the_dynamic_loader(cmdline: str, runs: str) -> None:
    assert program(cmdline) == runs


def holder(cmdline: str, comm: str) -> dict[str, object]:
    return {"cmdline": cmdline, "comm": comm}


def test_gpu_daemons_and_tools_are_recognised_by_program_or_truncated_comm() -> None:
    assert safelisted(holder(H200_MONITORING, "ld-linux-x86-64")) == "nvidia-smi"
    assert safelisted(holder("", "nvidia-persiste")) == "nvidia-persistenced"  # cmdline unreadable, comm left
    assert safelisted(holder("/usr/bin/dcgm-exporter", "dcgm-exporter")) == "dcgm-exporter"
    # the driver's daemons by family, not by a list that misses some: killing MPS's ends every client
    for daemon in ("nvidia-cuda-mps-control -d", "nvidia-cuda-mps-server", "/usr/bin/nv-fabricmanager -c x"):
        assert safelisted(holder(daemon, os.path.basename(daemon.split()[0])[:15])) is not None, daemon
    assert safelisted(holder("", "nvidia-cuda-mps")) == "nvidia-cuda-mps"  # cmdline unreadable: comm, cut to 15
    assert safelisted(holder("/usr/bin/python3 /usr/local/bin/nvitop -m full", "python3")) == "nvitop"
    assert safelisted(holder("python3 gpustat.py", "python3")) is None  # a script of another name
    assert safelisted(holder("python3 train.py", "python3")) is None
    assert safelisted(holder("python3 nvidia-smi-lookalike.py", "python3")) is None


def test_only_nvidia_character_devices_or_marked_simulated_files_count_as_gpus(tmp_path: Path) -> None:
    """A glob that matches /dev/null or a user's own file must not turn its holders into GPU holders."""
    from fleet.host.common import SIMULATED_GPUS_MARK, gpu_device_files

    (tmp_path / "nvidia0").write_text("")
    assert gpu_device_files(str(tmp_path / "nvidia*")) == []  # a regular file: not a GPU
    (tmp_path / SIMULATED_GPUS_MARK).write_text("")
    assert gpu_device_files(str(tmp_path / "nvidia*")) == [str(tmp_path / "nvidia0")]
    assert gpu_device_files("/dev/nul[l]") == []  # a character device, but not an NVIDIA one


def test_the_probe_and_the_act_step_share_one_definition_of_a_gpu_device() -> None:
    from fleet.host import common as host_common, free as remote_free, probe_gpus

    assert remote_free.gpu_device_files is probe_gpus.gpu_device_files is host_common.gpu_device_files


# --- which engines of a process group the act step stops with the one on the deployment's GPUs ------------


def classified(
    monkeypatch: pytest.MonkeyPatch,
    procs: dict[int, dict],
    on_gpus: dict[int, int],
    gpus: list[int],
    force: bool,
    recorded: int | None = None,
) -> list[int]:
    """The pids fleet.host.free.classify stops, with the host's probes answering from `on_gpus` (pid -> GPU)."""
    policy = "force" if force else "safe"
    return sorted(classify_table(monkeypatch, procs, on_gpus, gpus=gpus, recorded_pgid=recorded, kill_policy=policy)[0])


def proc(pid: int, pgid: int, uid: int, *argv: str) -> dict[str, object]:
    return {"pid": pid, "ppid": 1, "pgid": pgid, "uid": uid, "user": f"u{uid}", "comm": argv[0][:15],
            "state": "S", "start_ticks": 1, "cmdline": " ".join(argv), "argv": list(argv)}  # fmt: skip


VLLM = ("python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "9000")
SGLANG = ("python3", "-m", "sglang.launch_server", "--model-path", "/m")


def test_a_stale_server_is_stopped_whole_but_a_group_is_not_a_servers_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fleet's user's hand-started server: its launcher and the rank not on the GPUs taken go with the rank
    that is. Another user's job script (--force) and a GPU tool polled from the operator's script share a
    group with a server on other GPUs: that server is nobody's to stop."""
    me = os.getuid()
    stale = {100: proc(100, 100, me, *SGLANG), 101: proc(101, 100, me, *SGLANG), 102: proc(102, 100, me, *SGLANG)}
    assert classified(monkeypatch, stale, {101: 0, 102: 5}, [0], force=False) == [100, 101, 102]
    bobs = {200: proc(200, 200, me + 1, "bash", "job.sh"), 201: proc(201, 200, me + 1, "python3", "train.py"),
            202: proc(202, 200, me + 1, *VLLM)}  # fmt: skip
    assert classified(monkeypatch, bobs, {201: 0, 202: 5}, [0], force=True) == [201]  # forced: GPU 0's holder only
    polled = {300: proc(300, 300, me, "bash", "serve.sh"), 301: proc(301, 300, me, "nvidia-smi", "-q"),
              302: proc(302, 300, me, *VLLM)}  # fmt: skip
    assert classified(monkeypatch, polled, {301: 0, 302: 3}, [0], force=False) == []  # the tool is left running


def test_fleets_own_server_is_stopped_whole_even_holding_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group fleet launched (its record, verified on the host) shutting itself down after a failed
    smoke generation: the engine let go of GPU and port, its resource tracker is no engine. Every process of
    it goes, and only of fleet's user (a wrapper may have started another user's process in it)."""
    me = os.getuid()
    launched = {400: proc(400, 400, me, "python3", "-c", "launcher"), 401: proc(401, 400, me, *VLLM),
                402: proc(402, 400, me, "python3", "-c", "from multiprocessing.resource_tracker import main"),
                403: proc(403, 400, me + 1, "python3", "helper.py")}  # fmt: skip
    assert classified(monkeypatch, launched, {}, [0], force=False, recorded=400) == [400, 401, 402]
    assert classified(monkeypatch, launched, {}, [0], force=False) == []  # not recorded: nothing of it is seen


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{id}.scope/container",
        "0::/system.slice/docker-{id}.scope",
        "12:devices:/docker/{id}",
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b.slice/cri-containerd-{id}.scope",
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b.slice/crio-{id}.scope",
        "11:memory:/kubepods/besteffort/pod0a1b2c3d-0000-4000-8000-000000000000/{id}",
        "0::/system.slice/nerdctl-{id}.scope",
    ],
)
def test_a_process_in_a_container_or_a_kubernetes_pod_is_seen_as_one(cgroup: str) -> None:
    """Its server is somebody's (a pod's, another runtime's), never a stale server of fleet's user."""
    from fleet.host.container import CONTAINER_ID_RE

    cid = "0123456789abcdef" * 4
    m = CONTAINER_ID_RE.search(cgroup.format(id=cid))
    assert m and m.group(1) == cid
    assert not CONTAINER_ID_RE.search("0::/user.slice/user-1000.slice/session-3.scope")


def test_which_gpu_each_holder_holds_is_read_from_its_own_descriptors(tmp_path: Path) -> None:
    """The probe finds the holders of any GPU once (fuser), then which GPU each holds from those processes'
    descriptors only: the same answer as a scan of every process, without one `fuser` per GPU."""
    import subprocess
    import sys

    from fleet.host.common import SIMULATED_GPUS_MARK
    from fleet.host.probe_gpus import gpu_holders
    from fleet.host.procs import holders_by_file

    (tmp_path / SIMULATED_GPUS_MARK).write_text("")
    files = [str(tmp_path / f"nvidia{i}") for i in range(3)]
    for f in files:
        Path(f).write_text("")
    hold = "import sys, time; fs = [open(f) for f in sys.argv[1:]]; print(flush=True); time.sleep(60)"
    first = subprocess.Popen([sys.executable, "-c", hold, files[0]], stdout=subprocess.PIPE)
    both = subprocess.Popen([sys.executable, "-c", hold, files[0], files[2]], stdout=subprocess.PIPE)
    try:
        for p in (first, both):
            assert p.stdout is not None and p.stdout.readline()  # its files are open
        among = {first.pid, both.pid}
        expected = {files[0]: sorted(among), files[1]: [], files[2]: [both.pid]}
        assert holders_by_file(files, among=among) == expected
        assert holders_by_file(files) == expected  # every process looked at: the same
        found = gpu_holders(str(tmp_path / "nvidia*"))
        assert found["by_file"] == {"nvidia0": sorted(among), "nvidia1": [], "nvidia2": [both.pid]}
        assert sorted(h["pid"] for h in found["holders"]) == sorted(among)
    finally:
        for p in (first, both):
            p.kill()
            p.wait()
            assert p.stdout is not None
            p.stdout.close()


def test_a_holder_by_another_path_or_by_a_mapping_alone_is_tied_to_its_gpu(tmp_path: Path) -> None:
    """Found by an adversarial pass: which GPU a holder holds was read from its descriptors' paths, so a
    process that opened the device by another name (a bind mount in a container; here a hard link) or
    mapped it and closed the descriptor held "no GPU", and a placement took that GPU. The device and
    inode are compared now, mappings included, as `fuser` does."""
    import subprocess
    import sys

    from fleet.host.common import SIMULATED_GPUS_MARK
    from fleet.host.probe_gpus import gpu_holders
    from fleet.host.procs import holders_by_file

    (tmp_path / SIMULATED_GPUS_MARK).write_text("")
    files = [str(tmp_path / f"nvidia{i}") for i in range(3)]
    for f in files:
        Path(f).write_bytes(b"\0" * 4096)
    (tmp_path / "elsewhere").mkdir()
    os.link(files[1], tmp_path / "elsewhere" / "gpu")  # the same file by another path
    by_link = "import sys, time; f = open(sys.argv[1]); print(flush=True); time.sleep(60)"
    mapped = (
        "import mmap, sys, time; f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 4096); f.close(); "
        "print(flush=True); time.sleep(60)"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", by_link, str(tmp_path / "elsewhere" / "gpu")], stdout=subprocess.PIPE),
        subprocess.Popen([sys.executable, "-c", mapped, files[2]], stdout=subprocess.PIPE),
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline()
        linked, mapper = (p.pid for p in procs)
        expected = {files[0]: [], files[1]: [linked], files[2]: [mapper]}
        assert holders_by_file(files, among={linked, mapper}) == expected
        found = gpu_holders(str(tmp_path / "nvidia*"))
        assert found["by_file"] == {"nvidia0": [], "nvidia1": [linked], "nvidia2": [mapper]}
    finally:
        for p in procs:
            p.kill()
            p.wait()
            assert p.stdout is not None
            p.stdout.close()


def test_a_refused_holder_says_whether_it_is_another_users_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `fleet stop` says of a refused holder (ask its owner, or --force) follows whose process it is,
    not the words the kill policy gives as its reason."""
    me = os.getuid()
    procs = {
        7: proc(7, 7, me + 1, *SGLANG),  # another user's engine
        8: proc(8, 8, me, "python3", "notebook.py"),  # this user's own job, no engine
    }
    _, refused, _ = classify_table(monkeypatch, procs, {7: 0, 8: 0}, gpus=[0])
    assert {p["pid"]: p["other_user"] for p in refused} == {7: True, 8: False}
