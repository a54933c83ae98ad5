"""A real pid reuse in the middle of fleet's drain: the engine fleet stopped exits at SIGTERM, the kernel
gives its pid to another user's process, and the SIGKILL that ends the drain must not reach it.

The harness (tests/pid_reuse_harness.py) runs in a pid namespace of its own, where setting ns_last_pid
hands the exited engine's number to the newcomer for certain, whatever else runs on the machine."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HARNESS = Path(__file__).with_name("pid_reuse_harness.py")
SRC = Path(__file__).resolve().parents[1] / "src"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a pid namespace and another user's process need root and util-linux's unshare",
)


def reuse(tmp_path: Path, identity: str, who: str) -> dict[str, object]:
    """What the harness saw: the engine's pid handed to a newcomer (`who`) during fleet's drain."""
    run = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(HARNESS), identity, f"{tmp_path}/f", who],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(SRC)),
    )
    assert run.returncode == 0, run.stderr
    seen: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return seen


@pytest.mark.parametrize("identity", ["pidfd", "start-time"])
def test_a_pid_reused_during_the_drain_is_never_signalled(tmp_path: Path, identity: str) -> None:
    seen: dict[str, Any] = reuse(tmp_path, identity, "other-user")
    # the scenario is real: the engine's number now names another user's process
    assert seen["newcomer_pid"] == seen["engine_pid"] and seen["newcomer_uid"] == 65534
    # and fleet's stop did not touch it: no SIGKILL after the drain, and it says the engine drained
    assert seen["newcomer_ended_by"] == signal.SIGTERM, seen
    assert seen["forced"] == [] and seen["stops"][str(seen["engine_pid"])] == "SIGTERM, drained"


def test_a_group_that_took_the_stopped_groups_id_is_not_killed_as_its_members(tmp_path: Path) -> None:
    """The engine led its own group; its pid, and so the group's id, went to a new process of fleet's own
    user leading a group of its own. The SIGKILL after the drain looks at the stopped group as it is now
    (a worker forked meanwhile is stopped too): by its id alone, it found the newcomer's child."""
    seen: dict[str, Any] = reuse(tmp_path, "pidfd", "own-group")
    assert seen["newcomer_pid"] == seen["engine_pid"] and seen["newcomer_uid"] == os.getuid()
    assert seen["newcomer_ended_by"] == signal.SIGTERM and seen["member_alive"], seen
    assert seen["forced"] == [] and seen["stops"][str(seen["engine_pid"])] == "SIGTERM, drained"


def test_a_group_that_took_the_id_and_lost_its_leader_is_not_killed_as_the_stopped_group(tmp_path: Path) -> None:
    """The same, the newcomer gone once its child ran: a group without a leader was once taken for the
    stopped group (its members keep its id from reuse), and the child was killed. Only a process fleet
    read in the group, still in it, proves the id is the group's (found by a hostile pass)."""
    seen: dict[str, Any] = reuse(tmp_path, "pidfd", "own-group-leaderless")
    assert seen["newcomer_pid"] == seen["engine_pid"] and seen["member_alive"], seen
    assert seen["forced"] == [] and seen["stops"][str(seen["engine_pid"])] == "SIGTERM, drained"
