"""Which program holds the GPU's device files, as the host-side script decides it (fleet.control.remote_act
runs on the host; these are its pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.host_common import program, safelisted

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
    assert safelisted(holder("/usr/bin/dcgm-exporter", "dcgm-exporter")) == "dcgm"
    assert safelisted(holder("python3 train.py", "python3")) is None
    assert safelisted(holder("python3 nvidia-smi-lookalike.py", "python3")) is None


def test_only_nvidia_character_devices_or_marked_simulated_files_count_as_gpus(tmp_path: Path) -> None:
    """A glob that matches /dev/null or a user's own file must not turn its holders into GPU holders."""
    from fleet.host_common import SIMULATED_GPUS_MARK, gpu_device_files

    (tmp_path / "nvidia0").write_text("")
    assert gpu_device_files(str(tmp_path / "nvidia*")) == []  # a regular file: not a GPU
    (tmp_path / SIMULATED_GPUS_MARK).write_text("")
    assert gpu_device_files(str(tmp_path / "nvidia*")) == [str(tmp_path / "nvidia0")]
    assert gpu_device_files("/dev/nul[l]") == []  # a character device, but not an NVIDIA one


def test_the_probe_and_the_act_step_share_one_definition_of_a_gpu_device() -> None:
    from fleet import host_common
    from fleet.control import remote_free
    from fleet.facts import probe

    assert remote_free.gpu_device_files is probe.gpu_device_files is host_common.gpu_device_files
