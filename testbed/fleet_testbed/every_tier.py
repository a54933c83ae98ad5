"""A pytest plugin: with FLEET_EVERY_TIER set (`make test`, the README's test command and CI's), a run in
which any test was skipped fails, naming each with its reason. A tier that cannot run here (no root, no
podman, a package missing) is then a failed run, not a green one that tested less. `make unit`, the tier
to iterate with, sets nothing and still skips."""

from __future__ import annotations

import os

import pytest

EVERY_TIER = "FLEET_EVERY_TIER"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not os.environ.get(EVERY_TIER) or reporter is None or hasattr(session.config, "workerinput"):
        return  # an xdist worker's skips are counted once, by the controller that reports them
    skipped = reporter.stats.get("skipped", [])
    if not skipped:
        return
    reporter.write("\n")
    reporter.write_sep("=", f"{len(skipped)} test(s) skipped, and {EVERY_TIER} asks for every tier", red=True)
    for report in skipped[:20]:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        reporter.write_line(f"  {report.nodeid}: {reason}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
