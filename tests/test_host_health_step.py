"""Parts of the health step (fleet/host/health.py) in this process: what it counts as served traffic, the
kernel log it reads on from where it stopped, and a container whose runtime is gone. The whole sweep runs
over real sshd (test_health.py) and against simulated hosts (test_deploy_loop.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.host import health


def test_served_requests_are_sglangs_and_vllms_counters_summed() -> None:
    sglang = 'sglang:num_requests_total{model_name="q"} 12.0\nsglang:num_requests_total{model_name="r"} 3\n'
    assert health._metric_total(sglang) == 15.0
    assert health._metric_total('vllm:request_success_total{finished_reason="stop"} 7\n') == 7.0
    assert health._metric_total("sglang:num_requests_total garbage\n") is None  # read as no counter
    assert health._metric_total("# HELP process_cpu_seconds_total\nprocess_cpu_seconds_total 9\n") is None


def test_the_kernel_log_is_read_on_from_where_the_last_check_stopped(tmp_path: Path) -> None:
    kern = tmp_path / "kern.log"
    kern.write_text("NVRM: Xid 79, GPU has fallen off the bus\n")
    text, offset = health._kernel_lines(str(kern), 0)
    assert "Xid 79" in text and offset == kern.stat().st_size
    with kern.open("a") as f:
        f.write("NVRM: Xid 48, double bit ECC error\n")
    text, offset = health._kernel_lines(str(kern), offset)
    assert text == "NVRM: Xid 48, double bit ECC error\n"
    kern.write_text("rotated\n")  # shorter than where the last check stopped: read from the start
    assert health._kernel_lines(str(kern), offset) == ("rotated\n", 8)
    assert health._kernel_lines(str(tmp_path / "gone.log"), offset) == ("", 0)


def test_the_log_lines_a_health_check_reads_are_split_at_newlines_alone(tmp_path: Path) -> None:
    """A client's text echoed into the log with U+2028, VT or FS in it stays in its line (the sweep
    diagnoses these lines); a CR, a progress bar's redraw, ends one as the watch has it."""
    log = tmp_path / "server.log"
    log.write_text("Receive: text='a\u2028b\vc\x1cd'\r\nloading 10%\rloading 20%\nready\n", encoding="utf-8")
    record = {"status": "ready", "pid": 1 << 30, "pgid": 1 << 30, "port": 30000, "log": str(log)}
    asked = {"http_timeout_s": 1.0, "skip_generation": True}
    out = health.check_server(record, [], {}, asked)  # type: ignore[arg-type]
    assert out["log_lines"] == ["Receive: text='a\u2028b\vc\x1cd'", "loading 10%", "loading 20%", "ready"]


def test_a_log_that_is_no_regular_file_of_its_own_is_not_read(tmp_path: Path) -> None:
    """The record names the log; another user (or an accident) may put something else in its place: a
    link to /dev/zero (read whole, it filled the host's memory), a FIFO (it hung the probe for good, one
    per cron run), a directory, a link to another file. None is read; the rest of the check goes on."""
    import os

    record = {"status": "ready", "pid": 1 << 30, "pgid": 1 << 30, "port": 30000}
    asked = {"http_timeout_s": 1.0, "skip_generation": True}
    secret = tmp_path / "not-a-log"
    secret.write_text("RuntimeError: CUDA error: an illegal memory access was encountered\n")
    for name, make in (
        ("zero", lambda p: p.symlink_to("/dev/zero")),
        ("fifo", lambda p: os.mkfifo(p)),
        ("dir", lambda p: p.mkdir()),
        ("elsewhere", lambda p: p.symlink_to(secret)),
    ):
        log = tmp_path / f"{name}.log"
        make(log)
        out = health.check_server({**record, "log": str(log)}, [], {}, asked)  # type: ignore[arg-type]
        assert out["log_lines"] == [], name
    grown = tmp_path / "grown.log"
    grown.write_bytes(b"x" * (3 << 20) + b"\nlast line\n")  # a log that grew by far more than a check reads
    out = health.check_server({**record, "log": str(grown)}, [], {}, asked)  # type: ignore[arg-type]
    assert out["log_lines"][-1] == "last line" and sum(map(len, out["log_lines"])) <= 1 << 20


def test_a_container_whose_runtime_is_gone_is_reported_missing_and_its_server_not_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither docker nor podman here any more
    record = {
        "status": "ready",
        "pid": 1 << 30,  # above Linux's largest pid: no process has it
        "pgid": 1 << 30,
        "port": 30000,
        "container": {"cli": "podman", "id": "abc123", "name": "fleet-qwen"},
    }
    asked = {"http_timeout_s": 1.0, "skip_generation": False}
    out = health.check_server(record, [], {}, asked)  # type: ignore[arg-type]
    assert out["container"] == {"missing": True, "name": "fleet-qwen"}
    assert out["server"]["alive"] is False and out["http"] == {}


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0, reason="needs root")
def test_another_users_process_with_the_recorded_pid_is_never_the_server() -> None:
    """A record an older fleet wrote names its server's pid alone; another user's process that has the
    pid now is not fleet's server, whatever it answers."""
    import subprocess

    other = subprocess.Popen(["sleep", "30"], user=4242, group=4242)
    try:
        record = {"status": "ready", "pid": other.pid, "pgid": other.pid, "port": 30000}
        out = health.check_server(record, [], {}, {"http_timeout_s": 1.0, "skip_generation": True})  # type: ignore[arg-type]
        assert out["server"]["alive"] is False
    finally:
        other.kill()
        other.wait()


