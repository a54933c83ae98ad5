"""One model over several hosts: simulated 2-GPU hosts, each in network namespaces of its own on a bridge
(real addresses, real TCP between them, iptables per host). The simulated SGLang really meets at rank 0's
--dist-init-addr as torch.distributed does; fleet deploys, watches, relaunches and stops the group as one."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from fleet import events
from fleet.control.group import GroupRun
from fleet.control.group_health import group_health, stop_group
from fleet.control.status_rows import status_rows
from fleet.crashes import LogContext, diagnose
from fleet.errors import PreflightError, UnsafeToKill
from fleet.inventory import Inventory, load_playbook
from fleet_testbed import nshost, simhost
from fleet_testbed.nodes import TWO_NODES

pytestmark = [
    pytest.mark.skipif(not nshost.available(), reason="needs root, unshare and nsenter"),
    pytest.mark.slow,  # engines meeting over real TCP, tens of seconds in all
]

PLAYBOOK = TWO_NODES  # the same group `make tour` shows


class Group:
    def __init__(self, root: Path, playbook: str = PLAYBOOK) -> None:
        self.network = nshost.Network()
        self.hosts = {
            name: nshost.NamespaceHost(root, replace(simhost.CT129, name=name), network=self.network)
            for name in ("node-a", "node-b")
        }
        self.inventory = Inventory(root / "inventory.yaml", {n: h.host for n, h in self.hosts.items()}, {})
        self.playbook_path = root / "group.yaml"
        self.playbook_path.write_text(playbook)
        self.events: list[tuple[str, events.Event]] = []

    def connect(self, host: Any) -> Any:
        from contextlib import nullcontext

        return nullcontext(self.hosts[host.name].transport())

    def run(self, **kw: Any) -> GroupRun:
        pb = load_playbook(str(self.playbook_path), ROOT)
        return GroupRun(
            pb, self.inventory, self.connect, lambda where: lambda ev: self.events.append((where, ev)), **kw
        )

    def state(self, name: str) -> dict[str, Any]:
        path = self.hosts[name].dir / "state" / "deployments" / "group" / "state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def engines(self, name: str) -> list[int]:
        # the engine processes themselves (not fleet's launcher, nor this command's own shell)
        out = self.hosts[name].shell("pgrep -f '^[^ ]*python[^ ]* -m sglang[.]launch_server' || true")
        return [int(x) for x in out.split()]

    def close(self) -> None:
        for h in self.hosts.values():
            h.close()
        self.network.close()


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    g = Group(tmp_path)
    yield g
    g.close()


def ask(address: str, port: int = 30000) -> tuple[int, str]:
    body = json.dumps({"model": "qwen36", "messages": [{"role": "user", "content": "The capital of France?"}]})
    request = urllib.request.Request(
        f"http://{address}:{port}/v1/chat/completions", body.encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def health(address: str, port: int = 30000) -> int:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_group_meets_over_the_network_serves_on_rank_0_and_records_each_rank(group: Group) -> None:
    result = group.run().deploy()
    assert result.ok, result.reason
    a, b = group.hosts["node-a"], group.hosts["node-b"]
    assert result.endpoint == f"http://{a.spec.address}:30000"
    assert ask(a.spec.address) == (200, " Paris.")
    ready = [ev for where, ev in group.events if isinstance(ev, events.Ready)]
    assert [r.smoke.get("text") for r in ready] == [" Paris."]  # what proved it, as said: rank 0's answer
    assert health(b.spec.address) == 200  # the other rank answers /health only
    assert ask(b.spec.address)[0] == 404
    for rank, name in enumerate(("node-a", "node-b")):
        st = group.state(name)
        assert st["status"] == "ready"
        assert st["group"] == {"hosts": ["node-a", "node-b"], "dist_port": 50000, "rank": rank}
        argv = st["plan"]["argv"]
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--dist-init-addr") + 1] == f"{a.spec.address}:50000"  # the same for all
        assert argv[argv.index("--tp-size") + 1] == "4"  # over both hosts' GPUs
        env = {e["name"]: e["value"] for e in st["plan"]["env"]}
        host = group.hosts[name]
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == host.interface
        assert env["SGLANG_HOST_IP"] == host.spec.address
    assert 50000 in group.state("node-a")["ports"]  # rank 0's meeting port is fleet's, checked like HTTP
    from fleet.control.gather import read_facts

    b_host = group.hosts["node-b"]
    (row,) = status_rows(b_host.host, read_facts(b_host.transport(), b_host.host))
    assert row["status"] == "ready" and row["group"] == "rank 1 of 2 (node-a, node-b)"
    log = Path(group.state("node-b")["log"]).read_text()
    assert "TP2] Init torch distributed begin." in log and "TP3] Init torch distributed begin." in log
    assert "TP0]" not in log and "TP1]" not in log  # node-b holds global ranks 2 and 3


def test_a_rank_lost_after_the_meeting_brings_the_group_down_and_it_is_relaunched_whole(
    group: Group, tmp_path: Path
) -> None:
    marker = group.hosts["node-b"].dir / "dies-once"
    marker.write_text("")
    simhost.set_host(group.hosts["node-b"].dir, rank_dies_once=str(marker))
    result = group.run().deploy()
    assert result.ok, result.reason
    assert len(result.attempts) == 2
    first = result.attempts[0]
    assert first.outcome == "crashed" and first.diagnosis is not None
    assert any("whole group is relaunched" in str(ev) for _, ev in group.events)
    assert group.state("node-a")["status"] == group.state("node-b")["status"] == "ready"
    assert ask(group.hosts["node-a"].spec.address) == (200, " Paris.")
    # one engine per host: the first attempt's rank 0 was stopped, not left waiting for its lost peer
    assert len(group.engines("node-a")) == 1 and len(group.engines("node-b")) == 1


def test_a_rank_that_fails_every_time_is_given_up_with_its_diagnosis_and_no_rank_left_running(group: Group) -> None:
    simhost.set_host(
        group.hosts["node-b"].dir, inject_scheduler_error="RuntimeError: CUDA error: an illegal memory access"
    )
    result = group.run().deploy()
    assert not result.ok
    assert result.failed_rank is not None and result.failed_rank.host == "node-b"
    assert "rank 1 (node-b)" in result.reason
    assert group.engines("node-a") == [] and group.engines("node-b") == []  # never half a group
    assert group.state("node-a")["status"] == group.state("node-b")["status"] == "failed"


def test_a_firewall_between_the_nodes_is_found_before_anything_is_stopped(group: Group) -> None:
    assert group.run().deploy().ok
    before = group.engines("node-a") + group.engines("node-b")
    group.hosts["node-a"].block_port(50000)  # rank 0's meeting port, dropped silently
    with pytest.raises(PreflightError) as err:
        group.run().deploy()
    assert "node-b cannot reach rank 0" in err.value.message and "timeout" in err.value.message
    assert group.engines("node-a") + group.engines("node-b") == before  # the running group serves on


def test_nodes_with_different_engine_versions_are_refused(group: Group) -> None:
    simhost.set_host(group.hosts["node-b"].dir, sglang_version="0.5.23")
    with pytest.raises(PreflightError) as err:
        group.run().deploy()
    assert "different sglang versions" in err.value.message
    assert "node-a 0.5.11" in err.value.message and "node-b 0.5.23" in err.value.message


def test_a_gpu_holder_fleet_will_not_kill_on_one_node_stops_the_ranks_launched_elsewhere(group: Group) -> None:
    b = group.hosts["node-b"]
    # a process of the host (not an engine) holding a GPU: fleet refuses to kill it under the safe policy
    b.shell(f"setsid sh -c 'exec sleep 300 3<{b.dir}/dev/nvidia1' </dev/null >/dev/null 2>&1 &")
    time.sleep(0.3)
    with pytest.raises(UnsafeToKill):
        group.run().deploy()
    assert group.engines("node-a") == []  # rank 0 was launched, then stopped: no half group waits
    assert b.shell("pgrep -f 'sleep 300'").strip()  # and the holder lives


def test_stop_stops_every_rank(group: Group) -> None:
    assert group.run().deploy().ok
    answers = stop_group(group.run())
    assert [host for host, _ in answers] == ["node-a", "node-b"]
    assert group.engines("node-a") == [] and group.engines("node-b") == []


# --- the simulated engine's meeting on its own: torch's own lines, named by the knowledge base ----------


def launch(h: nshost.NamespaceHost, rank: int, rank0: str, timeout: int = 300) -> None:
    h.shell(
        f"cd {h.dir} && nohup env/bin/python -m sglang.launch_server --model-path {h.dir}/models/Qwen3.6-27B "
        f"--tp-size 4 --nnodes 2 --node-rank {rank} --dist-init-addr {rank0}:50000 --host {h.spec.address} "
        f"--port 30000 --dist-timeout {timeout} > {h.dir}/engine.log 2>&1 &"
    )


def engine_log(h: nshost.NamespaceHost, wait_for: str, within_s: float = 20) -> list[str]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = (h.dir / "engine.log").read_text() if (h.dir / "engine.log").exists() else ""
        if wait_for in text:
            return text.splitlines()
        time.sleep(0.2)
    raise AssertionError(f"{wait_for!r} not in {h.spec.name}'s log: {text[-2000:]}")


CONTEXT = LogContext(engine="sglang", version=(0, 5, 11), hybrid=True, nvfp4=False, moe=False, sm=86, argv=())


def test_a_blocked_port_times_out_on_both_sides_with_torchs_lines(group: Group) -> None:
    a, b = group.hosts["node-a"], group.hosts["node-b"]
    a.block_port(50000)
    launch(a, 0, a.spec.address)
    launch(b, 1, a.spec.address)
    rank0 = engine_log(a, "clients joined")
    rank1 = engine_log(b, "while trying to connect to")
    assert diagnose(rank0, CONTEXT).signature == "multinode-peer-never-joined"
    assert diagnose(rank1, CONTEXT).signature == "multinode-rank0-unreachable"


def test_a_missing_interface_is_gloos_error_and_the_peer_left_behind_hits_ncclls_watchdog(group: Group) -> None:
    a, b = group.hosts["node-a"], group.hosts["node-b"]
    launch(a, 0, a.spec.address)
    b.shell(
        f"cd {b.dir} && GLOO_SOCKET_IFNAME=eth9 nohup env/bin/python -m sglang.launch_server --model-path "
        f"{b.dir}/models/Qwen3.6-27B --tp-size 4 --nnodes 2 --node-rank 1 --dist-init-addr {a.spec.address}:50000 "
        f"--host {b.spec.address} --port 30000 > {b.dir}/engine.log 2>&1 &"
    )
    rank1 = engine_log(b, "Unable to find address for: eth9")
    assert diagnose(rank1, CONTEXT).signature == "multinode-socket-interface-missing"
    rank0 = engine_log(a, "Watchdog caught collective operation timeout")  # its peer went away after meeting
    assert diagnose(rank0, CONTEXT).signature == "nccl-collective-watchdog"


def test_health_sees_the_group_down_when_one_rank_is_gone_and_heal_relaunches_it_whole(group: Group) -> None:
    run = group.run()
    assert run.deploy().ok
    healthy = group_health(run, heal=False)
    assert healthy is not None and healthy.status == "ok"
    (rank1,) = group.engines("node-b")
    group.hosts["node-b"].shell(f"kill -9 {rank1}")
    time.sleep(0.5)
    # rank 0 still answers /health here (its collectives would hang): the group is down all the same
    assert health(group.hosts["node-a"].spec.address) == 200
    down = group_health(run, heal=False)
    assert down is not None and down.status == "critical"
    assert any(c.name == "rank1" and c.status == "critical" for c in down.checks)
    healed = group_health(run, heal=True)
    assert healed is not None and healed.status == "ok" and "relaunched the group whole" in str(healed.heal)
    assert group.engines("node-b") and group.engines("node-b") != [rank1]
    assert ask(group.hosts["node-a"].spec.address) == (200, " Paris.")


def test_a_group_never_deployed_or_stopped_is_not_checked(group: Group) -> None:
    assert group_health(group.run(), heal=False) is None
    assert group.run().deploy().ok
    stop_group(group.run())
    assert group_health(group.run(), heal=True) is None  # stopped on purpose: nothing to heal


def test_one_rank_is_never_restarted_alone(group: Group) -> None:
    from fleet.control import ops
    from fleet.errors import ConfigError

    assert group.run().deploy().ok
    b = group.hosts["node-b"]
    with pytest.raises(ConfigError) as err:
        ops.restart(b.transport(), b.host, force=False, progress=events.ignore, name="group")
    assert "rank 1 of a group over node-a, node-b" in err.value.message and "fleet deploy group" in err.value.hint


def test_the_plan_of_a_group_shows_every_ranks_command_and_changes_nothing(group: Group) -> None:
    results, problems = group.run().plan()
    assert problems == []
    assert [r.plan.flag("--node-rank").value for r in results if r.plan] == ["0", "1"]  # type: ignore[union-attr]
    assert group.engines("node-a") == [] and group.state("node-a") == {}


def test_without_network_interface_each_node_gets_the_interface_its_route_to_rank_0_takes(group: Group) -> None:
    import msgspec

    for name, h in group.hosts.items():  # the inventory says nothing of interfaces
        settings = msgspec.structs.replace(h.host.settings, network_interface=None)
        group.inventory.hosts[name] = replace(h.host, settings=settings)
    results, problems = group.run().plan()
    assert problems == []
    for name, r in zip(("node-a", "node-b"), results, strict=True):
        assert r.plan is not None
        env = {e.name: e for e in r.plan.env}
        assert env["GLOO_SOCKET_IFNAME"].value == group.hosts[name].interface  # the bridge's, not lo
        assert "route to rank 0" in env["GLOO_SOCKET_IFNAME"].reason


class FailingTransport:
    """A host's transport whose `n`th command (run or stream) fails as a dropped connection does."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n, self.calls = inner, n, 0
        self.host_name = inner.host_name

    def _count(self) -> None:
        from fleet.errors import HostUnreachable

        self.calls += 1
        if self.calls == self.n:
            raise HostUnreachable(f"{self.host_name}: the connection dropped (cut by the test).", "")

    def run(self, script: str, **kw: Any) -> Any:
        self._count()
        return self.inner.run(script, **kw)

    def stream(self, *a: Any, **kw: Any) -> Any:
        self._count()
        return self.inner.stream(*a, **kw)

    @property
    def commands_run(self) -> int:
        return int(self.inner.commands_run)

    def close(self) -> None:
        pass


