"""The branches of a group's deploy (fleet.control.group.GroupRun) against scripted hosts
(fleet_testbed.fakehost), in milliseconds: every rank prepared before any is stopped, launched together,
proven together, relaunched together with a fix, and stopped together when the group gives up. The same
group over simulated hosts, a real rendezvous and real processes is in test_groups.py."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conftest import ROOT
from factsdata import RTX_A6000, facts
from fleet import events
from fleet.cli.report import describe_host_stop
from fleet.control.group import GroupResult, GroupRun
from fleet.control.group_health import group_health, stop_group
from fleet.errors import DeployFailed, HostUnreachable, LockedError
from fleet.health import CRITICAL, OK, UNKNOWN
from fleet.inventory import Host, load_inventory, load_playbook
from fleet.plan.group import GROUP_RELAUNCH
from fleet.protocol import FAILED, STOPPED
from fleet_testbed.fakehost import ScriptedHost, Watch, crashes, ready

INVENTORY = """\
hosts:
  node-a: {address: 10.0.0.1, engines: {sglang: /opt/sglang/.venv/bin/python}, models_dir: /models}
  node-b: {address: 10.0.0.2, engines: {sglang: /opt/sglang/.venv/bin/python}, models_dir: /models}
"""
GRAPH_OOM = "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB"
RANK_LOST = "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE)"


def rank_ready(i: int) -> Watch:
    # rank 0 answers the smoke prompt; another rank is proven by its /health alone
    return ready() if i == 0 else Watch([], [{"e": "ready_http"}, {"e": "done"}])


class Group:
    """Two scripted hosts and the group playbook over them (qwen36-27b, TP 4 over 2 x 2 RTX A6000)."""

    def __init__(self, tmp_path: Path, **spec: Any) -> None:
        path = tmp_path / "hosts.yaml"
        path.write_text(INVENTORY)
        self.inventory = load_inventory(path)
        pb = load_playbook("qwen36-27b", ROOT / "playbooks")
        fields = {"hosts": ["node-a", "node-b"], "tp": 4, **spec}
        self.playbook = dataclasses.replace(pb, spec=msgspec.structs.replace(pb.spec, **fields))
        self.hosts = {
            name: ScriptedHost(
                facts_found=dataclasses.replace(
                    facts(name, RTX_A6000, 2, model=pb.spec.model), reach="open", reach_interface="ens1f0"
                ),
                host_name=name,
            )
            for name in ("node-a", "node-b")
        }
        self.seen: list[events.Event] = []
        self.unreachable: set[str] = set()

    def script(self, name: str, *watches: Watch) -> None:
        self.hosts[name].watches.extend(watches)

    def run(self) -> GroupRun:
        @contextlib.contextmanager
        def connect(host: Host) -> Iterator[Any]:
            if host.name in self.unreachable:
                raise HostUnreachable(
                    f"{host.name}: ssh: connect to host {host.settings.address} port 22: No route to host"
                )
            yield self.hosts[host.name]

        return GroupRun(self.playbook, self.inventory, connect, lambda name: self.seen.append, engine_check=True)

    def deploy(self) -> GroupResult:
        return self.run().deploy()

    def kill_rank(self, name: str) -> None:
        """The rank's engine dies behind fleet's back (its record still says ready)."""
        self.hosts[name].servers.clear()

    def acts(self, name: str) -> list[dict[str, Any]]:
        return [dict(a) for a in self.hosts[name].acts]


def test_every_rank_is_prepared_then_launched_then_proven_together(tmp_path: Path) -> None:
    g = Group(tmp_path)
    for i, name in enumerate(g.hosts):
        g.script(name, rank_ready(i))
    result = g.deploy()
    assert result.ok, result.reason
    for name in g.hosts:
        prepare, launch, release = g.acts(name)
        assert prepare["op"] == "prepare" and "check" in prepare  # locked and checked before anything stops
        assert launch["op"] == "launch" and launch.get("launch")
        assert release["op"] == "release"  # the ranks' locks, held until all were proven, go together
    watched = [g.hosts[n].watched[0] for n in g.hosts]
    assert all(w["hold"] for w in watched)
    assert [w["smoke"] != {} for w in watched] == [True, False]  # only rank 0 answers a prompt


def test_a_known_crash_on_one_rank_relaunches_the_whole_group_with_the_fix(tmp_path: Path) -> None:
    g = Group(tmp_path)
    g.script("node-a", crashes(GRAPH_OOM), rank_ready(0))
    g.script("node-b", rank_ready(1), rank_ready(1))
    result = g.deploy()
    assert result.ok and [a.outcome for a in result.attempts] == ["crashed", "ready"], result.reason
    for name in g.hosts:
        first, second = g.hosts[name].launches
        fixed = second[second.index("--cuda-graph-max-bs") + 1]
        assert "--cuda-graph-max-bs" not in first and fixed == "16"  # the same fix on every rank
    assert any(isinstance(e, events.Relaunching) and "whole group" in e.explanation for e in g.seen)


def test_a_lost_rank_relaunches_the_group_as_it_was_once_then_gives_up(tmp_path: Path) -> None:
    g = Group(tmp_path)
    g.script("node-a", rank_ready(0), rank_ready(0))
    g.script("node-b", crashes(RANK_LOST), crashes(RANK_LOST))
    result = g.deploy()
    assert not result.ok and len(result.attempts) == 2
    assert result.failed_rank is not None and result.failed_rank.host == "node-b"
    first, second = g.hosts["node-a"].launches
    assert first == second  # relaunched as it was: a loss has no fix
    relaunch = next(e for e in g.seen if isinstance(e, events.Relaunching))
    assert relaunch.signature == GROUP_RELAUNCH
    for name in g.hosts:  # given up: every rank stopped and recorded failed, its lock released
        last = g.acts(name)[-1]
        assert last["state_update"]["status"] == FAILED and last["release_lock"] and not last.get("launch")


def test_a_rank_whose_host_stops_answering_is_given_up_as_lost_not_as_an_engine_that_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen host ends its rank's watch with fleet's own error, not a log: the group is given up (its
    host cannot be relaunched on), and the headline says the host was lost, not that the engine stopped."""
    from fleet.control import attempt_watch

    monkeypatch.setattr(attempt_watch, "RESUME_WAITS_S", (0.0,) * 5)  # each try to reach it again, at once
    g = Group(tmp_path)
    g.script("node-a", rank_ready(0))

    def frozen(*args: Any, **kwargs: Any) -> int:
        raise HostUnreachable("node-b: no answer for 30 s (the test froze it).", "")

    g.hosts["node-b"].watch = frozen  # type: ignore[method-assign]
    result = g.deploy()
    assert not result.ok and [a.outcome for a in result.attempts] == ["crashed"]
    assert result.reason == (
        "rank 1 (node-b): fleet lost its host while watching it (node-b: no answer for 30 s (the test froze it).); "
        "its engine's fate is unknown"
    )
    assert g.acts("node-a")[-1]["state_update"]["status"] == FAILED  # the rank that answers is stopped


