"""Where a deployment runs on its host (fleet.plan.placement): pure, from facts."""

from __future__ import annotations

from typing import Any

import pytest

from factsdata import RTX_PRO_6000, facts
from fleet.errors import PreflightError
from fleet.plan.placement import place, port_for


def server(pid: int, pgid: int | None = None, uid: int = 1000) -> dict[str, Any]:
    return {
        "pid": pid,
        "ppid": 1,
        "pgid": pgid or pid,
        "uid": uid,
        "user": "ops",
        "comm": "python",
        "cmdline": "python -m sglang.launch_server",
    }


def deployed(pid: int, gpus: list[int] | None, port: int = 30000, status: str = "ready") -> dict[str, Any]:
    state: dict[str, Any] = {"pid": pid, "pgid": pid, "status": status, "port": port}
    if gpus is not None:
        state["gpus"] = gpus
    return {"state": state}


def box(**kw: Any) -> Any:
    return facts("blackwell", RTX_PRO_6000, 8, **kw)


def test_indices_as_asked_all_by_default_and_a_count_picks_adjacent_free_gpus() -> None:
    f = box(servers=[server(500)], deployments={"big": deployed(500, [0, 1, 2, 3, 4])})
    assert place("small", (6, 7), f, replace=False, where="x").gpus == (6, 7)
    assert place("big", None, box(), replace=False, where="x").gpus == tuple(range(8))
    picked = place("small", 2, f, replace=False, where="x")
    assert picked.gpus == (5, 6) and picked.how == "2 free GPUs picked: 5,6"