def test_a_rank_0_lost_at_launch_stops_the_rank_launched_elsewhere_and_frees_its_lock(group: Group) -> None:
    from contextlib import nullcontext

    from fleet.errors import HostUnreachable

    first = {"node-a": True}

    def connect(host: Any) -> Any:
        t = group.hosts[host.name].transport()
        if host.name == "node-a" and first.pop("node-a", False):  # facts (1), prepare (2), launch (3)
            return nullcontext(FailingTransport(t, 3))
        return nullcontext(t)

    run = group.run()
    run.connect = connect
    with pytest.raises(HostUnreachable):
        run.deploy()
    assert group.engines("node-a") == [] and group.engines("node-b") == []  # never half a group
    lock = group.hosts["node-b"].dir / "state" / "deployments" / "group" / "lock.json"
    assert not lock.exists()
    # where the launch failed, an old rank may run: it is stopped too, and recorded so (never "starting")
    assert group.state("node-a").get("status") in (None, "stopped")


def test_a_redeploy_the_engine_rejects_leaves_the_running_group_serving(group: Group) -> None:
    assert group.run().deploy().ok
    before = group.engines("node-a") + group.engines("node-b")
    group.playbook_path.write_text(PLAYBOOK + "extra_args: [--no-such-flag]\n")
    result = group.run().deploy()
    assert not result.ok and result.attempts[-1].outcome == "rejected"
    assert group.engines("node-a") + group.engines("node-b") == before  # nothing was stopped anywhere
    assert ask(group.hosts["node-a"].spec.address) == (200, " Paris.")
    assert group.state("node-a")["status"] == group.state("node-b")["status"] == "ready"


