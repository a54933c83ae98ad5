"""Several deployments on one host, each on its own GPUs, ports, state and lock: fleet's real host scripts
in a simulated 8-GPU host's namespaces (fleet_testbed.nshost), through fleet's own loop."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from conftest import ROOT
from fleet import events
from fleet.control import ops
from fleet.control.logs import log_text
from fleet.control.status_rows import status_rows
from fleet.control.sweep import HealthOptions, check_host, heal_host
from fleet.errors import ConfigError, LockedError, PreflightError
from fleet.inventory import load_playbook
from fleet_testbed import nshost, simhost
from simengine import wait_until

# each test starts simulated engines in a host's namespaces and waits for them (seconds): the coverage
# tier and `make test` run them; `make unit` runs the same loop's branches against scripted hosts
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not nshost.available(), reason="needs root, unshare and nsenter"),
]


@pytest.fixture
def box(tmp_path: Path) -> Iterator[nshost.NamespaceHost]:
    h = nshost.NamespaceHost(tmp_path, simhost.BLACKWELL, nshost.loopback_address())
    yield h
    h.close()


def deploy(h: nshost.NamespaceHost, name: str, gpus: Any, **kw: Any) -> tuple[Any, list[events.Event]]:
    seen: list[events.Event] = []
    pb = load_playbook(kw.pop("playbook", "qwen36-27b"), ROOT / "playbooks")
    if "spec" in kw:  # playbook settings changed for this test
        pb = dataclasses.replace(pb, spec=msgspec.structs.replace(pb.spec, **kw.pop("spec")))
    result = ops.deploy(
        h.transport(), h.host, pb, force=False, engine_check=False, progress=seen.append, name=name, gpus=gpus, **kw
    )
    return result, seen


def record(h: nshost.NamespaceHost, name: str) -> dict[str, Any]:
    return json.loads(simhost.record(h.dir, "state.json", name).read_text())


def held_gpus(h: nshost.NamespaceHost, pgid: int) -> set[str]:
    """The /dev/nvidiaN files the processes of a group hold open (what fuser would list)."""
    out = h.shell(
        f"for p in $(ps -o pid= -g {pgid}); do ls -l /proc/$p/fd 2>/dev/null; done | grep -o 'nvidia[0-9]*$' || true"
    )
    return set(out.split())


def environment(h: nshost.NamespaceHost, pid: int) -> dict[str, str]:
    raw = h.shell(f"cat /proc/{pid}/environ | tr '\\0' '\\n'")
    return dict(line.split("=", 1) for line in raw.splitlines() if "=" in line)


def alive(h: nshost.NamespaceHost, pid: int) -> bool:
    return h.shell(f"ps -o stat= -p {pid} || true").strip()[:1] not in ("", "Z")


def engine_of(h: nshost.NamespaceHost, name: str) -> int:
    """The engine process (python -m sglang.launch_server) of a deployment: the launcher's child."""
    return int(h.shell(f"pgrep -P {record(h, name)['pid']} -f sglang.launch_server").split()[0])


def test_two_deployments_share_a_box_on_their_own_gpus_ports_and_records(box: nshost.NamespaceHost) -> None:
    a, seen = deploy(box, "big", (0, 1, 2, 3))
    b, _ = deploy(box, "small", (6, 7))
    assert a.ok and b.ok, (a.reason, b.reason)
    assert b.name == "qwen36-27b (deployment small)"  # how the outcome names it
    planned = next(e for e in seen if isinstance(e, events.Planned))
    assert planned.deployment == "big" and planned.placement == "GPUs 0,1,2,3 as asked"
    big, small = record(box, "big"), record(box, "small")
    assert (big["gpus"], small["gpus"]) == ([0, 1, 2, 3], [6, 7])
    assert (big["port"], small["port"]) == (30000, 30010)  # the second moved off the first's port by rule
    argv_b = small["plan"]["argv"]
    assert argv_b[argv_b.index("--nccl-port") + 1] == "40010"
    env = environment(box, engine_of(box, "small"))
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert held_gpus(box, big["pgid"]) == {"nvidia0", "nvidia1", "nvidia2", "nvidia3"}
    assert held_gpus(box, small["pgid"]) == {"nvidia6", "nvidia7"}
    shown = log_text(box.transport(), box.host, "small", 500)
    assert "port=30010" in shown and "port=30000," not in shown  # small's own log
    rows = status_rows(box.host, ops.read_facts(box.transport(), box.host))
    assert [(r["deployment"], r["gpus"], r["status"]) for r in rows] == [
        ("big", [0, 1, 2, 3], "ready"),
        ("small", [6, 7], "ready"),
    ]


