"""One model over several hosts, the pure part: the playbook's hosts:, each rank's command line, the group's
pre-flight across the nodes' facts, and the group's relaunch policy."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from conftest import ROOT
from factsdata import RTX_A6000, facts
from fleet.crashes import Diagnosis, GiveUp, Relaunch
from fleet.errors import ConfigError
from fleet.facts.parse import Listener
from fleet.inventory import check_playbook_host, load_inventory, load_playbook
from fleet.plan import Fix
from fleet.plan.build import build_plan
from fleet.plan.group import GROUP_RELAUNCH, Node, group_decision, group_preflight, rank_plan

NODES = [Node(0, "node-a", "10.0.0.1", "ens1f0"), Node(1, "node-b", "10.0.0.2", "ens1f0")]
GROUP = """\
engine: sglang
model: Qwen3.6-27B
served_name: qwen36
hosts: [node-a, node-b]
tp: 4
smoke: {prompt: "Capital of France?", expect: "(?i)paris"}
"""


def playbook(tmp_path: Path, text: str = GROUP) -> object:
    path = tmp_path / "group.yaml"
    path.write_text(text)
    return load_playbook(str(path), ROOT)


def group_plans(version: str = "0.5.11", gpus: tuple = (RTX_A6000, 2), **fields: object) -> tuple:
    inv = load_inventory(ROOT / "inventory" / "hosts.yaml")
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    pb = replace(pb, spec=msgspec.structs.replace(pb.spec, hosts=["node-a", "node-b"], tp=4, **fields))
    f = facts("ct129", gpus[0], gpus[1], version=version, model=pb.spec.model)
    r = build_plan(inv.hosts["ct129"], pb, f, f"/models/{pb.spec.model}", nodes=2)
    assert r.plan is not None, r.verdicts
    return r, f


@pytest.mark.parametrize(
    ("change", "line", "said"),
    [
        ("hosts: [node-a, node-b]", "hosts: [node-a]", "at least two"),
        ("hosts: [node-a, node-b]", "hosts: [node-a, node-a]", "names a host twice"),
        ("tp: 4", "tp: 3", "does not split evenly over the 2 hosts"),
        ("tp: 4", "tp: 4\ndist_port: 30000", "the HTTP port too"),
        ("tp: 4", "tp: 4\ndefault_host: ct129", "a group runs on its hosts: only"),
        ("tp: 4", "tp: 4\nextra_args: [--node-rank, '1']", "hosts:"),
        ("tp: 4", "tp: 4\nextra_args: ['--dist-init-addr=10.0.0.9:5000']", "dist_port:"),
    ],
)
def test_a_bad_group_playbook_is_refused_with_file_line_and_what_is_wrong(
    tmp_path: Path, change: str, line: str, said: str
) -> None:
    with pytest.raises(ConfigError) as err:
        playbook(tmp_path, GROUP.replace(change, line))
    assert "group.yaml:" in err.value.message and said in err.value.message


def test_hosts_the_inventory_lacks_are_named_with_the_playbooks_line(tmp_path: Path) -> None:
    pb = playbook(tmp_path)
    with pytest.raises(ConfigError) as err:
        check_playbook_host(pb, load_inventory(ROOT / "inventory" / "hosts.yaml"))  # type: ignore[arg-type]
    assert "group.yaml:4" in err.value.message and '"node-a"' in err.value.message


def test_a_network_interface_that_is_no_interface_name_is_refused(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  a:\n    address: a\n    network_interface: 'eth0; reboot'\n")
    with pytest.raises(ConfigError) as err:
        load_inventory(inv)
    assert "hosts.yaml:4" in err.value.message and "network interface name" in err.value.message


def test_every_rank_runs_the_groups_plan_with_its_rank_and_rank_0s_address() -> None:
    r, _ = group_plans()
    assert r.gpus.count == 4 and not r.gpus.nvlink  # the group's GPUs; between hosts there is no NVLink
    for rank in (0, 1):
        p = rank_plan(r.plan, NODES, rank, 50000)
        args = p.engine_args()
        assert args[args.index("--tp-size") + 1] == "4"
        assert args[-6:] == ["--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", "10.0.0.1:50000"]
        env = {e.name: e.value for e in p.env}
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "ens1f0"
        assert env["SGLANG_HOST_IP"] == NODES[rank].address
        assert all(f.reason for f in p.flags) and all(e.reason for e in p.env)  # each with its reason


def test_an_ipv6_rank_0_is_bracketed_and_no_interface_leaves_the_engine_to_choose() -> None:
    r, _ = group_plans()
    nodes = [Node(0, "a", "fd00::1", None), Node(1, "b", "fd00::2", None)]
    p = rank_plan(r.plan, nodes, 1, 50000)
    assert p.flag("--dist-init-addr").value == "[fd00::1]:50000"  # type: ignore[union-attr]
    assert not {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"} & {e.name for e in p.env}


def preflight(fa: object, fb: object, **kw: object) -> list[str]:
    r, _ = group_plans()
    plans = kw.pop("plans", [r.plan, r.plan])
    counts = kw.pop("counts", [2, 2])
    fb = replace(fb, hostname=f"{fb.hostname}-b")  # type: ignore[type-var]  # two machines
    return [v.message for v in group_preflight(NODES, [fa, fb], plans, counts, 50000, str(kw.pop("engine", "sglang")))]


def reached(f: object, how: str = "refused") -> object:
    return replace(f, reach=how)  # type: ignore[type-var]


def test_a_sound_group_passes_its_preflight() -> None:
    _, f = group_plans()
    assert preflight(reached(f), reached(f)) == []


def test_a_node_that_cannot_reach_rank_0_is_refused_with_what_it_saw() -> None:
    _, f = group_plans()
    (said,) = preflight(reached(f), reached(f, "timeout after 3 s"))
    assert "node-b cannot reach rank 0 (node-a, 10.0.0.1:50000): timeout after 3 s" in said


def test_different_engine_versions_models_or_gpu_counts_are_refused() -> None:
    r, f = group_plans()
    r23, _ = group_plans("0.5.23")
    (said,) = preflight(reached(f), reached(f), plans=[r.plan, r23.plan])
    assert "different sglang versions (node-a 0.5.11, node-b 0.5.23)" in said
    other_model = replace(f.model, listing="9 files, abc", weights_bytes=1)
    assert any("model's files differ" in m for m in preflight(reached(f), reached(replace(f, model=other_model))))
    assert any(
        "different GPU counts (node-a 2, node-b 8)" in m for m in preflight(reached(f), reached(f), counts=[2, 8])
    )


def test_rank_0s_dist_port_held_by_something_else_is_refused() -> None:
    r, f = group_plans()
    held = replace(f, listeners=(Listener("0.0.0.0", 50000, 4242),))
    assert any(
        "dist_port 50000 on node-a (rank 0) is held (pid 4242" in m for m in preflight(reached(held), reached(f))
    )
    own = group_preflight(
        NODES, [reached(held), reached(replace(f, hostname="b"))], [r.plan, r.plan], [2, 2], 50000, "sglang", {4242}
    )
    assert own == []  # the group's own rank 0 holds it: a redeploy stops it first


def test_vllm_over_several_hosts_is_refused_with_why() -> None:
    _, f = group_plans()
    (said,) = preflight(reached(f), reached(f), engine="vllm")
    assert "SGLang only" in said and "--headless" in said


def diagnosis(category: str, signature: str | None, fix: Fix | None = None) -> Diagnosis:
    return Diagnosis(category, signature, "why", fix, ())


def test_a_lost_rank_relaunches_the_group_once_then_gives_up() -> None:
    lost = diagnosis("worker_timeout", "nccl-collective-watchdog")
    first = group_decision(lost, [], 1, 4)
    assert isinstance(first, Relaunch) and first.signature == GROUP_RELAUNCH and first.fix == Fix()
    assert isinstance(group_decision(lost, [GROUP_RELAUNCH], 2, 4), GiveUp)
    unexplained = diagnosis("unknown", None)
    assert isinstance(group_decision(unexplained, [], 1, 4), GiveUp)  # no line says a rank was lost


def test_a_rank_whose_host_fleet_lost_is_given_up_at_once_saying_so() -> None:
    silent = "node-b: no answer for 30 s"
    decision = group_decision(diagnosis("unknown", None), [], 1, 4, [f"[fleet] {silent}"], host_lost=silent)
    assert isinstance(decision, GiveUp) and decision.reason.startswith(
        f"fleet lost its host while watching it ({silent})"
    )


def test_a_rank_killed_from_outside_counts_as_lost_and_a_known_fix_wins() -> None:
    killed = group_decision(diagnosis("unknown", None), [], 1, 4, ["[fleet] engine killed by signal 9"])
    assert isinstance(killed, Relaunch) and killed.signature == GROUP_RELAUNCH
    fix = Fix(set_flags=(("--mem-fraction-static", "0.8"),))
    known = group_decision(diagnosis("oom", "cuda-oom", fix), [], 1, 4)
    assert isinstance(known, Relaunch) and known.fix == fix


def test_the_command_line_refuses_single_host_options_for_a_group_and_a_group_stop_of_a_single_host_playbook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from conftest import run_cli

    monkeypatch.setenv("FLEET_INVENTORY", str(ROOT / "inventory" / "hosts.yaml"))
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(ROOT / "playbooks"))
    r = run_cli("deploy", "qwen35-two-nodes", "--host", "blackwell")
    assert r.code == 2 and "--host: the playbook is placed on its hosts:" in r.err
    r = run_cli("plan", "qwen35-two-nodes", "--check", "--engine", "sglang==0.5.23")  # not silently ignored
    assert r.code == 2 and "--engine, --check: the playbook is placed on its hosts:" in r.err
    r = run_cli("stop", "qwen36-27b")
    assert r.code == 2 and "runs on one host" in r.err
    r = run_cli("plan", "qwen35-two-nodes")  # the example names hosts this inventory lacks
    assert r.code != 0 and 'qwen35-two-nodes.yaml:9: hosts: names "blackwell-a"' in r.err


def test_the_inventorys_interface_wins_over_the_one_found_and_loopback_is_never_chosen() -> None:
    said = Node(0, "a", "10.0.0.1", "ens1f0")
    assert said.with_found_interface("eth7") == said
    found = Node(0, "a", "10.0.0.1", None).with_found_interface("eth7")
    assert found.interface == "eth7" and found.interface_from == "route"
    assert Node(0, "a", "10.0.0.1", None).with_found_interface("lo").interface is None


def test_two_nodes_with_one_address_one_machine_or_a_loopback_rank_0_are_refused() -> None:
    r, f = group_plans()
    same = [Node(0, "node-a", "10.0.0.1", None), Node(1, "node-b", "10.0.0.1", None)]
    said = [
        v.message for v in group_preflight(same, [reached(f), reached(f)], [r.plan, r.plan], [2, 2], 50000, "sglang")
    ]
    assert any("same address" in m for m in said) and any("same machine" in m for m in said)
    loop = [Node(0, "node-a", "127.0.0.1", None), Node(1, "node-b", "10.0.0.2", None)]
    fb = replace(f, hostname="other")
    said = [
        v.message for v in group_preflight(loop, [reached(f), reached(fb)], [r.plan, r.plan], [2, 2], 50000, "sglang")
    ]
    assert said and "loopback" in said[0]


def test_a_misconfiguration_is_given_up_at_once_not_relaunched_as_it_was() -> None:
    for signature in ("multinode-socket-interface-missing", "multinode-rank0-unreachable", "multinode-gloo-mesh"):
        assert isinstance(group_decision(diagnosis("worker_timeout", signature), [], 1, 4), GiveUp)
    assert isinstance(group_decision(diagnosis("worker_timeout", "multinode-peer-never-joined"), [], 1, 4), Relaunch)
