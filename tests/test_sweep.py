"""A cold `fleet health` sweep deals its hosts out to forked copies of itself: every host comes back, in
order, under the one deadline, also when a copy hangs or its host fails."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fleet.control import sweep as control
from fleet.errors import HostUnreachable
from fleet.health import OK, Check, HostHealth
from fleet.host.procs import alive  # a zombie (an orphan not yet collected) counts as gone
from fleet.inventory import Host, HostSettings

HOSTS = [Host(f"h{i:02d}", HostSettings(address=f"10.0.0.{i}"), (), "hosts.yaml:1") for i in range(20)]


def answered_by_this_process(host: Host) -> HostHealth:
    return HostHealth(host.name, OK, (Check("pid", OK, str(os.getpid())),))


def pids(results: list[HostHealth]) -> set[str]:
    return {c.detail for r in results for c in r.checks if c.name == "pid"}


@pytest.mark.parametrize(
    ("hosts", "cpus", "processes"), [(1, 16, 1), (8, 16, 1), (9, 16, 2), (50, 16, 7), (50, 2, 2), (50, None, 1)]
)
def test_processes_grow_with_the_hosts_up_to_the_cpus(hosts: int, cpus: int | None, processes: int) -> None:
    assert control.sweep_processes(hosts, cpus, other_threads=0) == processes


def test_a_process_running_other_threads_sweeps_alone() -> None:
    assert control.sweep_processes(50, 16, other_threads=1) == 1


def test_the_cpus_counted_are_those_this_process_may_run_on(monkeypatch: pytest.MonkeyPatch) -> None:
    assert control.usable_cpus() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(sys, "platform", "darwin")  # fork is not safe there: one process
    assert control.usable_cpus() == 1


def every_host_answers() -> list[HostHealth]:
    return control.sweep_in_processes(HOSTS, answered_by_this_process, 10.0, "unknown", 3)


def every_host_refuses() -> list[HostHealth]:
    def refuse(host: Host) -> HostHealth:
        raise HostUnreachable(f"{host.name}: connection refused", "")

    return control.sweep_in_processes(HOSTS, refuse, 10.0, "critical", 3)


def a_child_freezes() -> list[HostHealth]:
    control.RESULT_GRACE_S = 0.5
    parent = os.getpid()

    def freeze_in_a_child(host: Host) -> HostHealth:
        if os.getpid() != parent and host.name == "h01":
            os.kill(os.getpid(), signal.SIGSTOP)  # the whole child stops: it never hands its results over
        return answered_by_this_process(host)

    return control.sweep_in_processes(HOSTS, freeze_in_a_child, 1.0, "unknown", 2)


def a_check_has_a_bug() -> list[HostHealth]:
    def buggy_for_two_hosts(host: Host) -> HostHealth:
        if host.name in ("h03", "h04"):  # h03 is this process's share, h04 a child's
            raise ValueError(f"unexpected reply from {host.name}")
        return answered_by_this_process(host)

    return control.sweep_in_processes(HOSTS, buggy_for_two_hosts, 10.0, "unknown", 3)


def a_child_dies() -> list[HostHealth]:
    parent = os.getpid()

    def die_in_a_child(host: Host) -> HostHealth:
        if os.getpid() != parent and host.name == "h01":
            os.kill(os.getpid(), signal.SIGKILL)
        return answered_by_this_process(host)

    return control.sweep_in_processes(HOSTS, die_in_a_child, 30.0, "unknown", 2)


def hosts_that_never_answer() -> list[HostHealth]:
    def record_and_hang(host: Host) -> HostHealth:
        (Path(os.environ["PIDS_DIR"]) / str(os.getpid())).touch()
        time.sleep(60)
        return answered_by_this_process(host)

    return control.sweep_in_processes(HOSTS, record_and_hang, 60.0, "unknown", 3)


def in_a_fresh_process(scenario: Callable[[], list[HostHealth]]) -> tuple[list[HostHealth], int, float]:
    """Run as `fleet health` runs: in a process of its own with no other thread (pytest's may have some,
    left by earlier tests, and then the sweep rightly refuses to fork). Returns results, pid, seconds."""
    started = time.monotonic()
    r = subprocess.run([sys.executable, __file__, scenario.__name__], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    results, pid = pickle.loads(r.stdout)
    return results, pid, time.monotonic() - started


def test_every_host_comes_back_in_order_from_several_processes() -> None:
    results, pid, _ = in_a_fresh_process(every_host_answers)
    assert [r.host for r in results] == [h.name for h in HOSTS]
    assert len(pids(results)) == 3 and str(pid) in pids(results)


def test_a_host_error_in_a_child_is_reported_like_in_this_process() -> None:
    results, _, _ = in_a_fresh_process(every_host_refuses)
    assert [(r.status, r.checks[0].detail) for r in results] == [
        ("critical", f"{h.name}: connection refused") for h in HOSTS
    ]


def test_a_child_that_stops_answering_is_killed_and_its_hosts_reported() -> None:
    results, _, seconds = in_a_fresh_process(a_child_freezes)
    assert seconds < 30  # not the frozen child's 60 s (a bound loose enough for a loaded 2-CPU machine)
    late = {r.host for r in results if r.checks[0].detail == "no answer within the 1 s deadline"}
    assert late == {h.name for h in HOSTS[1::2]}  # the frozen child had every other host
    assert {r.host for r in results if r.status == OK} == {h.name for h in HOSTS[0::2]}


def test_a_bug_checking_one_host_is_reported_for_that_host_with_its_traceback() -> None:
    r = subprocess.run([sys.executable, __file__, a_check_has_a_bug.__name__], capture_output=True, timeout=60)
    results, _ = pickle.loads(r.stdout)
    failed = {x.host: (x.status, x.checks[0].name, x.checks[0].detail) for x in results if x.status != OK}
    assert failed == {
        name: ("unknown", "fleet", f"fleet failed checking this host: ValueError: unexpected reply from {name}")
        for name in ("h03", "h04")
    }
    assert r.stderr.decode().count("ValueError: unexpected reply from") == 2  # one traceback each, for the log


def test_a_child_that_dies_has_its_hosts_reported_at_once() -> None:
    results, _, seconds = in_a_fresh_process(a_child_dies)
    assert seconds < 10  # not the 30 s deadline
    ended = {r.host: r.checks[0].detail for r in results if r.status != OK}
    reason = "the fleet process checking this host ended without an answer (exit code -9)"
    assert ended == {h.name: reason for h in HOSTS[1::2]}


def test_the_forked_copies_end_with_the_fleet_that_forked_them(tmp_path: Path) -> None:
    """Killed by cron's timeout, say: its copies must not go on holding the overlap lock's descriptor."""
    env = {**os.environ, "PIDS_DIR": str(tmp_path)}
    fleet = subprocess.Popen([sys.executable, __file__, hosts_that_never_answer.__name__], env=env)
    try:
        until = time.monotonic() + 30
        while len({p.name for p in tmp_path.iterdir()} - {str(fleet.pid)}) < 2 and time.monotonic() < until:
            time.sleep(0.05)
        children = {int(p.name) for p in tmp_path.iterdir()} - {fleet.pid}
        assert len(children) == 2
    finally:
        fleet.kill()
        fleet.wait()
    until = time.monotonic() + 5
    while any(alive(pid) for pid in children) and time.monotonic() < until:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in children)


if __name__ == "__main__":  # in_a_fresh_process
    sys.stdout.buffer.write(pickle.dumps((globals()[sys.argv[1]](), os.getpid())))
