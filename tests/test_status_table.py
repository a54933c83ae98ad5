"""How `fleet status`, `fleet stop` and `fleet fixes list` put what they found into lines (pure: rows in, text out)."""

from __future__ import annotations

from typing import Any

from fleet.cli.report import describe_stop, describe_stopped
from fleet.cli.status_table import COLUMNS, status_lines, without_stopped
from fleet.control.ops import memory_held

READY = {
    "host": "blackwell",
    "deployment": "small",
    "status": "ready",
    "gpus": [6, 7],
    "playbook": "qwen36-27b",
    "engine": "sglang",
    "engine_version": "0.5.11",
    "pid": 39,
    "engine_pid": 41,
    "port": 30010,
    "uptime_s": 12,
    "attempts": 1,
}


def row(**changes: Any) -> dict[str, Any]:
    return {**READY, **changes}


def test_status_has_a_header_and_columns_as_wide_as_their_widest_cell() -> None:
    lines = status_lines(
        [row(), row(deployment="qwen35-nvfp4-handwritten", playbook="qwen35-nvfp4-handwritten", status="stopped")]
    )
    assert lines[0].split() == list(COLUMNS)
    pid_at = lines[0].index("PID")
    assert [line[pid_at:].split()[0] for line in lines[1:]] == ["41", "41"]  # a long name shifts no column


def test_status_shows_the_engines_pid_and_the_launchers_only_without_it() -> None:
    def pid_shown(r: dict[str, Any]) -> str:
        header, line = status_lines([r])
        return line[header.index("PID") :].split()[0]

    assert pid_shown(row()) == "41"
    assert pid_shown(row(engine_pid=None)) == "39"  # the engine not (yet) seen under its launcher
    assert pid_shown(row(engine_pid=None, pid=None, status="stopped")) == "-"


def test_an_unreachable_host_says_why_in_its_row_and_a_starting_one_its_phase_below() -> None:
    starting = row(
        status="starting",
        startup={"phase": "weights", "title": "loading weights", "done": 2, "of": 6, "in_phase_s": 40,
                 "elapsed_s": 55, "eta_s": 90, "starts": 2},
    )  # fmt: skip
    lines = status_lines([{"host": "ct129", "status": "unreachable", "error": "connection refused"}, starting])
    assert lines[1].startswith("ct129 ") and "unreachable" in lines[1] and lines[1].endswith("connection refused")
    assert lines[3].lstrip().startswith("start-up: loading weights 2/6") and len(lines) == 4


def test_a_stopped_container_without_a_pid_is_named_by_its_container() -> None:
    stopped = {
        "pid": None,
        "pgid": None,
        "user": "-",
        "cmdline": "container fleet-ct129-qwen36 (lmsysorg/sglang:v0.5.11)",
        "why": "fleet's container of deployment qwen36",
        "stop": "docker stop -t 15, removed",
    }
    [line] = describe_stopped([stopped])
    assert "pid None" not in line and line.endswith("container fleet-ct129-qwen36 (lmsysorg/sglang:v0.5.11)")


def test_a_stop_says_when_the_gpus_it_freed_are_still_in_use_once_its_wait_ran_out() -> None:
    """Memory over the idle floor on the GPUs waited for, once something was stopped: said with the GPUs
    and the amount. Memory on GPUs nothing was stopped for, or below the floor, is not."""
    ended = [{"pid": 7, "pgid": 7, "user": "me", "cmdline": "python -m sglang.launch_server", "why": "x"}]
    held = {
        "ended": ended,
        "memory": {"before_mib": [900, 800], "after_mib": [600, 10], "waited_s": 30.2, "gpus": [0, 1]},
    }
    [m] = memory_held("small", held, idle_mib=100)
    assert m == {"deployment": "small", "gpus": [0], "mib": 600, "waited_s": 30.2}
    said = describe_stop({**held, "memory_held": [m]})
    assert said[-1] == (
        "GPU memory still in use on GPU 0 after 30s (0.6 GiB; deployment small): "
        "nvidia-smi on the host shows what holds it"
    )
    no_record = describe_stop({**held, "memory_held": [{**m, "deployment": None}]})  # stale engines only
    assert (
        no_record[-1]
        == "GPU memory still in use on GPU 0 after 30s (0.6 GiB): nvidia-smi on the host shows what holds it"
    )
    every_gpu = {**held, "memory": {"after_mib": [0, 0, 4096], "waited_s": 30.0, "gpus": None}}
    assert memory_held("small", every_gpu, idle_mib=100)[0]["gpus"] == [2]
    released = {**held, "memory": {"after_mib": [40, 10], "waited_s": 0.4, "gpus": [0, 1]}}
    nothing_stopped = {**held, "ended": []}
    assert memory_held("small", released, 100) == memory_held("small", nothing_stopped, 100) == []
    # an answer not of the step's shape (a host's damaged or foreign step) says nothing, and breaks nothing
    for memory in ([], "x", {"after_mib": [None], "gpus": [0], "waited_s": 1.0}, {"after_mib": 5, "waited_s": 1.0},
                   {"after_mib": ["9"], "waited_s": 1.0}, {"after_mib": [900], "gpus": 3, "waited_s": 1.0},
                   {"after_mib": [900], "gpus": [0], "waited_s": "x"}):  # fmt: skip
        assert memory_held("small", {"ended": ended, "memory": memory}, 100) == []


