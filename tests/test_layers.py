"""Which layer may import which (issue 38 item 6; ../shared/tools/shape-check holds the pure core's side),
and that CI runs every tier (item 7).

The CLI talks to control code: it parses what the operator said, calls a control function and presents
the answer with the pure core (plan, facts, crash and health verdicts, inventory). It never runs a host
step, reads a host record or the host code itself; it opens a connection only where it is given to a
control function, and the pool command serves the pool."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_testbed.every_tier import EVERY_TIER

SRC = Path(__file__).resolve().parent.parent / "src" / "fleet"
TESTBED = SRC.parent.parent / "testbed"

# What runs on a host or carries its steps: control code's to use, never the CLI's.
HOST_SIDE = ("fleet.hostscripts", "fleet.host")  # the package fleet/host, and the code that sends it
TRANSPORT = "fleet.transport"
# The CLI modules that may import the transport, and why.
MAY_CONNECT = {
    "base.py": "transport_for: the one place the CLI opens a connection, handed to control code",
    "pool.py": "`fleet pool`: the connection pool is this command's own work",
}


def imported(path: Path) -> set[str]:
    """Every fleet module a file imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return {n for n in names if n.startswith("fleet.")}


CLI_FILES = sorted((SRC / "cli").glob("*.py"))


@pytest.mark.parametrize("path", CLI_FILES, ids=lambda p: p.name)
def test_the_cli_reaches_hosts_only_through_control_code(path: Path) -> None:
    host_side = sorted(n for n in imported(path) if n in HOST_SIDE or n.startswith(tuple(h + "." for h in HOST_SIDE)))
    assert host_side == [], f"{path.name} imports host code: call a control function instead"
    if path.name not in MAY_CONNECT:
        transport = sorted(n for n in imported(path) if n == TRANSPORT or n.startswith(TRANSPORT + "."))
        assert transport == [], f"{path.name} imports the transport: take a connection from cli.base.transport_for"


def test_the_check_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from fleet.hostscripts import run_step\n    import fleet.transport.ssh\n")
    assert imported(sample) >= {"fleet.hostscripts", "fleet.transport.ssh"}


def _pytest_here(directory: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fleet_testbed.every_tier", "."],
        cwd=directory,
        env={k: v for k, v in os.environ.items() if k != EVERY_TIER} | {"PYTHONPATH": str(TESTBED)} | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_of_every_tier_fails_when_a_test_could_not_run(tmp_path: Path) -> None:
    """`make test` (CI's command) sets FLEET_EVERY_TIER: a tier skipped for want of root or podman fails it."""
    (tmp_path / "test_tier.py").write_text(
        "import pytest\n\ndef test_runs():\n    pass\n\n"
        "def test_needs_podman():\n    pytest.skip('podman is not installed')\n"
    )
    every = _pytest_here(tmp_path, **{EVERY_TIER: "1"})
    assert every.returncode == 1, every.stdout
    assert "test_tier.py::test_needs_podman" in every.stdout and "podman is not installed" in every.stdout
    assert _pytest_here(tmp_path).returncode == 0  # make unit: skipping is allowed while iterating
    (tmp_path / "test_tier.py").write_text("def test_runs():\n    pass\n")
    assert _pytest_here(tmp_path, **{EVERY_TIER: "1"}).returncode == 0


def test_the_ssh_libraries_load_without_invokes_test_helper_and_leave_it_importable() -> None:
    """fleet.transport.sshlib keeps unittest.mock (and asyncio under it) out of a command's start, and a
    later import of it still gets the real module; paramiko keeps invoke for ssh_config's `Match exec`."""
    probe = (
        "import sys; import fleet.transport.ssh as s; "
        "assert 'unittest.mock' not in sys.modules and 'asyncio' not in sys.modules, 'loaded'; "
        "import paramiko.config; assert paramiko.config.invoke is not None, 'no invoke'; "
        "import unittest.mock; m = unittest.mock.Mock(); m.x(1); m.x.assert_called_once_with(1); print('ok')"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


# The engine's own Python runs these, with the engine installed: its modules are theirs to import.
ENGINE_SIDE = {"check_sglang.py": ("sglang", "transformers"), "check_vllm.py": ("vllm",)}
# Imported where the engine's environment may have them, each with a way on without it.
OPTIONAL = {
    "pynvml": "the engine environment's NVML binding; without it, nvidia-smi is read",
    "huggingface_hub": "the engine's own Hub client for fleet pull; without it, the pull is refused",
}
HOST_FILES = [*sorted((SRC / "host").glob("*.py")), SRC / "protocol.py"]


@pytest.mark.parametrize("path", HOST_FILES, ids=lambda p: p.name)
def test_code_that_runs_on_a_host_needs_only_the_standard_library(path: Path) -> None:
    """A host has a Python and nothing of fleet's dependencies: every import of a host file is the
    standard library's, fleet's own (its module form, when imported here), or, in an engine's check, the
    engine's. Tests may run host steps under this virtualenv's Python, where more would import."""
    allowed = set(sys.stdlib_module_names) | {"__future__", "fleet", *OPTIONAL, *ENGINE_SIDE.get(path.name, ())}
    tops = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            tops.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
    assert tops <= allowed, f"{path.name} imports {sorted(tops - allowed)}"