def test_a_heal_count_that_cannot_be_read_allows_no_heal_and_a_failure_is_said_in_one_line(tmp_path: Path) -> None:
    """An unreadable heals.json was set aside and counted as no heal at all: the hourly limit started
    over. A heal step that failed (a full disk, a state directory that is a file) printed its traceback."""
    import json
    import sys

    from fleet.hostscripts import script_for
    from fleet.transport.local import LocalTransport

    def heal(state_dir: Path) -> dict:
        args = {"state_dir": str(state_dir), "deployment": "q", "limit": 3}
        return json.loads(LocalTransport("h").run(script_for("heal", args, [sys.executable]), timeout_s=30).text)

    state = tmp_path / "state"
    assert heal(state) == {"allowed": True, "recent": 0}
    heals = state / "deployments" / "q" / "heals.json"
    heals.write_text("{not json")
    assert heal(state)["allowed"] is False and heal(state)["allowed"] is False  # counted as the limit reached
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    said = heal(blocked)
    assert set(said) == {"error"} and "\n" not in said["error"] and "Traceback" not in said["error"]


def test_a_server_whose_health_never_answers_is_asked_nothing_more() -> None:
    """A frozen engine (its port open, nothing answering) cost /health, /v1/models, /metrics and the
    prompt their whole timeouts, one after another: two on one host ran past the check's deadline."""
    import os
    import socket

    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(8)  # connections are taken by the kernel; nobody ever answers them
        record = {
            "status": "ready",
            "pid": os.getpid(),
            "pgid": os.getpgid(0),
            "port": frozen.getsockname()[1],
            "smoke": {"prompt": "2+2=", "expect": "4", "max_tokens": 4},
        }
        asked = {"http_timeout_s": 0.3, "generation_timeout_s": 5.0, "skip_generation": False}
        out = health.check_server(record, [], {}, asked)  # type: ignore[arg-type]
    assert out["server"]["alive"] and out["http"]["health"]["status"] is None
    assert "models" not in out["http"] and "metrics" not in out["http"]
    assert out["http"]["generation"] == {"skipped": "its /health did not answer"}


def test_an_unverified_server_that_answers_the_prompt_is_recorded_ready_and_only_then(tmp_path: Path) -> None:
    """A run cut off after its launch leaves the server `unverified`; cron's health warned about it until
    the next deploy, though it answered every prompt. A right answer from the recorded process running its
    recorded command line proves it: the record says ready. Nothing less does, and never under a run."""
    import json
    import os

    from fleet.host.records import deployment_dir

    directory = Path(deployment_dir(str(tmp_path), "q"))
    directory.mkdir(parents=True)
    state = directory / "state.json"
    unverified = {"schema": 1, "status": "unverified", "pid": 4321, "run_id": "r1", "reason": "fleet's run ended"}
    serving = {"alive": True, "drift": False, "port": 30000, "ports": [30000, 30001]}
    answered = {"server": serving, "http": {"generation": {"ok": True, "status": 200}}}

    def proves(checked: dict = answered, **changed: object) -> bool:
        state.write_text(json.dumps({**unverified, **changed}))
        return health.prove_unverified(str(tmp_path), "q", {**unverified, **changed}, checked)  # type: ignore[arg-type]

    wrong = {**answered, "http": {"generation": {"ok": False, "status": 200}}}
    skipped = {**answered, "http": {"generation": {"skipped": "--skip-generation"}}}
    drifted = {**answered, "server": {**serving, "drift": True}}
    gone = {**answered, "server": {"alive": False}}
    elsewhere = {**answered, "server": {**serving, "ports": [30001]}}  # another process answers on its port
    for checked in (wrong, skipped, drifted, gone, elsewhere):
        assert not proves(checked)
    assert not proves(status="starting") and not proves(group={"rank": 0, "hosts": ["a", "b"]})
    assert json.loads(state.read_text())["status"] == "unverified"
    lock = directory / "lock.json"
    lock.write_text(json.dumps({"schema": 1, "run_id": "r2", "holder_pid": os.getpid()}))
    assert not proves()  # a run holds the deployment: its own record comes next
    lock.unlink()
    state.write_text(json.dumps({**unverified, "pid": 999}))  # another launch since the probe read it
    assert not health.prove_unverified(str(tmp_path), "q", unverified, answered)  # type: ignore[arg-type]
    assert proves()
    record = json.loads(state.read_text())
    assert record["status"] == "ready" and record["run_id"] == "r1" and "proven by fleet health" in record["reason"]