def test_a_rank_the_engine_refuses_stops_nothing_on_any_host(tmp_path: Path) -> None:
    g = Group(tmp_path)
    refused = {"verdict": "rejected", "output": "launch_server.py: error: unrecognized arguments: --made-up-flag"}
    g.hosts["node-b"].checks = [refused]
    result = g.deploy()
    assert not result.ok and [a.outcome for a in result.attempts] == ["rejected"]
    for name in g.hosts:
        assert g.hosts[name].launches == [] and g.hosts[name].watched == []
        assert g.acts(name)[-1]["op"] == "release"  # prepared, then let go: nothing was stopped


def test_a_rank_whose_host_is_locked_by_another_run_refuses_the_group_before_anything_stops(tmp_path: Path) -> None:
    g = Group(tmp_path)
    g.hosts["node-b"].lock = "held"
    with pytest.raises(LockedError):
        g.deploy()
    assert [a["op"] for a in g.acts("node-a")] == ["prepare", "release"]  # prepared, then released
    assert all(not h.watched for h in g.hosts.values())


def ready_group(tmp_path: Path) -> Group:
    g = Group(tmp_path)
    for i, name in enumerate(g.hosts):
        g.script(name, rank_ready(i))
    assert g.deploy().ok
    return g


def test_a_group_never_deployed_has_no_health_to_report(tmp_path: Path) -> None:
    assert group_health(Group(tmp_path).run(), heal=True) is None


