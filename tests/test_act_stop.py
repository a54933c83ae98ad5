"""What the act step waits for once it stopped what was in the way (fleet.host.act.stop_in_the_way).

The stops and the GPU readings are replaced by recorders; the real stops are proven over sshd
(tests/test_deploy.py, tests/test_containers_ssh.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import fleet.host.act as act

FOREIGN = {"pid": 7, "user": "bob", "cmdline": "python train.py", "why": "another user's"}
OURS = {9: {"pid": 9, "pgid": 9}}


class Gpus:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waits: list[dict[str, Any]] = []
        self.reads: list[set[int]] = []
        monkeypatch.setattr(act, "stop_containers", lambda ours, drain: [])
        monkeypatch.setattr(act, "stop_foreign_containers", lambda targets, drain: [])
        stopped = [{"pid": 9}]
        monkeypatch.setattr(act, "stop_targets", lambda t, procs, drain, read: (stopped if t else [], [], []))
        monkeypatch.setattr(act, "record_replaced", lambda *a: None)
        monkeypatch.setattr(act, "sweep_stopped_groups", lambda *a: None)
        monkeypatch.setattr(act, "nvml_pids_and_memory", self.read)
        monkeypatch.setattr(act, "wait_memory_released", self.wait)

    def read(self, gpus: Any, held: set[int]) -> tuple[set[int], list[int]]:
        self.reads.append(set(held))
        return set(), [30000]

    def wait(self, before: Any, timeout_s: float, idle: int, gpus: Any, held: set[int], still: bool, aside: Any) -> Any:
        self.waits.append({"held": set(held), "still": still, "aside": aside is not None})
        return before, [0], 0.2


def stop(tmp: Path, op: str, targets: dict[int, Any], refused: list[dict[str, Any]]) -> dict[str, Any]:
    a = {"op": op, "lock": {"state_dir": str(tmp), "deployment": "d"}, "free": {"drain_s": 1, "memory_wait_s": 30,
         "idle_mib": 0}}  # fmt: skip
    free = {"gpus": [7], "replaced_names": [], "siblings": {}}
    way = act.Way(free, [], set(), {4242}, {7}, [30000])
    out: dict[str, Any] = {"left": [], "refused": refused}
    act.stop_in_the_way(a, out, way, targets, {})
    return out


def test_a_stop_that_stops_nothing_waits_for_no_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's job holds the GPU: `fleet stop` said so and waited 30 s for memory nothing freed."""
    gpus = Gpus(monkeypatch)
    out = stop(tmp_path, "stop", {}, [FOREIGN])
    assert gpus.waits == [] and out["memory"]["waited_s"] == 0.0 and out["ended"] == []


def test_a_stop_waits_for_what_it_stopped_not_for_what_it_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = Gpus(monkeypatch)
    out = stop(tmp_path, "stop", OURS, [FOREIGN])
    assert gpus.reads == [{4242, 7}]  # the memory before, less the kept daemon's and the foreign job's
    assert gpus.waits == [{"held": {4242, 7}, "still": False, "aside": True}] and out["ended"] == [{"pid": 9}]


def test_a_stop_of_a_server_in_a_renamed_container_waits_for_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet's server in a container that is no longer fleet's by name (renamed): stopped through its
    runtime, which takes it out of the targets. The stop said "still in use after 0s" without waiting."""
    gpus = Gpus(monkeypatch)

    def through_runtime(targets: dict[int, Any], drain: float) -> list[dict[str, Any]]:
        return [dict(targets.pop(9), stop="podman stop -t 1 (not removed: not fleet's)")]

    monkeypatch.setattr(act, "stop_foreign_containers", through_runtime)
    out = stop(tmp_path, "stop", dict(OURS), [])
    assert gpus.waits == [{"held": {4242}, "still": False, "aside": True}] and len(out["ended"]) == 1


def test_a_launch_waits_for_its_gpus_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch runs only on GPUs with no holder left: the reading it already has stands for the first."""
    gpus = Gpus(monkeypatch)
    stop(tmp_path, "launch", OURS, [])
    assert gpus.reads == [] and gpus.waits == [{"held": {4242}, "still": False, "aside": False}]
    stop(tmp_path, "launch", {}, [])
    assert gpus.waits[-1] == {"held": {4242}, "still": True, "aside": False}


def test_what_a_stop_cannot_have_stopped_is_set_aside_at_each_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on the GPUs while the stop waits: another user's job (fleet signals its own user's only), a
    process started since the stop began outside the groups it stopped (a job taking the freed GPUs) --
    set aside. What the stop signalled, a child its groups forked since, and any other process of a user
    it stopped processes of that was there before -- waited for."""
    import fleet.host.free as free

    me = os.getuid()
    now = {
        10: {"uid": me, "pgid": 10},  # stopped
        11: {"uid": me, "pgid": 10},  # forked by the stopped group since
        12: {"uid": me, "pgid": 12},  # started since, a group of its own
        13: {"uid": 4321, "pgid": 13},  # another user's, there before
        14: {"uid": me, "pgid": 14},  # fleet's user's, there before, not in the way then
        15: {"uid": 1000, "pgid": 15},  # a container's (rootless: a mapped uid), stopped with it
        16: {"uid": 1000, "pgid": 16},  # the same uid, there before
        17: {"uid": None, "pgid": 17},  # its owner unreadable: gone as it was read
    }
    monkeypatch.setattr(free, "process", lambda pid: now.get(pid))
    before: Any = {pid: now[pid] for pid in (10, 13, 14, 15, 16, 17)}
    pick = free.not_the_stops(before, {10: {"pgid": 10}, 15: {"pgid": 15}}, by_user=True)
    assert pick({10, 11, 12, 13, 14, 15, 16, 17, 99}) == {12, 13}  # 99: gone
    # a stop that stopped a container (docker's lists no pid): any user's process there before is waited for
    boxed = free.not_the_stops(before, {10: {"pgid": 10}}, by_user=False)
    assert boxed({10, 11, 12, 13, 14, 15, 16, 17}) == {12}


def test_a_stop_of_fleets_docker_container_waits_for_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker ps` lists no pid: fleet's own container stopped (ours) has none among the targets, and the
    stop still waits for the memory it frees."""
    gpus = Gpus(monkeypatch)
    a = {"op": "stop", "lock": {"state_dir": str(tmp_path), "deployment": "d"},
         "free": {"drain_s": 1, "memory_wait_s": 30, "idle_mib": 0}}  # fmt: skip
    free = {"gpus": [7], "replaced_names": [], "siblings": {}}
    boxed = [{"id": "a" * 64, "cli": "docker", "pid": None, "name": "fleet-d", "image": "i", "state": "running"}]
    way = act.Way(free, boxed, set(), set(), {7}, [30000])  # type: ignore[arg-type]
    out: dict[str, Any] = {"left": [], "refused": []}
    act.stop_in_the_way(a, out, way, {}, {})  # type: ignore[arg-type]
    assert gpus.waits and gpus.waits[0]["still"] is False