def test_stopped_deployments_are_left_out_unless_asked_and_every_host_still_answers() -> None:
    rows = [
        row(),
        row(deployment="old", status="stopped"),
        row(host="ct129", deployment="gone", status="stopped"),
        row(host="ct129", deployment="older", status="stopped"),
        row(host="spare", deployment=None, status="none"),
    ]
    kept = without_stopped(rows)
    assert [(r["host"], r["deployment"], r["status"]) for r in kept] == [
        ("blackwell", "small", "ready"),
        ("ct129", None, "none"),
        ("spare", None, "none"),
    ]
    ct129 = status_lines(kept)[2]
    assert ct129.startswith("ct129 ") and ct129.endswith("2 stopped (--all shows them)")


def test_a_field_from_a_host_record_cannot_start_a_row_of_its_own() -> None:
    """A record on a host is anyone's to edit: a newline in its status or playbook stays in its cell."""
    forged = row(status="ready\nblackwell/fake  ready", playbook="qwen\r\n36", engine_version="0.5\t11")
    lines = status_lines([forged, row(deployment="other")])
    assert len(lines) == 3 and lines[1].startswith("blackwell/small  ready\\nblackwell/fake")
    assert "\r" not in "".join(lines) and "\t" not in "".join(lines)


def test_a_learned_fix_is_one_line_whatever_its_record_on_the_host_says() -> None:
    from fleet.cli.fixes import fix_line

    fix = {"model": "Qwen3.6-27B", "engine": "sglang 0.5.11", "gpu": "RTX A6000", "learned_at": "2026-12-05"}
    line = fix_line("ct129", {**fix, "signature": "oom\nct129  fake-fix  learned now", "applied": False, "fix": ""})
    assert "\n" not in line and line.startswith("ct129  Qwen3.6-27B  sglang 0.5.11  RTX A6000  oom\\nct129")


def test_a_stop_never_offers_force_for_another_users_job_without_saying_whose_it_is() -> None:
    """What a stop refused: another user's job is said to be theirs (--force would end somebody's
    training run); fleet's user's own non-engine process only names --force."""
    refused = [
        {"pid": 7, "user": "alice", "cmdline": "python train.py", "why": "process of user alice", "other_user": True},
        {"pid": 8, "user": "me", "cmdline": "python notebook.py", "why": "not an inference server"},
    ]
    theirs, mine = describe_stop({"ended": [], "left": [], "refused": refused})
    assert theirs == (
        "not stopped: pid 7 (user alice: python train.py) — process of user alice; "
        "another user's job: ask them before stopping it with --force"
    )
    assert mine.endswith("not an inference server; --force stops it")


def test_a_pid_given_to_another_process_since_is_not_the_deployments_server() -> None:
    """The record names its server's pid and start time; `fleet status` took any engine-shaped process
    with that pid for it, also another user's started since fleet's died."""
    from factsdata import RTX_A6000, facts
    from fleet.control.status_rows import status_row
    from test_plan import host

    record = {"status": "ready", "pid": 4242, "pgid": 4242, "start_ticks": 500, "port": 30000}
    ours = {"pid": 4242, "ppid": 1, "pgid": 4242, "uid": 1000, "user": "ops", "comm": "python3"}
    cmd = {"cmdline": "python3 -m sglang.launch_server --port 30000"}
    for proc, status in (
        ({**ours, **cmd, "start_ticks": 500}, "ready"),
        ({**ours, **cmd, "start_ticks": 900}, "dead"),  # the pid was given to a later process
        ({**ours, **cmd, "start_ticks": 500, "uid": 4343, "user": "mallory"}, "dead"),  # another user's
    ):
        f = facts("ct129", RTX_A6000, 2, servers=[proc], deployments={"small": {"state": record}})
        assert status_row(host("ct129"), f, "small")["status"] == status, proc
    older = {k: v for k, v in record.items() if k != "start_ticks"}  # an older fleet's record: the pid, this user's
    f = facts(
        "ct129", RTX_A6000, 2, servers=[{**ours, **cmd, "start_ticks": 900}], deployments={"small": {"state": older}}
    )
    assert status_row(host("ct129"), f, "small")["status"] == "ready"
