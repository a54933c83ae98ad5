"""The act step's order when a container's engine check runs beside the launch (fleet.host.act.under_lock).

The host's reads, the check and the launch are replaced here by recorders, so each branch of the order is
shown in milliseconds; tests/test_containers_ssh.py runs the same paths in real podman over sshd.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fleet.host.act as act
from fleet.host.records import STATE_FILE, write_record

ACCEPTED = {"verdict": "accepted", "output": ""}
REJECTED = {"verdict": "rejected", "output": "sglang serve: error: argument --x: invalid float value"}
LAUNCHED = {
    "pid": 4242,
    "pgid": 4242,
    "log": "",
    "exit_file": "",
    "started": 0.0,
    "start_ticks": 1,
    "container": {"cli": "podman", "name": "fleet-boxed", "id": "c0ffee"},
}


class Host:
    """What the act step did, in order, and what its reads and check answer."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, *, check: dict[str, Any]) -> None:
        self.done: list[str] = []
        self.check = check
        self.in_the_way: dict[str, Any] = {}  # what the next read finds: targets, refused, ours
        self.gone = False
        self.rm_code = 0
        self.log = tmp / "boxed.log"
        self.log.write_text("engine starting\n")
        monkeypatch.setattr(act, "engine_check", self.engine_check)
        monkeypatch.setattr(act, "what_is_in_the_way", self.read_way)
        monkeypatch.setattr(act, "stop_in_the_way", lambda *a: self.done.append("stop"))
        monkeypatch.setattr(act, "launch_and_record", self.launch)
        monkeypatch.setattr(act, "run_cli", self.run_cli)
        monkeypatch.setattr(act, "wait_memory_released", lambda *a: self.done.append("wait memory"))
        monkeypatch.setattr(act, "client_gone", lambda a: self.gone)

    def engine_check(self, request: dict[str, Any], gone: Any, yielding: bool = False) -> dict[str, Any]:
        self.done.append("check beside the launch" if yielding else "check")
        return self.check

    def read_way(self, a: Any, out: dict[str, Any], root: str, previous: Any) -> tuple[Any, Any, Any]:
        self.done.append("read the way")
        out["refused"], out["left"] = list(self.in_the_way.get("refused", [])), []
        way = act.Way({"gpus": [6, 7]}, self.in_the_way.get("ours", []), set(), set(), set(), [0, 0])
        return way, dict(self.in_the_way.get("targets", {})), {}

    def launch(self, a: Any, secrets: Any, state_dir: str, previous: Any, out: dict[str, Any]) -> None:
        self.done.append("launch")
        write_record(str(Path(state_dir) / STATE_FILE), {"status": "starting", "pid": 4242})
        out["launched"] = dict(LAUNCHED, log=str(self.log))

    def run_cli(self, argv: list[str], timeout_s: float = 60) -> tuple[int, str, str]:
        self.done.append(" ".join(argv))
        return self.rm_code, "", "" if self.rm_code == 0 else "Error: container is stuck"


def request(tmp: Path, *, container: bool = True) -> dict[str, Any]:
    check: dict[str, Any] = {"engine": "sglang", "python": "python3", "args": []}
    if container:
        check["container"] = {"cli": "podman", "name": "fleet-boxed-check-1", "image": "img", "options": []}
    return {
        "op": "launch",
        "lock": {"state_dir": str(tmp), "deployment": "boxed", "run_id": "r1"},
        "free": {"memory_wait_s": 1, "idle_mib": 0, "drain_s": 1, "gpu_devices": str(tmp)},
        "check": check,
        "launch": {"name": "boxed", "attempt": 1, "argv": ["python3"], "env": {}, "log_dir": str(tmp / "logs")},
        "state_update": {"status": "starting"},
    }


