"""Which layer may import which (issue 38 item 6; ../shared/tools/shape-check holds the pure core's side).

The CLI talks to control code: it parses what the operator said, calls a control function and presents
the answer with the pure core (plan, facts, crash and health verdicts, inventory). It never runs a host
step, reads a host record or the host code itself; it opens a connection only where it is given to a
control function, and the pool command serves the pool."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "fleet"

# What runs on a host or carries its steps: control code's to use, never the CLI's.
HOST_SIDE = (
    "fleet.hostscripts",
    "fleet.host_",
    "fleet.control.remote_",
    "fleet.facts.probe",
    "fleet.facts.model_files",
)
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
    host_side = sorted(n for n in imported(path) if n.startswith(HOST_SIDE))
    assert host_side == [], f"{path.name} imports host code: call a control function instead"
    if path.name not in MAY_CONNECT:
        transport = sorted(n for n in imported(path) if n == TRANSPORT or n.startswith(TRANSPORT + "."))
        assert transport == [], f"{path.name} imports the transport: take a connection from cli.base.transport_for"


def test_the_check_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from fleet.hostscripts import run_json\n    import fleet.transport.ssh\n")
    assert imported(sample) >= {"fleet.hostscripts", "fleet.transport.ssh"}