def test_a_group_playbook_is_never_deployed_on_one_host_alone(group: Group) -> None:
    from fleet.control import ops
    from fleet.errors import ConfigError

    a = group.hosts["node-a"]
    pb = load_playbook(str(group.playbook_path), ROOT)
    with pytest.raises(ConfigError) as err:
        ops.deploy(a.transport(), a.host, pb, force=False, engine_check=False, progress=events.ignore)
    assert "spread over its hosts" in err.value.message and group.engines("node-a") == []


def test_a_stop_while_the_group_is_being_proven_is_refused_on_every_host(group: Group) -> None:
    import threading

    from fleet.errors import DeployFailed

    simhost.set_host(group.hosts["node-a"].dir, generation_delay_s=4)  # rank 0's smoke answer takes a while
    results: list[Any] = []
    deploying = threading.Thread(target=lambda: results.append(group.run().deploy()))
    deploying.start()
    deadline = time.monotonic() + 60
    while group.state("node-b").get("status") != "ready" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert group.state("node-b").get("status") == "ready"  # rank 1 proven, rank 0 not yet
    with pytest.raises(DeployFailed) as err:
        stop_group(group.run())
    assert "node-a" in err.value.message and "node-b" in err.value.message and "locked" in err.value.message
    deploying.join(timeout=60)
    assert results and results[0].ok, results and results[0].reason
    assert group.engines("node-a") and group.engines("node-b")  # the stop touched neither rank