def test_restarting_or_stopping_one_deployment_leaves_the_other_untouched(box: nshost.NamespaceHost) -> None:
    assert deploy(box, "big", (0, 1, 2, 3))[0].ok and deploy(box, "small", (6, 7))[0].ok
    small = record(box, "small")
    restarted = ops.restart(box.transport(), box.host, force=False, progress=events.ignore, name="big")
    assert restarted.ok
    assert record(box, "small")["pid"] == small["pid"] and alive(box, small["pid"])
    assert held_gpus(box, small["pgid"]) == {"nvidia6", "nvidia7"}
    with pytest.raises(ConfigError, match="2 deployments \\(big, small\\); say which to restart"):
        ops.restart(box.transport(), box.host, force=False, progress=events.ignore)
    with pytest.raises(ConfigError, match="no deployment named bigg \\(deployments there: big, small\\)"):
        ops.stop(box.transport(), box.host, force=False, name="bigg")
    out = ops.stop(box.transport(), box.host, force=False, name="big")
    assert {p["pgid"] for p in out["ended"]} == {record(box, "big")["pgid"]}
    assert record(box, "big")["status"] == "stopped" and alive(box, small["pid"])
    health = check_host(box.transport(), box.host, HealthOptions())
    mine = {(c.deployment, c.name): c.status for c in health.checks if c.deployment}
    assert mine[("small", "generation")] == "ok" and mine[("big", "server")] == "ok"  # stopped by an operator
    assert health.up == {"big": False, "small": True}
    everything = ops.stop(box.transport(), box.host, force=False)  # --host alone: every deployment there
    assert everything["refused"] == [] and not alive(box, small["pid"])
    assert {n: record(box, n)["status"] for n in ("big", "small")} == {"big": "stopped", "small": "stopped"}


def test_overlap_is_refused_naming_the_other_unless_replaced(box: nshost.NamespaceHost) -> None:
    assert deploy(box, "big", (0, 1, 2, 3))[0].ok
    big = record(box, "big")
    with pytest.raises(PreflightError) as caught:
        deploy(box, "small", (3, 4))
    assert "deployment big on GPUs 0,1,2,3 (pid" in caught.value.message and "--replace" in caught.value.hint
    assert not simhost.record(box.dir, "state.json", "small").exists() and alive(box, big["pid"])
    with pytest.raises(PreflightError, match="overlap deployment big"):
        deploy(box, "whole", None, spec={"gpus": "all"})  # all GPUs: also over big's
    replaced, seen = deploy(box, "small", (3, 4), replace=True)
    assert replaced.ok and not alive(box, big["pid"])
    [stop] = [e for e in seen if isinstance(e, events.Stopped)]  # the operator is told what --replace stopped
    assert {p["why"] for p in stop.stopped} == {"deployment big's server (--replace)"}
    assert record(box, "big")["status"] == "stopped" and "replaced by deployment small" in record(box, "big")["reason"]
    assert record(box, "small")["port"] == big["port"]  # big's endpoint is small's now, not moved off a step


def test_a_count_is_placed_on_free_gpus_sharing_the_closest_links(box: nshost.NamespaceHost) -> None:
    """The probe reads NVML's topology (the simulated board: two GPUs per PCIe switch, four per socket);
    a count takes GPUs behind one switch, not the next indices (3 and 4 sit on two sockets)."""
    topology = ops.read_facts(box.transport(), box.host).gpu_topology
    assert (topology[(0, 1)], topology[(1, 2)], topology[(3, 4)]) == (10, 40, 50)
    assert deploy(box, "first", (1, 2))[0].ok
    result, seen = deploy(box, "pair", 2)
    assert result.ok and record(box, "pair")["gpus"] == [4, 5]
    said = next(e for e in seen if isinstance(e, events.Planned)).placement
    assert said.startswith("2 free GPUs picked: 4,5 (one PCIe switch)")


