"""A host step started before its request (fleet.step_ahead): the act step's start on the host passes
while the host is probed and the deploy planned. Run through `connection: local`, the real act step."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from fleet.control.host_steps import SshSteps, give_up_ahead, start_act_ahead
from fleet.errors import HostStepError
from fleet.protocol import ActRequest
from fleet.step_ahead import StepAhead
from fleet.transport.local import LocalTransport


def release(state_dir: Path) -> ActRequest:
    """An act request that takes the deployment's lock and lets it go: it shows the step ran it."""
    return {
        "op": "release",
        "lock": {
            "state_dir": str(state_dir),
            "deployment": "small",
            "places": False,
            "gpus": None,
            "replace": [],
            "run_id": "run-1",
            "owner": "tester",
            "grace_s": 5.0,
            "command": "deploy",
        },
    }


def test_an_act_started_ahead_runs_the_request_it_is_given_later(tmp_path: Path) -> None:
    t = LocalTransport("h")
    ahead = StepAhead(t, "act", sys.executable)
    said = ahead.answer({**release(tmp_path / "state"), "client_on_stdin": True}, b"{}\n", 60)
    assert said is not None and said["lock"]["status"] == "taken"
    assert (tmp_path / "state" / "deployments" / "small").is_dir()
    assert t.commands_run == 1
    assert ahead.answer({**release(tmp_path / "state")}, b"{}\n", 60) is None  # one request, once


def test_an_act_started_ahead_and_never_asked_ends_having_done_nothing(tmp_path: Path) -> None:
    ahead = StepAhead(LocalTransport("h"), "act", sys.executable)
    ahead.give_up()
    ahead._thread.join(60)  # the step's stdin ended: it ends, and its command with it
    assert not ahead._thread.is_alive()
    assert not (tmp_path / "state").exists()
    assert ahead.answer(release(tmp_path / "state"), b"{}\n", 60) is None  # the caller runs the step itself


def test_a_step_started_ahead_that_fails_on_the_host_is_the_steps_own_error(tmp_path: Path) -> None:
    ahead = StepAhead(LocalTransport("h"), "act", sys.executable)
    with pytest.raises(HostStepError, match="unknown operation 'launch-everything'"):
        ahead.answer({"op": "launch-everything", "lock": {}}, b"{}\n", 60)


class Counted(LocalTransport):
    def __init__(self, chunked_input_connects: bool = False) -> None:
        super().__init__("h")
        self.chunked_input_connects = chunked_input_connects
        self.scripts: list[str] = []

    def stream(self, script: str, *args: Any, **kwargs: Any) -> int:
        self.scripts.append(script)
        return super().stream(script, *args, **kwargs)


def test_the_deploys_first_act_takes_the_step_started_ahead(tmp_path: Path) -> None:
    t = Counted()
    start_act_ahead(t, sys.executable)
    out = SshSteps(t).act(sys.executable, release(tmp_path / "state"), stdin=b"{}", timeout_s=60, hold_stdin=True)
    assert out["lock"]["status"] == "taken"
    assert t.commands_run == 1 and '"ahead": true' in t.scripts[0]
    assert "run-1" not in t.scripts[0]  # the request travels on stdin: never in the host's `ps`
    SshSteps(t).act(sys.executable, release(tmp_path / "state"), stdin=b"{}", timeout_s=60, hold_stdin=True)
    assert t.commands_run == 2 and '"ahead"' not in t.scripts[1]  # the next act runs as usual


def test_an_act_started_under_another_python_than_the_plans_is_given_up(tmp_path: Path) -> None:
    """A container's act runs under the host's step Python, known before planning; a plan that names
    another (the step started ahead guessed wrong) runs its own act, and the one ahead ends unasked."""
    t = Counted()
    start_act_ahead(t, "/nonexistent/python")
    out = SshSteps(t).act(sys.executable, release(tmp_path / "state"), stdin=b"{}", timeout_s=60, hold_stdin=True)
    assert out["lock"]["status"] == "taken"
    assert t.commands_run == 2 and '"ahead"' not in t.scripts[1]


def test_no_step_is_started_ahead_over_the_connection_pool_and_one_given_up_is_forgotten() -> None:
    pooled = Counted(chunked_input_connects=True)  # a held stdin would open a connection of its own there
    start_act_ahead(pooled, sys.executable)
    assert pooled.commands_run == 0
    t = Counted()
    start_act_ahead(t, sys.executable)
    give_up_ahead(t)
    give_up_ahead(t)  # nothing left to give up: no error
    assert t.commands_run == 1
