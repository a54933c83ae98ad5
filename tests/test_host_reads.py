"""What the act and probe steps read on a host, and how often: docker and podman are asked at once, and a
launch that stops nothing reads the GPUs' memory once (each `ps` or `nvidia-smi` start costs tens of
milliseconds of every deploy: docs/benchmark.md, section 11)."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.host import container, free

# A `ps` that answers only once the other runtime has been asked too: asked one after the other, the
# first gives up waiting and says so (exit 3).
PS = """#!/bin/sh
touch "{dir}/{me}.asked"
i=0
while [ ! -e "{dir}/{other}.asked" ]; do
  i=$((i + 1)); [ $i -gt 200 ] && {{ echo "{other} was not asked meanwhile" >&2; exit 3; }}
  sleep 0.05
done
{answer}
"""


def fake_nvml(count: int, used_mib: int, listing: Callable[[int], list[object]]) -> object:
    """A pynvml module: `count` GPUs, each with `used_mib` in use, and `listing(handle)` its processes."""
    return types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=used_mib << 20),
        nvmlDeviceGetComputeRunningProcesses=listing,
    )


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: str, apps: str, first: str = "") -> None:
    """An `nvidia-smi` first on PATH answering fleet's two queries with these CSV rows (`\\n` between rows),
    after running the shell lines `first`, and no NVML binding (the host's own python3)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\n{first}case "$1" in\n'
        f'  --query-gpu=*) printf "{gpus}\\n" ;;\n'
        f'  --query-compute-apps=*) printf "{apps}\\n" ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails: no binding


def fake_runtimes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {
        "podman": """echo '[{"Id": "aa", "Names": ["fleet-a"], "Image": "i", "State": "running", "Labels": {}}]'""",
        "docker": """echo '{"ID": "bb", "Names": "b", "Image": "j", "State": "exited", "Labels": ""}'""",
    }
    for me, other in (("podman", "docker"), ("docker", "podman")):
        cli = tmp_path / me
        cli.write_text(PS.format(dir=tmp_path, me=me, other=other, answer=answers[me]))
        cli.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_docker_and_podman_are_asked_at_once_and_answer_in_the_order_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_runtimes(tmp_path, monkeypatch)
    listed = container.each_runtime(["docker", "podman"])
    assert [(cli, [c["id"] for c in found], error) for cli, found, error in listed] == [
        ("docker", ["bb"], None),
        ("podman", ["aa"], None),
    ]


def test_a_runtime_the_host_lacks_is_left_out_and_one_that_fails_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    podman = tmp_path / "podman"
    podman.write_text("#!/bin/sh\necho 'cannot reach the store' >&2\nexit 125\n")
    podman.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    here = container.cli_path
    monkeypatch.setattr(container, "cli_path", lambda name: None if name == "docker" else here(name))
    [(cli, found, error)] = container.each_runtime(["docker", "podman"])
    assert cli == "podman" and found == [] and error == "cannot reach the store"


def test_a_launch_that_stopped_nothing_takes_the_reading_before_as_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing was stopped since the memory was read: waiting starts from that reading, and ends at once
    when it is idle; after a stop, the GPUs are read again."""
    reads: list[object] = []

    def reading(indices: object = None, kept: object = None) -> tuple[set[int], list[int]]:
        reads.append(indices)
        return set(), [0, 0]

    monkeypatch.setattr(free, "nvml_pids_and_memory", reading)
    assert free.wait_memory_released([100, 0], 5.0, 600, [6, 7], set(), still=True)[1] == [100, 0]
    assert reads == []
    assert free.wait_memory_released([40_000, 0], 5.0, 600, [6, 7], set())[1] == [0, 0]
    assert reads == [[6, 7]]


def test_a_process_set_aside_during_the_wait_is_no_longer_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that took the GPU during the wait (pid 6) is left out of that reading and every later one; the
    process the stop is waiting for (pid 5) is still asked about."""
    asked: list[set[int]] = []

    def reading(gpus: list[int] | None, held: set[int]) -> tuple[set[int], list[int]]:
        return {5, 6} - held, [0 if 6 in held else 20_000]

    def aside(listed: set[int]) -> set[int]:
        asked.append(set(listed))
        return {6} & listed

    monkeypatch.setattr(free, "nvml_pids_and_memory", reading)
    assert free.wait_memory_released([40_000], 5.0, 600, [0], {9}, aside=aside)[1] == [0]
    assert asked == [{5, 6}]


def test_nvidia_smi_is_asked_both_questions_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an NVML binding (the host's own python3), the GPUs' use and their processes come from two
    `nvidia-smi` runs that overlap."""
    waits = (
        f'touch "{tmp_path}/$1.asked"\n'
        "i=0\n"
        f'while [ $(ls "{tmp_path}" | grep -c asked) -lt 2 ]; do\n'
        "  i=$((i + 1)); [ $i -gt 200 ] && exit 3; sleep 0.05\n"
        "done\n"
    )
    fake_smi(tmp_path, monkeypatch, "0, GPU-a, 30000", "GPU-a, 602, 29500", first=waits)
    assert free.nvml_pids_and_memory([0]) == ({602}, [30_000])


def test_a_kept_daemon_never_hides_what_nvml_lists_on_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a weight cache daemon kept, a GPU whose processes NVML cannot list (an older binding, vGPU, MIG)
    sends the memory reading to nvidia-smi; where there is none, the other GPUs' holders NVML did list are
    still holders (another user's job on GPU 0 is refused, not missed)."""

    def listing(h: int) -> list[object]:
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return [types.SimpleNamespace(pid=4242, usedGpuMemory=9_000 << 20)]

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(2, 9_500, listing))
    monkeypatch.setattr(free.shutil, "which", lambda name: None)  # no nvidia-smi either
    on_gpus, _ = free.nvml_pids_and_memory([0, 1], {602})
    assert on_gpus == {4242}
    assert free.nvml_pids_and_memory([0, 1], set()) == ({4242}, [9_500, 9_500])