def test_a_host_deployed_by_the_previous_fleet_is_one_deployment_and_keeps_running(box: nshost.NamespaceHost) -> None:
    """An older fleet kept one state.json per host: it is read as the deployment its playbook names, on
    all GPUs; the next deploy of that playbook proves and keeps the running server, and moves the record."""
    assert deploy(box, "qwen36-27b", None)[0].ok
    current = simhost.record(box.dir, "state.json", "qwen36-27b")
    old = json.loads(current.read_text())
    for key in ("deployment", "gpus"):
        old.pop(key, None)
    old["schema"] = 1
    (box.dir / "state" / "state.json").write_text(json.dumps(old))  # as the previous fleet wrote it
    current.unlink()
    (current.parent / "lock.guard").unlink(missing_ok=True)
    current.parent.rmdir()
    rows = status_rows(box.host, ops.read_facts(box.transport(), box.host))
    assert [(r["deployment"], r["status"], r["pid"]) for r in rows] == [("qwen36-27b", "ready", old["pid"])]
    with pytest.raises(PreflightError, match="overlap deployment qwen36-27b"):
        deploy(box, "beside", (6, 7))  # the old server holds every GPU
    again, seen = deploy(box, "qwen36-27b", None)
    assert again.ok and again.adopted and alive(box, old["pid"]), [e for e in seen if isinstance(e, events.NotAdopted)]
    deployed = deploy(box, "qwen36-27b", None, playbook="qwen36-27b")[0]  # adopted again, from the same record
    assert deployed.adopted
    stopped = ops.stop(box.transport(), box.host, force=False, name="qwen36-27b")
    assert old["pid"] in [p["pid"] for p in stopped["ended"]]  # found through the moved record
    assert not (box.dir / "state" / "state.json").exists() and record(box, "qwen36-27b")["status"] == "stopped"


def test_a_deploy_under_way_elsewhere_on_the_host_holds_its_gpus_and_port_against_a_second(
    box: nshost.NamespaceHost,
) -> None:
    """Two deploys placing themselves at once: each read the facts before the other took its lock, so the
    act step checks again under the host's guard, against the other run's lock (its GPUs and ports).
    The other run is made to start between this one's facts and its act (on its Planned event)."""
    lock = simhost.record(box.dir, "lock.json", "other")

    def other_run_starts(event: events.Event) -> None:
        if isinstance(event, events.Planned):
            lock.parent.mkdir(parents=True, exist_ok=True)
            claim = {"run_id": "r", "owner": "ana", "holder_pid": 1, "gpus": [6, 7], "ports": [30000, 40000]}
            lock.write_text(json.dumps(claim))

    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    with pytest.raises(PreflightError) as caught:
        ops.deploy(
            box.transport(),
            box.host,
            pb,
            force=False,
            engine_check=False,
            progress=other_run_starts,
            name="small",
            gpus=(0, 1),
        )
    said = caught.value.message
    assert "share GPUs or a port with deployment other on GPUs 6,7 and port 30000 (deploying now)" in said
    assert not simhost.record(box.dir, "state.json", "small").exists()
    # seen in the facts, the other run's claim moves this one to another port instead
    result, seen = deploy(box, "small", (0, 1))
    assert result.ok and record(box, "small")["port"] == 30010
    lock.unlink()


def test_a_deployment_moved_off_its_playbook_port_is_kept_on_redeploy_not_restarted(box: nshost.NamespaceHost) -> None:
    assert deploy(box, "x", (0, 1))[0].ok and deploy(box, "a", (2, 3))[0].ok
    first = record(box, "a")
    again, _ = deploy(box, "a", (2, 3))
    assert again.adopted and record(box, "a")["pid"] == first["pid"] and record(box, "a")["port"] == 30010


