"""Shared fixtures: the simulated fleet (real sshd per host on loopback, PID namespaces) and a CLI runner.

Tests never read the developer's ~/.ssh: FLEET_KNOWN_HOSTS / FLEET_SSH_CONFIG point into the sandbox.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "testbed"))
# Ctrl-C is Python's KeyboardInterrupt here (and SIG_DFL in every process a test starts), also when the
# suite was started in the background by a shell without job control, which ignores SIGINT for it: the
# Ctrl-C tests would otherwise see fleet run to the end.
signal.signal(signal.SIGINT, signal.default_int_handler)

from fleet.cli import main  # noqa: E402
from fleet_testbed import simhost  # noqa: E402

pytest_plugins = ["fleet_testbed.every_tier"]  # make test: a skipped test fails the run

TEST_PORT = 2322  # the demo sandbox uses 2222; both can run at once
BLACKWELL = replace(simhost.BLACKWELL, address="127.0.2.2")
CT129 = replace(simhost.CT129, address="127.0.2.3")


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(*argv: str) -> CliResult:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return CliResult(code, out.getvalue(), err.getvalue())


def host_python3_is_this_one(bin_dir: Path) -> None:
    """`bin_dir/python3` runs this test run's own Python (a link would lose its virtual environment), so
    coverage follows a host step run through `python3` as it follows every other host step."""
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)


NOT_A_PID = 1 << 30  # above Linux's largest pid (2**22): no process has it


def classify_table(monkeypatch: pytest.MonkeyPatch, procs: dict, on_gpus: dict, **free: object) -> tuple:
    """fleet.host.free.classify over a made-up process table, the host's probes answering from `on_gpus`
    (pid -> GPU index): (targets, refused, left). fleet's own command is no process of the table: the
    test's own pid is whatever the machine gave it, and may be one the table names."""
    from fleet.host import free as rf

    monkeypatch.setattr(rf, "port_holders", lambda port, bind="0.0.0.0": (set(), False))
    monkeypatch.setattr(rf, "device_files_of", lambda glob, idx: [])
    monkeypatch.setattr(rf, "nvml_pids_and_memory", lambda idx=None: ({p for p, g in on_gpus.items() if g in idx}, []))
    monkeypatch.setattr(rf, "container_of", lambda pid: None)
    monkeypatch.setattr(rf, "own_command", lambda: (NOT_A_PID, NOT_A_PID))
    a = {"port": None, "gpu_devices": "/dev/nvidia*", "siblings": {}, "kill_policy": "safe", **free}
    return rf.classify(a, procs)  # type: ignore[arg-type]


def _sshd_available() -> bool:
    return any(os.path.exists(p) for p in ("/usr/sbin/sshd",)) and shutil.which("ssh") is not None


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> simhost.Sandbox:
    if not _sshd_available():
        pytest.fail("OpenSSH sshd is not installed: run `make test` (it installs openssh-server)")
    os.environ["SIM_SPEED"] = os.environ.get("SIM_SPEED", "0.3")
    root = tmp_path_factory.mktemp("fleet-sandbox")
    sb = simhost.up(root, [BLACKWELL, CT129], TEST_PORT)
    yield sb
    simhost.down(root)


@pytest.fixture(autouse=True)
def no_secret_read_before() -> Iterator[None]:
    """Each test starts in a process that has read no secret (fleet.secrets.hide hides what one read)."""
    from fleet.secrets import forget_all

    forget_all()
    yield
    forget_all()


@pytest.fixture
def fleet_env(sandbox: simhost.Sandbox, monkeypatch: pytest.MonkeyPatch) -> simhost.Sandbox:
    """A clean simulated fleet and fleet's environment pointing at it."""
    for spec in (BLACKWELL, CT129):
        simhost.reset_host(sandbox, spec)
    for key, value in sandbox.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FLEET_INVENTORY", str(sandbox.inventory))
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(ROOT / "playbooks"))
    monkeypatch.setenv("FLEET_SERVICES", str(sandbox.root / "no-services"))  # a test that wants one says so
    monkeypatch.setenv("XDG_CACHE_HOME", str(sandbox.root / "cache"))
    return sandbox


class Background:
    """A process started for a test (a decoy GPU holder, a stale server) that is always reaped."""

    def __init__(self, argv: list[str]) -> None:
        import subprocess

        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


# --- the reliability report: faults survived and bad inputs tried, from this run's own results ---------

REPORTED = {
    "test_faults.py": "fault",
    "test_inventory.py": "bad input",
    "test_transport.py": "hostile input / security",
    "test_deploy.py": "safety",
    "test_pool.py": "connection pool (faults, security, the suites above through it)",
}
_RESULTS: list[tuple[str, str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
    if module in REPORTED and (report.when == "call" or (report.when == "setup" and report.outcome != "passed")):
        _RESULTS.append((REPORTED[module], report.nodeid.split("::", 1)[1], report.outcome))


def pytest_terminal_summary(terminalreporter, exitstatus: int) -> None:  # type: ignore[no-untyped-def]
    if not _RESULTS:
        return
    lines = ["| kind | case | result |", "| --- | --- | --- |"]
    lines += [f"| {kind} | `{name}` | {outcome} |" for kind, name, outcome in _RESULTS]
    passed = sum(1 for *_, o in _RESULTS if o == "passed")
    text = (
        "# Reliability report\n\nProduced by the test suite itself (`make reliability-report`); "
        f"{passed} of {len(_RESULTS)} cases passed in the run that wrote this file.\n\n" + "\n".join(lines) + "\n"
    )
    terminalreporter.write_line(f"reliability: {passed}/{len(_RESULTS)} fault, bad-input and safety cases passed")
    # Tests never edit tracked files: the report is written only where `make reliability-report` asks.
    target = os.environ.get("FLEET_RELIABILITY_REPORT")
    if target and {k for k, *_ in _RESULTS} == set(REPORTED.values()):  # only a full run writes the report
        Path(target).write_text(text)