def test_a_served_group_is_healthy_rank_by_rank(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    health = group_health(g.run(), heal=True)
    assert health is not None and health.status == OK and health.heal is None
    assert [(c.name, c.status) for c in health.checks] == [("rank0", OK), ("rank1", OK)]
    assert len(g.hosts["node-a"].launches) == 1  # nothing relaunched


def test_one_rank_gone_is_the_group_down_and_a_heal_relaunches_it_whole(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    g.kill_rank("node-b")
    seen = group_health(g.run(), heal=False)
    assert seen is not None and seen.status == CRITICAL and seen.heal is None
    assert "rank 1 gone" in next(c.detail for c in seen.checks if c.name == "rank1")
    assert len(g.hosts["node-a"].launches) == 1  # only looked: rank 0, alive, is left running
    for i, name in enumerate(g.hosts):
        g.script(name, rank_ready(i))
    healed = group_health(g.run(), heal=True)
    assert healed is not None and healed.status == OK and healed.heal is not None
    assert healed.heal.startswith("relaunched the group whole")
    assert [len(h.launches) for h in g.hosts.values()] == [2, 2]


def test_a_heal_that_fails_again_says_so_and_the_group_stays_critical(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    g.kill_rank("node-b")
    g.script("node-a", rank_ready(0), rank_ready(0))
    g.script("node-b", crashes(RANK_LOST), crashes(RANK_LOST))
    healed = group_health(g.run(), heal=True)
    assert healed is not None and healed.status == CRITICAL
    assert healed.heal is not None and healed.heal.startswith("relaunching the group failed")


def test_a_group_its_last_deploy_gave_up_is_not_healed_an_operator_decides(tmp_path: Path) -> None:
    g = Group(tmp_path)
    g.script("node-a", rank_ready(0), rank_ready(0))
    g.script("node-b", crashes(RANK_LOST), crashes(RANK_LOST))
    assert not g.deploy().ok
    launched = [len(h.launches) for h in g.hosts.values()]
    health = group_health(g.run(), heal=True)
    assert health is not None and health.status == CRITICAL
    assert health.heal is not None and health.heal.startswith("not healed: the last deploy gave it up")
    assert [len(h.launches) for h in g.hosts.values()] == launched


def test_what_the_host_check_found_wrong_with_rank_0_makes_the_group_critical(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    health = group_health(g.run(), heal=False, rank0_problems=["/health answered 503"])
    assert health is not None and health.status == CRITICAL
    assert ("rank0", CRITICAL, "node-a: /health answered 503") in [(c.name, c.status, c.detail) for c in health.checks]


def test_a_rank_whose_host_cannot_be_reached_is_unknown_and_the_group_not_called_healthy(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    g.unreachable.add("node-b")
    health = group_health(g.run(), heal=False)
    assert health is not None and health.status == CRITICAL
    rank1 = next(c for c in health.checks if c.name == "rank1")
    assert rank1.status == UNKNOWN and "No route to host" in rank1.detail


def test_a_rank_without_this_groups_record_is_critical(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    record = g.hosts["node-b"].records[g.playbook.name]
    g.hosts["node-b"].records[g.playbook.name] = {**record, "group": {**record["group"], "hosts": ["node-b"]}}
    health = group_health(g.run(), heal=False)
    assert health is not None and health.status == CRITICAL
    assert "no record of rank 1 of this group" in next(c.detail for c in health.checks if c.name == "rank1")


def test_stopping_a_group_stops_every_rank_and_leaves_nothing_to_check(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    lines = [describe_host_stop(host, out).splitlines()[0] for host, out in stop_group(g.run())]
    assert lines == ["node-a: stopped 1 process(es)", "node-b: stopped 1 process(es)"]
    assert all(not h.servers and h.records[g.playbook.name]["status"] == STOPPED for h in g.hosts.values())
    assert group_health(g.run(), heal=True) is None


def test_a_groups_stop_says_what_each_rank_left_and_the_memory_that_did_not_come_back(tmp_path: Path) -> None:
    """`fleet stop PLAYBOOK` said only how many processes each rank stopped; what a host stop says (a job
    it left, GPU memory still in use) was dropped for a group's ranks."""
    g = ready_group(tmp_path)
    alice = {"pid": 7, "user": "alice", "cmdline": "python train.py", "why": "process of user alice"}
    alice["other_user"] = True
    memory = {"before_mib": [40_000], "after_mib": [30_000], "waited_s": 30.0, "gpus": [0]}
    g.hosts["node-b"].stop_finds = {"refused": [alice], "memory": memory}
    said = dict(stop_group(g.run()))
    node_a = describe_host_stop("node-a", said["node-a"]).splitlines()
    assert node_a[0] == "node-a: stopped 1 process(es)" and node_a[1].startswith("  fleet's server pid ")
    assert len(node_a) == 2  # nothing left, nothing held there
    node_b = describe_host_stop("node-b", said["node-b"]).splitlines()
    assert node_b[0] == "node-b: stopped 1 process(es)"
    assert "pid 7 (user alice: python train.py)" in node_b[2] and "another user's job" in node_b[2]
    assert node_b[3].startswith(
        f"  GPU memory still in use on GPU 0 after 30s (29.3 GiB; deployment {g.playbook.name})"
    )


def test_a_rank_that_cannot_be_reached_fails_the_stop_after_the_others_are_stopped(tmp_path: Path) -> None:
    g = ready_group(tmp_path)
    g.unreachable.add("node-a")
    with pytest.raises(DeployFailed) as failed:
        stop_group(g.run())
    assert "node-a" in failed.value.message and "No route to host" in failed.value.message
    assert not g.hosts["node-b"].servers and g.hosts["node-a"].servers  # node-b stopped all the same


def test_ctrl_c_while_a_host_prepares_waits_for_its_answer_before_letting_its_lock_go(tmp_path: Path) -> None:
    """The prepare step takes the host's lock. Ctrl-C while it is in flight used to send the release at
    once, which could reach the host before the prepare took the lock: the lock was then left held. The
    release now comes after the prepare answered. (node-b's prepare answers when a release reaches it, or
    after a second: whichever comes first shows the order.)"""
    import os
    import signal
    import threading

    g = Group(tmp_path)
    b = g.hosts["node-b"]
    said: list[str] = []
    released, entered = threading.Event(), threading.Event()
    real_act = b.act

    def act(python: str, request: Any, **kw: Any) -> Any:
        op = request.get("op")
        said.append(f"{op}: asked")
        if op == "release":
            released.set()
        if op == "prepare":
            entered.set()
            released.wait(timeout=1.0)
        out = real_act(python, request, **kw)
        said.append(f"{op}: answered")
        return out

    b.act = act  # type: ignore[method-assign]

    def interrupt() -> None:
        if entered.wait(timeout=30):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        g.deploy()
    assert said[:2] == ["prepare: asked", "prepare: answered"] and said[2:] == ["release: asked", "release: answered"]
