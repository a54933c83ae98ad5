"""A host step started before its request (fleet.step_ahead): the act step's start on the host passes
while the host is probed and the deploy planned. Run through `connection: local`, the real act step."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from fleet import step_ahead
from fleet.control.host_steps import SshSteps, give_up_ahead, start_act_ahead
from fleet.errors import HostStepError, TransportError
from fleet.hostscripts import script_for
from fleet.protocol import ActRequest
from fleet.step_ahead import StepAhead
from fleet.transport.local import LocalTransport
from simengine import wait_until


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
    from fleet.control import host_steps

    t = Counted()
    start_act_ahead(t, sys.executable)
    ahead = host_steps._ACT_AHEAD[id(t)]
    give_up_ahead(t)
    give_up_ahead(t)  # nothing left to give up: no error
    ahead._thread.join(timeout=60)  # its thread starts the step, sees it given up and ends (on a busy machine, later)
    assert not ahead._thread.is_alive() and t.commands_run == 1


def test_a_step_given_up_runs_no_request_given_after(tmp_path: Path) -> None:
    ahead = StepAhead(LocalTransport("h"), "act", sys.executable)
    ahead.give_up()
    assert ahead.answer(release(tmp_path / "state"), b"{}\n", 60) is None  # before the step has even ended
    ahead._thread.join(60)
    assert not (tmp_path / "state").exists()


def test_an_act_that_outlives_its_timeout_is_ended_not_left_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a step run the usual way is killed at its timeout, one started ahead is too: fleet has said the
    host timed out, and the step must not go on to stop or launch anything after that."""
    pid_file, worked = tmp_path / "pid", tmp_path / "worked"

    def slow_step(step: str, args: object, pythons: object) -> str:
        return f"echo $$ > {pid_file}; read request; read secrets; sleep 30; touch {worked}"

    monkeypatch.setattr(step_ahead, "script_for", slow_step)
    ahead = StepAhead(LocalTransport("h"), "act", sys.executable)
    with pytest.raises(TransportError, match="timed out after 1 s"):
        ahead.answer({"op": "launch"}, b"{}\n", 1)
    pid = int(pid_file.read_text())
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or " Z " in Path(f"/proc/{pid}/stat").read_text())
    assert not worked.exists()


def test_the_host_step_waits_for_its_request_no_longer_than_it_was_told() -> None:
    """A client gone without closing its connection (a laptop suspended) never sends the end of stdin: the
    act started ahead ends by itself, having done nothing."""
    fleet_done = threading.Event()
    out = bytearray()

    def held_open() -> object:
        fleet_done.wait(60)
        yield b""

    script = script_for("act", {"ahead": True, "wait_s": 0.3}, [sys.executable])
    try:
        code = LocalTransport("h").stream(
            script, lambda chunk: out.extend(chunk) or True, stdin=held_open(), timeout_s=30
        )
    finally:
        fleet_done.set()
    assert code == 0 and b"started ahead and given no request" in out