def test_ctrl_c_mid_deploy_ends_promptly_and_leaves_no_lock(group: Group) -> None:
    import os
    import signal
    import threading

    simhost.set_host(group.hosts["node-a"].dir, generation_delay_s=30)  # rank 0 would take a long while

    def interrupt_once_launched() -> None:
        deadline = time.monotonic() + 60
        while group.state("node-b").get("status") != "ready" and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_launched, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        group.run().deploy()
    assert time.monotonic() - started < 45  # not the 30 s smoke answer plus every watcher's timeout
    deadline = time.monotonic() + 15
    locks = [group.hosts[n].dir / "state" / "deployments" / "group" / "lock.json" for n in group.hosts]
    while any(p.exists() for p in locks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(p.exists() for p in locks)  # nothing left locked: the next deploy or stop may run
    assert group.state("node-a")["status"] in ("unverified", "starting")  # never "ready": it was not proven


def lock_of(group: Group, name: str) -> dict[str, Any] | None:
    path = group.hosts[name].dir / "state" / "deployments" / "group" / "lock.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_a_prepared_host_stays_locked_while_a_slow_engine_check_runs_on_another(group: Group) -> None:
    import threading

    from fleet.errors import DeployFailed

    assert group.run().deploy().ok
    simhost.set_host(group.hosts["node-b"].dir, check_delay_s=10)  # node-b's engine check is slow (an import)
    results: list[Any] = []
    redeploy = threading.Thread(target=lambda: results.append(group.run().deploy()))
    redeploy.start()
    deadline = time.monotonic() + 10
    while not (lock_of(group, "node-a") and lock_of(group, "node-b")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(6.5)  # node-a was prepared long ago, past the 5 s a lock without its process is honoured
    with pytest.raises(DeployFailed) as err:
        stop_group(group.run())
    assert "node-a" in err.value.message and "node-b" in err.value.message  # refused on every host
    redeploy.join(timeout=120)
    assert results and results[0].ok, results and results[0].reason


def test_a_redeploy_whose_fixed_command_is_rejected_again_leaves_the_running_group_serving(group: Group) -> None:
    assert group.run().deploy().ok
    before = group.engines("node-a") + group.engines("node-b")
    group.playbook_path.write_text(  # a renamed flag (fixed by respelling), then incomplete EAGLE parameters
        PLAYBOOK + "max_attempts: 2\nextra_args: [--mamba-radix-cache-strategy, extra_buffer, "
        "--speculative-algorithm, EAGLE, --speculative-eagle-topk, '1']\n"
    )
    result = group.run().deploy()
    assert not result.ok and [a.outcome for a in result.attempts] == ["rejected", "rejected"]
    assert result.refused_before_stopping  # `fleet deploy` exits 4: a pre-flight refusal, nothing changed
    assert group.engines("node-a") + group.engines("node-b") == before
    assert ask(group.hosts["node-a"].spec.address) == (200, " Paris.")


def test_a_watcher_that_fails_unexpectedly_ends_the_deploy_instead_of_hanging_it(group: Group) -> None:
    import threading

    run = group.run()

    def progress_for(where: str) -> Any:
        def sink(ev: events.Event) -> None:
            if where == "node-b" and isinstance(ev, events.LogLine):
                raise BrokenPipeError(32, "Broken pipe")  # fleet's output closed (`fleet deploy ... | head`)

        return sink

    run.progress_for = progress_for
    results: list[Any] = []
    deploying = threading.Thread(target=lambda: results.append(run.deploy()), daemon=True)
    deploying.start()
    deploying.join(timeout=180)  # seconds alone; a loaded CI machine is slower, a hang never ends
    assert not deploying.is_alive() and results and not results[0].ok
    assert lock_of(group, "node-a") is None and lock_of(group, "node-b") is None


def test_a_watcher_still_silent_after_the_group_is_stopped_is_not_waited_for(
    group: Group, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from fleet.control import group as group_module

    monkeypatch.setattr(group_module, "SETTLE_S", 3.0)
    stuck = threading.Event()
    run = group.run()

    def progress_for(where: str) -> Any:
        def sink(ev: events.Event) -> None:
            if isinstance(ev, events.LogLine):
                if where == "node-a":
                    stuck.wait()  # rank 0's watcher never says another word (a host frozen mid-stream)
                else:
                    raise BrokenPipeError(32, "Broken pipe")

        return sink

    run.progress_for = progress_for
    results: list[Any] = []
    deploying = threading.Thread(target=lambda: results.append(run.deploy()), daemon=True)
    deploying.start()
    deploying.join(timeout=120)
    stuck.set()
    assert not deploying.is_alive() and results and not results[0].ok
    assert "node-b" in results[0].reason
    assert group.engines("node-a") == [] and group.engines("node-b") == []
    assert lock_of(group, "node-a") is None and lock_of(group, "node-b") is None