def test_a_count_avoids_gpus_an_engine_started_by_hand_uses(box: nshost.NamespaceHost) -> None:
    python = f"{box.dir}/env/bin/python"
    model = f"{box.dir}/models/Qwen3.6-27B"
    gpus = "CUDA_VISIBLE_DEVICES=4,5 CUDA_DEVICE_ORDER=PCI_BUS_ID"
    box.shell(
        f"cd {box.dir} && {gpus} setsid {python} -m sglang.launch_server --model-path {model} --tp 2 "
        f"--host {box.spec.address} --port 31000 </dev/null >/dev/null 2>&1 &"
    )
    box.shell("for i in $(seq 200); do [ $(pgrep -c -f '^sglang::scheduler') -ge 2 ] && break; sleep 0.05; done")
    facts = ops.read_facts(box.transport(), box.host)
    assert {g.index for g in facts.gpus if g.holders} == {4, 5}  # who holds which /dev/nvidiaN
    result, _ = deploy(box, "pair", 2, replace=True)
    assert result.ok and record(box, "pair")["gpus"] == [0, 1]
    assert box.shell("pgrep -f -c '[p]ort 31000'").strip() == "1"  # the hand-started engine serves on


def test_a_crashed_deployment_whose_leader_nobody_reaped_frees_its_gpus(box: nshost.NamespaceHost) -> None:
    """No init reaps in this namespace (as in a container without one): the killed server's leader stays
    a zombie, which must not count as a running deployment."""
    assert deploy(box, "a", (0, 1))[0].ok
    box.shell(f"kill -9 -{record(box, 'a')['pgid']}")
    result, _ = deploy(box, "b", (0, 1))
    assert result.ok, result.reason


def test_stopping_every_deployment_stops_the_rest_when_one_is_busy(box: nshost.NamespaceHost) -> None:
    assert deploy(box, "a", (0, 1))[0].ok and deploy(box, "c", (4, 5))[0].ok
    lock = simhost.record(box.dir, "lock.json", "b")
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"run_id": "r", "owner": "ana", "holder_pid": 1, "command": "deploy"}))
    with pytest.raises(LockedError) as caught:
        ops.stop(box.transport(), box.host, force=False)
    assert "(deployment b): locked by ana" in caught.value.message and "Stopped the rest" in caught.value.message
    assert {n: record(box, n)["status"] for n in ("a", "c")} == {"a": "stopped", "c": "stopped"}


def test_an_older_fleets_crashed_server_is_healed_through_its_moved_record(box: nshost.NamespaceHost) -> None:
    assert deploy(box, "qwen36-27b", None)[0].ok
    current = simhost.record(box.dir, "state.json", "qwen36-27b")
    old = {k: v for k, v in json.loads(current.read_text()).items() if k not in ("deployment", "gpus", "ports")}
    (box.dir / "state" / "state.json").write_text(json.dumps(old))
    (box.dir / "state" / "health.json").write_text(json.dumps({"kernel_offset": 7}))  # the host's bookkeeping
    current.unlink()
    box.shell(f"kill -9 -{old['pgid']}")
    options = HealthOptions(heal=True)
    down = check_host(box.transport(), box.host, options)
    assert down.healable == ("qwen36-27b",)

    def restart(name: str) -> Any:
        return ops.restart(box.transport(), box.host, force=False, progress=events.ignore, name=name)

    healed = heal_host(box.transport(), box.host, down, options, restart)
    assert healed.heal == "qwen36-27b: restarted: server ready", healed.heal
    assert not (box.dir / "state" / "state.json").exists() and record(box, "qwen36-27b")["status"] == "ready"
    assert (box.dir / "state" / "health.json").exists()  # not moved into the deployment's directory


