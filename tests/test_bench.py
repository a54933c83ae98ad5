"""The benchmark runs (issue 39: `make bench` failed at once on a renamed import, and no test ran it, so
docs/benchmark.md described code that no longer existed). A short run of every section, in the serial tier:
it starts its own sshd and simulated fleet on ports of its own. What it measures is read by people, not
asserted: only that every section is there with numbers."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import ROOT
from fleet_testbed import simhost

pytestmark = pytest.mark.ssh

SECTIONS = [
    "### 1. Deploy orchestration",
    "### 2. Crash → relaunch issued",
    "### 3. Health sweep",
    "### 4. Cold start",
    "### 5a. Deploy through",
    "### 5b. Health sweep through",
    "### 6. Rolling restart of a service",
    "### 7. Pulling a model onto a host",
    "### 8. Pushing a model to a host without internet",
    "### 9. What watching the start-up costs",
    "### 10. Relaunching without reloading the weights",
    "### 11. A deployment in a container against the same container by hand",
    "### 12. Diagnosing a long log",
]


def test_a_short_benchmark_run_measures_every_section(tmp_path: Path) -> None:
    out = tmp_path / "bench.md"
    # a short root: the benchmark's pool socket lives under it, and a unix socket's path has 107 bytes
    root = Path(tempfile.mkdtemp(prefix="fb-", dir="/tmp"))
    env = dict(os.environ, FLEET_BENCH_ROOT=str(root), PYTHONPATH=str(ROOT / "testbed"))
    argv = ["--runs", "1", "--crashes", "3", "--sizes", "1,2", "--rtt-ms", "5", "--load-s-per-gib", "0.01"]
    # section 11 in podman, at the suite's engine speed: docker runs a deployment in tests/test_containers_ssh.py
    argv += ["--runtimes", "podman", "--startup-scale", "0.3"]
    argv += ["--out", str(out)]
    said = tmp_path / "bench.stderr"
    with said.open("w") as err:
        bench = subprocess.Popen(
            [sys.executable, "-m", "fleet_testbed.bench", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        code = bench.wait(timeout=600)  # ~2 minutes here; a stall is shown, not waited out
    except subprocess.TimeoutExpired:
        bench.send_signal(signal.SIGUSR1)  # where each of its threads waits, on its stderr
        time.sleep(2)
        bench.send_signal(signal.SIGINT)  # its own cleanup (pool, containers, sandboxes), given a while
        with contextlib.suppress(subprocess.TimeoutExpired):
            bench.wait(timeout=30)
        code = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, signal.SIGKILL)
        bench.wait()
        for sandbox in ("main", "sweep"):  # a killed run leaves its sshds (each in a session of its own)
            simhost.down(root / sandbox)
        shutil.rmtree(root, ignore_errors=True)
    assert code == 0, f"exit {code}; the benchmark said:\n{said.read_text()[-8000:]}"
    text = out.read_text()
    for section in SECTIONS:
        assert section in text, section
    deploy = text.split("### 1.")[1].split("###")[0]
    floor = re.search(r"\(floor\) \| ([\d.]+) ", deploy)
    assert floor and float(floor.group(1)) > 0  # a measured floor, in the same run
    assert re.search(r"\| fleet deploy --no-engine-check \| [\d.]+ .*\| [\d.]+x \|", deploy)
    boxed = text.split("### 11.")[1].split("###")[0]
    assert re.search(r"\| fleet deploy in podman, a plan new to the host .*\| [\d.]+x \|", boxed)
    assert re.search(r"\| fleet deploy in podman, the same plan again, `fleet pool` running .*\| [\d.]+x \|", boxed)
