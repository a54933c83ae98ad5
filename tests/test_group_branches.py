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
from fleet.control.group import GroupResult, GroupRun
from fleet.errors import LockedError
from fleet.inventory import Host, load_inventory, load_playbook
from fleet.plan.group import GROUP_RELAUNCH
from fleet.protocol import FAILED
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

    def script(self, name: str, *watches: Watch) -> None:
        self.hosts[name].watches.extend(watches)

    def deploy(self) -> GroupResult:
        @contextlib.contextmanager
        def connect(host: Host) -> Iterator[Any]:
            yield self.hosts[host.name]

        run = GroupRun(self.playbook, self.inventory, connect, lambda name: self.seen.append, engine_check=True)
        return run.deploy()

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