def test_gpus_fit_takes_the_gpus_the_model_needs_and_leaves_the_rest(box: nshost.NamespaceHost) -> None:
    """Qwen3.6-27B on the 8 x 96 GB box with gpus: fit (packing): one GPU holds its weights and a
    whole-context KV cache, so the deployment takes one (TP 1), and a second one beside it (a replica,
    say) takes another; the rest stay free."""
    seen: list[events.Event] = []
    for name in ("one", "two"):
        result, events_of_one = deploy(box, name, None, spec={"gpus": "fit"})
        assert result.ok, result.reason
        seen += events_of_one
    planned = [e for e in seen if isinstance(e, events.Planned)]
    assert planned[0].placement.startswith("gpus: fit: 1 GPU (TP 1): weights 51.8 GiB per GPU")
    assert "the host's other 7 are left for other deployments or replicas" in planned[0].placement
    assert "1 free GPU picked: 1; port 30000 is deployment one's: two uses 30010" in planned[1].placement
    one, two = record(box, "one"), record(box, "two")
    assert len(one["gpus"]) == 1 and len(two["gpus"]) == 1 and one["gpus"] != two["gpus"]
    argv = one["plan"]["argv"]
    assert argv[argv.index("--tp-size") + 1] == "1"
    assert environment(box, engine_of(box, "one"))["CUDA_VISIBLE_DEVICES"] == str(one["gpus"][0])
    # gpus: left out takes the free GPUs the two leave: six, as TP 4 of a hybrid model (no TP 6 splits it)
    result, seen = deploy(box, "rest", None)
    assert result.ok, result.reason
    planned = [e for e in seen if isinstance(e, events.Planned)]
    assert "the host's 6 free GPUs as TP 4" in planned[0].placement
    rest = record(box, "rest")
    assert len(rest["gpus"]) == 4 and not set(rest["gpus"]) & {*one["gpus"], *two["gpus"]}


def test_a_stop_beside_an_all_gpu_deployment_neither_waits_for_it_nor_calls_it_refused(
    box: nshost.NamespaceHost,
) -> None:
    """`fleet stop` of a deployment beside one on all GPUs: the other's record names no GPU, so none was
    counted as its own; the stop waited 30 s for memory the other keeps and listed the other's processes
    as "not stopped ... --force stops it" (issue 38, 39). The other is left running, and not mentioned."""
    assert deploy(box, "small", (0, 1))[0].ok
    ops.stop(box.transport(), box.host, force=False, name="small")
    assert deploy(box, "whole", None, spec={"gpus": "all"})[0].ok
    whole = record(box, "whole")
    assert "gpus" not in whole  # all of them: the record names none
    out = ops.stop(box.transport(), box.host, force=False, name="small")
    assert out["refused"] == [] and out["ended"] == [] and alive(box, whole["pid"])
    everything = ops.stop(box.transport(), box.host, force=False)  # --host alone: whole is stopped, once
    assert everything["refused"] == [] and not alive(box, whole["pid"])
    assert {p["pid"] for p in everything["ended"]} >= {whole["pid"]}


def test_a_stop_beside_an_all_gpu_deployment_waits_only_for_the_memory_of_what_it_stopped(
    box: nshost.NamespaceHost,
) -> None:
    """What the stop finds on its GPUs (an engine started there by hand) is stopped, and the stop waits on
    those GPUs for that engine's memory alone: the deployment on all GPUs keeps its own there (issue 38's
    first defect: a stop that counted it waited out its 30 s)."""
    assert deploy(box, "small", (0, 1))[0].ok
    argv = record(box, "small")["plan"]["argv"]
    ops.stop(box.transport(), box.host, force=False, name="small")
    assert deploy(box, "whole", None, spec={"gpus": "all", "mem_fraction": 0.5})[0].ok  # room beside it
    argv[argv.index("--port") + 1] = "31999"
    by_hand_argv = " ".join(shlex.quote(w) for w in [*argv, "--mem-fraction-static", "0.3"])
    box.shell(f"cd {box.dir} && setsid {by_hand_argv} </dev/null >/dev/null 2>&1 &")
    by_hand = int(box.shell("pgrep -f -o '[s]glang.launch_server.*31999'").strip())
    assert wait_until(lambda: {"nvidia0", "nvidia1"} <= held_gpus(box, by_hand), timeout=60)

    facts = ops.read_facts(box.transport(), box.host)
    out = ops._stop_one(box.transport(), box.host, facts, "small", force=False, everything=False)
    assert by_hand in [p["pid"] for p in out["ended"]] and not alive(box, by_hand)
    assert out["memory"]["gpus"] == [0, 1] and max(out["memory"]["after_mib"]) <= 1024  # idle: what fleet calls free
    assert out["memory_held"] == [] and out["refused"] == []
    assert alive(box, record(box, "whole")["pid"])