def run(tmp: Path, a: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    state_dir = tmp / "deployments" / "boxed"
    state_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    release = act.under_lock(a, {}, out, str(tmp), str(state_dir))
    return out, release


def record(tmp: Path) -> Path:
    return tmp / "deployments" / "boxed" / STATE_FILE


def test_with_nothing_in_the_way_a_containers_check_runs_while_its_engine_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Host(tmp_path, monkeypatch, check=ACCEPTED)
    out, _ = run(tmp_path, request(tmp_path))
    assert host.done == ["read the way", "stop", "launch", "check beside the launch"]
    assert out["launched"]["pid"] == 4242 and out["check"]["verdict"] == "accepted"


def test_a_check_that_refuses_the_launch_beside_it_takes_it_back_and_puts_the_record_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record(tmp_path).parent.mkdir(parents=True)
    write_record(str(record(tmp_path)), {"status": "stopped", "pid": 17})
    before = record(tmp_path).read_text()
    host = Host(tmp_path, monkeypatch, check=REJECTED)
    out, release = run(tmp_path, request(tmp_path))
    assert host.done[-3:] == ["check beside the launch", "podman rm -f c0ffee", "wait memory"]
    assert "launched" not in out and out["check"]["verdict"] == "rejected"
    assert release is False  # as a rejection before the launch: the run holds the lock for its fix
    assert record(tmp_path).read_text() == before
    assert host.log.read_text().splitlines()[-1].startswith("[fleet] withdrawn: the engine's check refused")
    assert out["withdrawn"] == str(host.log)


def test_a_first_launch_taken_back_leaves_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Host(tmp_path, monkeypatch, check=REJECTED)
    out, _ = run(tmp_path, request(tmp_path))
    assert "launched" not in out and not record(tmp_path).exists()


def test_fleet_gone_while_the_check_runs_beside_the_launch_takes_the_launch_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during the check changed nothing when the check came first; it changes nothing now."""
    host = Host(tmp_path, monkeypatch, check={"verdict": "client_gone", "output": ""})

    def check_then_gone(request: dict[str, Any], gone: Any, yielding: bool = False) -> dict[str, Any]:
        host.gone = True
        return host.check

    monkeypatch.setattr(act, "engine_check", check_then_gone)
    out, release = run(tmp_path, request(tmp_path))
    assert out["client_gone"] is True and release is True
    assert "launched" not in out and not record(tmp_path).exists()
    assert "podman rm -f c0ffee" in host.done


def test_a_container_that_cannot_be_removed_keeps_the_record_naming_it_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = Host(tmp_path, monkeypatch, check=REJECTED)
    host.rm_code = 125
    out, _ = run(tmp_path, request(tmp_path))
    assert out["withdraw_failed"] == "Error: container is stuck"
    assert out["launched"]["container"]["id"] == "c0ffee"
    assert json.loads(record(tmp_path).read_text())["pid"] == 4242  # fleet stop finds and removes it

    from fleet.control.answers import act_refusal

    said = act_refusal("blackwell", "boxed", {"lock": {"status": "taken"}, **out})
    assert (
        said is not None
        and "could not be removed" in str(said)
        and "fleet stop --host blackwell/boxed" in str(said.hint)
    )


@pytest.mark.parametrize(
    "way",
    [
        {"targets": {99: {"pid": 99}}},  # the deployment's old server: stopped only after the check
        {"refused": [{"pid": 7, "user": "bob", "cmdline": "python train.py", "why": "another user's"}]},
    ],
    ids=["a server to stop", "a holder refused"],
)
def test_with_something_in_the_way_the_check_comes_first_and_a_refusal_is_the_checks_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, way: dict[str, Any]
) -> None:
    host = Host(tmp_path, monkeypatch, check=REJECTED)
    host.in_the_way = way
    out, release = run(tmp_path, request(tmp_path))
    assert host.done == ["read the way", "check"]
    assert out["check"]["verdict"] == "rejected" and release is False
    assert "refused" not in out and "left" not in out  # the client reads a refusal before the check


def test_a_check_that_accepts_with_something_in_the_way_reads_the_way_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check may take minutes: what holds the GPUs is read again before anything is stopped."""
    host = Host(tmp_path, monkeypatch, check=ACCEPTED)
    host.in_the_way = {"targets": {99: {"pid": 99}}}
    run(tmp_path, request(tmp_path))
    assert host.done == ["read the way", "check", "read the way", "stop", "launch"]


def test_a_refusal_the_check_would_have_come_before_gives_way_to_the_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Host(tmp_path, monkeypatch, check=REJECTED)
    a = request(tmp_path)
    (tmp_path / "not-a-dir").write_text("")
    a["launch"]["log_dir"] = str(tmp_path / "not-a-dir" / "logs")  # unwritable: a pre-flight refusal
    out, release = run(tmp_path, a)
    assert out["check"]["verdict"] == "rejected" and "log_dir_unwritable" not in out and release is False
    Host(tmp_path, monkeypatch, check=ACCEPTED)
    out, release = run(tmp_path, a)
    assert "log_dir_unwritable" in out and release is True


def test_a_process_check_still_comes_before_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off a container the check may hold a GPU: the reads would see it, so it runs first as ever."""
    host = Host(tmp_path, monkeypatch, check=ACCEPTED)
    run(tmp_path, request(tmp_path, container=False))
    assert host.done == ["check", "read the way", "stop", "launch"]


def test_a_containers_check_is_given_no_gpu_whatever_the_runtime_would_give(tmp_path: Path) -> None:
    """Racing the engine's start, a check holding a GPU would be in its way (SGLang refuses GPUs whose free
    memory differs across ranks): NVIDIA's runtime and hooks give a container none with `void`, after the
    operator's options and whatever the image says."""
    from fleet.host.check import engine_check

    said = tmp_path / "argv"
    cli = tmp_path / "podman"
    cli.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {said}\n')
    cli.chmod(0o755)
    request = {
        "engine": "sglang",
        "python": "python3",
        "args": ["--model-path", "/models/m"],
        "container": {"cli": str(cli), "name": "fleet-boxed-check-1", "image": "img", "options": ["-e", "A=1"]},
    }
    assert engine_check(request, lambda: False, yielding=True)["verdict"] == "accepted"
    argv = said.read_text().splitlines()
    void = argv.index("NVIDIA_VISIBLE_DEVICES=void")
    assert argv[void - 1] == "-e" and argv.index("A=1") < void < argv.index("--entrypoint")