def workstation(count: int = 8) -> list[list[int]]:
    """Two GPUs per PCIe switch, half of them per CPU socket (NVML levels: 10 switch, 40 node, 50 system)."""
    half = count // 2
    return [
        [i, j, 10 if i // 2 == j // 2 else 40 if i // half == j // half else 50]
        for i in range(count)
        for j in range(i + 1, count)
    ]


def test_with_nvmls_topology_a_count_takes_gpus_behind_one_switch_not_adjacent_indices_across_sockets() -> None:
    f = box(servers=[server(500)], deployments={"a": deployed(500, [1, 2])}, topology=workstation())
    picked = place("pair", 2, f, replace=False, where="x")  # adjacency alone would take 3,4: two sockets
    assert picked.gpus == (4, 5) and picked.how == "2 free GPUs picked: 4,5 (one PCIe switch)"
    four = place("four", 4, f, replace=False, where="x")
    assert four.gpus == (4, 5, 6, 7) and four.how.endswith("(one NUMA node)")
    spread = place("five", 5, f, replace=False, where="x")
    assert spread.how.endswith("(across NUMA nodes)")


def test_a_count_skips_gpus_another_users_process_uses() -> None:
    f = box(
        servers=[server(500)],
        deployments={"big": deployed(500, [0, 1])},
        gpu_processes={2: [{"pid": 900, "used_mib": 4000}]},
    )
    assert place("small", 2, f, replace=False, where="x").gpus == (3, 4)


def test_overlap_with_a_running_deployment_is_refused_naming_it_unless_replaced() -> None:
    f = box(servers=[server(500)], deployments={"big": deployed(500, [0, 1, 2, 3])})
    with pytest.raises(PreflightError) as caught:
        place("small", (3, 4), f, replace=False, where="playbooks/small.yaml:7 (blackwell)")
    said = caught.value.message
    assert (
        said.startswith("playbooks/small.yaml:7 (blackwell): GPUs 3,4")
        and "deployment big on GPUs 0,1,2,3 (pid 500)" in said
    )
    assert "--replace" in caught.value.hint
    replaced = place("small", (3, 4), f, replace=True, where="x")
    assert [o.name for o in replaced.replaces] == ["big"]


def test_a_dead_or_stopped_deployment_holds_no_gpus_and_an_older_fleets_record_holds_all() -> None:
    dead = box(deployments={"big": deployed(500, [0, 1])})  # pid 500 is not among the running servers
    assert place("small", (0, 1), dead, replace=False, where="x").gpus == (0, 1)
    legacy = box(servers=[server(500)], deployments={"old": {**deployed(500, None), "legacy": True}})
    with pytest.raises(PreflightError, match="deployment old on GPUs 0,1,2,3,4,5,6,7"):
        place("small", (7,), legacy, replace=False, where="x")


@pytest.mark.parametrize(
    ("asked", "said"),
    [
        ((8,), "GPU 8 does not exist on blackwell (it has GPUs 0,1,2,3,4,5,6,7)"),
        (9, "9 GPUs asked for; blackwell has 8"),
    ],
)
def test_gpus_the_host_does_not_have_are_refused_with_where_they_were_asked(asked: Any, said: str) -> None:
    with pytest.raises(PreflightError) as caught:
        place("small", asked, box(), replace=False, where="playbooks/small.yaml:4 (blackwell)")
    assert caught.value.message.startswith("playbooks/small.yaml:4 (blackwell): " + said)


def test_a_count_that_does_not_fit_beside_the_others_names_them() -> None:
    f = box(servers=[server(500)], deployments={"big": deployed(500, [0, 1, 2, 3, 4, 5, 6])})
    with pytest.raises(PreflightError, match="2 free GPUs asked for; blackwell has 1 free .*deployment big"):
        place("small", 2, f, replace=False, where="x")


def test_a_port_another_deployment_records_moves_this_one_by_a_step() -> None:
    f = box(servers=[server(500)], deployments={"a": deployed(500, [0, 1], port=30000)})
    assert port_for("a", 30000, f) == (30000, "")
    assert port_for("b", 30000, f) == (30010, "port 30000 is deployment a's: b uses 30010")
    stopped = box(deployments={"a": deployed(500, [0, 1], port=30000, status="stopped")})
    assert port_for("b", 30000, stopped) == (30000, "")


def test_the_port_of_a_deployment_replace_stops_first_is_this_ones_to_take() -> None:
    """--replace stops the deployment on the GPUs taken before the launch: its port (and internal base)
    is about to be free, so the new one keeps the playbook's port; deployments left running still count."""
    listening = [{"address": "0.0.0.0", "port": 30000, "pid": 500}, {"address": "0.0.0.0", "port": 30010, "pid": 600}]
    f = box(
        servers=[server(500), server(600)],
        deployments={"old": deployed(500, [0, 1], port=30000), "kept": deployed(600, [2, 3], port=30010)},
        listeners=listening,
    )
    assert port_for("new", 30000, f, replacing=["old"]) == (
        30000,
        "port 30000 is a replaced deployment's, stopped first",
    )
    assert port_for("new", 30000, f) == (30020, "port 30000 is deployment old's: new uses 30020")
    assert port_for("new", 30010, f, replacing=["old"]) == (30020, "port 30010 is deployment kept's: new uses 30020")


def test_fleet_facts_says_which_deployment_or_foreign_process_holds_each_gpu() -> None:
    from fleet.plan.placement import gpu_owners

    f = box(
        servers=[server(500)],
        deployments={"big": deployed(500, [0, 1]), "gone": deployed(600, [2, 3])},
        gpu_processes={5: [{"pid": 900, "used_mib": 4000}]},
    )
    assert gpu_owners(f) == {0: "deployment big", 1: "deployment big", 5: "pids 900"}


def test_a_deployment_keeps_its_own_port_and_a_port_meeting_anothers_internal_port_is_moved() -> None:
    placed = {**deployed(500, [0, 1], port=30000), "state": {**deployed(500, [0, 1])["state"], "ports": [30000, 40000]}}
    moved = deployed(600, [2, 3], port=30010)
    f = box(servers=[server(500), server(600)], deployments={"x": placed, "a": moved})
    assert port_for("a", 30000, f) == (30010, "port 30000 is deployment x's: a keeps 30010")  # a redeploy
    assert port_for("b", 40000, f) == (40010, "port 40000 is deployment x's: b uses 40010")  # x's NCCL port
    assert port_for("c", 30000, f)[0] == 30020


def test_a_count_never_lands_on_gpus_in_use_and_replace_takes_others_only_when_none_are_free() -> None:
    hand = {6: [{"pid": 700, "used_mib": 70000}], 7: [{"pid": 701, "used_mib": 70000}]}  # an engine by hand
    f = box(
        servers=[server(500), server(700), server(701)], deployments={"a": deployed(500, [0, 1])}, gpu_processes=hand
    )
    assert place("pair", 2, f, replace=True, where="x").gpus == (2, 3)  # free GPUs first, even with --replace
    crowded = box(servers=[server(500)], deployments={"a": deployed(500, [0, 1, 2, 3, 4, 5, 6])})
    taken = place("pair", 2, crowded, replace=True, where="x")
    assert len(taken.gpus) == 2 and [o.name for o in taken.replaces] == ["a"]


def test_a_stale_lock_holds_no_gpus_a_live_one_does() -> None:
    lock = {"run_id": "r", "holder_pid": 99999, "gpus": [0, 1]}
    stale = box(deployments={"a": {"state": {"status": "starting", "gpus": [0, 1]}, "lock": lock}})
    assert place("b", (0, 1), stale, replace=False, where="x").gpus == (0, 1)
    live = box(deployments={"a": {"state": {"status": "starting", "gpus": [0, 1]}, "lock": lock, "lock_live": True}})
    with pytest.raises(PreflightError, match="deployment a on GPUs 0,1 \\(deploying now\\)"):
        place("b", (0, 1), live, replace=False, where="x")


def test_restart_without_a_name_leaves_stopped_deployments_stopped_when_there_are_several() -> None:
    from fleet.control.ops import restartable

    plan = {"plan": {"argv": ["python"]}}
    several = box(
        deployments={
            "a": {"state": {**plan, "status": "ready"}},
            "b": {"state": {**plan, "status": "stopped"}},
            "c": {"state": {**plan, "status": "failed"}},
        }
    )
    assert restartable(several) == ["a", "c"]
    one = box(deployments={"b": {"state": {**plan, "status": "stopped"}}})
    assert restartable(one) == ["b"]  # the host's only deployment, as `fleet restart --host` always did


def test_a_port_is_kept_only_when_every_listener_on_it_is_stopped_first_and_is_fleets_users() -> None:
    """The stale server's own listener is stopped with it; another listener on the same port (an unseen
    pid, another user's process in that server's group) or a replaced deployment's pgid now used by
    another user's server is not, so the deployment moves, as the host would refuse it otherwise."""
    stale = server(500)
    unseen = {"address": "10.0.0.5", "port": 30000, "pid": None}
    mine = {"address": "127.0.0.1", "port": 30000, "pid": 500}
    for listeners in ([mine, unseen], [unseen, mine]):
        assert port_for("new", 30000, box(servers=[stale], listeners=listeners), stopping={500})[0] == 30010
    bobs_in_its_group = {**server(501, pgid=500), "uid": 1001, "user": "bob"}
    f = box(servers=[stale, bobs_in_its_group], listeners=[{"address": "0.0.0.0", "port": 30000, "pid": 501}])
    assert port_for("new", 30000, f, stopping={500})[0] == 30010
    reused = {**server(600), "uid": 1001, "user": "bob"}  # deployment old's pgid 600, a pid bob's server got
    f = box(servers=[reused], deployments={"old": deployed(600, [0, 1])}, listeners=[{**mine, "pid": 600}])
    assert port_for("new", 30000, f, replacing=["old"])[0] == 30010
    assert port_for("new", 30000, box(servers=[stale], listeners=[mine]), stopping={500})[0] == 30000