@pytest.mark.parametrize("taker", ["another user's process", "a process started during the stop"])
def test_a_job_that_takes_the_gpus_as_the_stop_frees_them_is_not_waited_for(
    box: nshost.NamespaceHost, taker: str
) -> None:
    """Another job grabs the GPUs the moment the stopped engine frees them (the simulated GPUs hand them
    over when its memory starts to come back). The stop did not stop that job and waits only for what it
    did stop: it neither waits out its 30 s nor says the memory is still in use; the job is left alone."""
    assert deploy(box, "small", (0, 1))[0].ok
    who: dict[str, Any] = {"used_mib": 20000}
    if taker == "another user's process":
        box.shell("useradd --system --no-create-home fleetdecoy 2>/dev/null || true")
        as_decoy = "setpriv --reuid=fleetdecoy --regid=fleetdecoy --clear-groups"
        who["pid"] = int(box.shell(f"{as_decoy} sleep 600 </dev/null >/dev/null 2>&1 & echo $!").strip())
    simhost.set_host(box.dir, memory_release_s=0.5, taken_when_freed=who)
    try:
        out = ops.stop(box.transport(), box.host, force=False, name="small")
        taken = who.get("pid") or int((box.dir / "run" / "taken.pid").read_text())
        assert alive(box, taken) and taken not in [p["pid"] for p in out["ended"]]
        assert box.shell(f"grep -l '\"pid\": {taken},' {box.dir}/run/gpu/*.json || true").strip()  # it holds a GPU
        assert out["memory_held"] == [] and out["refused"] == [], out["memory_held"]
    finally:
        simhost.set_host(box.dir, memory_release_s=0, taken_when_freed=None)
        box.shell(f"pkill -u fleetdecoy sleep; kill $(cat {box.dir}/run/taken.pid 2>/dev/null) 2>/dev/null; true")


def test_a_sibling_on_all_gpus_runs_on_every_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fleet.host.free as free
    import fleet.host.lock as lock

    d = tmp_path / "deployments" / "whole"
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"status": "ready", "pgid": os.getpgid(0)}))  # no "gpus": all
    monkeypatch.setattr(free, "recorded_group_is_ours", lambda pgid, st: True)  # identity is tested elsewhere
    siblings, _, gpus = lock.sibling_groups(str(tmp_path), "small", [], every=[0, 1, 2, 3])
    assert siblings == {os.getpgid(0): "whole"} and gpus == {0, 1, 2, 3}


def test_a_stopped_deployment_is_forgotten_and_a_running_one_is_not(box: nshost.NamespaceHost) -> None:
    from fleet.control.forget import forget

    assert deploy(box, "big", (0, 1, 2, 3))[0].ok and deploy(box, "small", (6, 7))[0].ok
    ops.stop(box.transport(), box.host, force=False, name="big")
    learned = simhost.record(box.dir, "learned.json")
    learned_before = learned.read_bytes() if learned.exists() else None
    with pytest.raises(PreflightError, match="deployment small is running"):
        forget(box.transport(), box.host, "small")  # stop it first
    forget(box.transport(), box.host, "big")
    assert not simhost.record(box.dir, "state.json", "big").parent.exists()
    assert [r["deployment"] for r in status_rows(box.host, ops.read_facts(box.transport(), box.host))] == ["small"]
    assert record(box, "small")["status"] == "ready" and alive(box, record(box, "small")["pid"])
    assert (learned.read_bytes() if learned.exists() else None) == learned_before  # the host's knowledge stays
    with pytest.raises(ConfigError, match="no deployment named big"):
        forget(box.transport(), box.host, "big")


@pytest.mark.parametrize("planted", ["notes.txt", "link"])
def test_a_deployment_directory_holding_what_fleet_did_not_write_is_not_forgotten(
    box: nshost.NamespaceHost, tmp_path: Path, planted: str
) -> None:
    """A file of somebody's, or a link where a record should be (to a file elsewhere): nothing is removed,
    nothing is followed."""
    from fleet.control.forget import forget

    assert deploy(box, "big", (0, 1))[0].ok
    ops.stop(box.transport(), box.host, force=False, name="big")
    directory = simhost.record(box.dir, "state.json", "big").parent
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    if planted == "link":
        (directory / "health.json").unlink(missing_ok=True)
        (directory / "health.json").symlink_to(target)
    else:
        (directory / planted).write_text("mine")
    with pytest.raises(PreflightError, match="holds files fleet did not write"):
        forget(box.transport(), box.host, "big")
    assert (directory / "state.json").exists() and target.read_text() == "{}"
    assert not (directory / "lock.json").exists()  # the refusal released the lock


def test_a_record_written_by_a_newer_fleet_is_refused_and_its_server_left_running(box: nshost.NamespaceHost) -> None:
    """Another fleet on this host (newer, with record shapes this one cannot read) keeps what it wrote:
    this fleet's deploy is refused before anything is stopped, leaves no lock, and status says unreadable."""
    assert deploy(box, "big", (0, 1))[0].ok
    path = simhost.record(box.dir, "state.json", "big")
    path.write_text(json.dumps({**json.loads(path.read_text()), "schema": 99}))
    before, pid = path.read_bytes(), json.loads(path.read_text())["pid"]
    with pytest.raises(PreflightError, match=r"state\.json was written by a newer fleet \(record version 99.*Nothing"):
        deploy(box, "big", (0, 1))
    assert path.read_bytes() == before and alive(box, pid)
    assert not (path.parent / "lock.json").exists()
    with pytest.raises(PreflightError, match=r"newer fleet .*Nothing on the host was changed"):  # no false success
        ops.stop(box.transport(), box.host, force=False, name="big")
    assert path.read_bytes() == before and alive(box, pid)
    rows = status_rows(box.host, ops.read_facts(box.transport(), box.host))
    assert [r["status"] for r in rows if r["deployment"] == "big"] == ["unreadable"]


def test_a_newer_fleets_learned_fixes_neither_stop_a_deploy_nor_are_written_over(box: nshost.NamespaceHost) -> None:
    """The host's learned fixes are shared by every fleet using it: a newer one's are left to it."""
    assert deploy(box, "big", (0, 1))[0].ok
    learned = box.dir / "state" / "learned.json"
    learned.write_text(json.dumps({"schema": 99, "fixes": {"a key": "a shape this fleet cannot know"}}))
    before = learned.read_bytes()
    assert deploy(box, "small", (6, 7))[0].ok
    health = check_host(box.transport(), box.host, HealthOptions())
    assert not [c for c in health.checks if "learned.json" in c.detail], health.checks
    assert learned.read_bytes() == before


def test_an_operators_stop_is_not_healed_even_after_a_late_run_marked_it_failed(box: nshost.NamespaceHost) -> None:
    """A run that gives up late merges "failed" into a record an operator stopped meanwhile: the stop
    still stands, and `fleet health --heal` does not start the server again."""
    from fleet.host.records import change_status

    assert deploy(box, "qwen36-27b", None)[0].ok
    ops.stop(box.transport(), box.host, force=False, name="qwen36-27b")
    path = simhost.record(box.dir, "state.json", "qwen36-27b")
    assert change_status(str(path), "failed", {"reason": "the deploy gave up after the stop"})
    options = HealthOptions(heal=True)
    down = check_host(box.transport(), box.host, options)

    def restart(name: str) -> Any:
        return ops.restart(box.transport(), box.host, force=False, progress=events.ignore, name=name, heal=True)

    healed = heal_host(box.transport(), box.host, down, options, restart)
    assert "restarted: server ready" not in (healed.heal or ""), healed.heal
    assert record(box, "qwen36-27b")["status"] == "failed" and record(box, "qwen36-27b")["stopped_by"]
    assert box.shell("pgrep -f '[s]glang.launch_server' || true").strip() == ""  # no server started


def test_a_directory_in_place_of_the_record_refuses_the_deploy_before_the_server_is_stopped(
    box: nshost.NamespaceHost,
) -> None:
    """No record could be written over it after the stop: the host would be left with no server."""
    assert deploy(box, "big", (0, 1))[0].ok
    path = simhost.record(box.dir, "state.json", "big")
    pid = json.loads(path.read_text())["pid"]
    path.unlink()
    path.mkdir()
    with pytest.raises(PreflightError, match=r"state\.json cannot be written \(a directory is in its place\)"):
        deploy(box, "big", (0, 1))
    assert alive(box, pid) and path.is_dir() and not (path.parent / "lock.json").exists()
