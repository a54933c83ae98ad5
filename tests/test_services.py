"""Services: replicas of a playbook behind the real SGLang router (sglang-router 0.3.2, its Rust binary),
on simulated hosts in their own namespaces, through fleet's own deploy loop and router step. Requests
really go through the router to the simulated engines."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import pytest

from conftest import ROOT
from fleet import events
from fleet.control import ops
from fleet.control.service import ServiceRun
from fleet.control.service_health import service_down, service_health
from fleet.control.sweep import HealthOptions, check_host, heal_host
from fleet.errors import HostUnreachable, PreflightError
from fleet.inventory import Inventory, load_playbook
from fleet.inventory.services import load_service
from fleet_testbed import nshost, simhost
from simengine import RequestLoop

pytestmark = [
    pytest.mark.skipif(not nshost.available(), reason="needs root, unshare and nsenter"),
    pytest.mark.slow,  # real routers and simulated engines, about a minute in all
]

sglang_router = pytest.importorskip("sglang_router", reason="the real router: pip install sglang-router")


class Fleet:
    """Simulated 2-GPU hosts (node-a, node-b) and one service file; the router runs on node-a."""

    def __init__(self, root: Path, replicas: int = 2) -> None:
        self.root = root
        self.hosts = {
            name: nshost.NamespaceHost(root, replace(simhost.CT129, name=name), nshost.loopback_address())
            for name in ("node-a", "node-b")
        }
        self.inventory = Inventory(root / "inventory.yaml", {n: h.host for n, h in self.hosts.items()}, {})
        self.router_port = 31000 + (hash(root) % 2000)
        listed = "".join(f"  - host: node-{'ab'[i % 2]}\n" for i in range(replicas))
        self.services = root / "services"
        self.services.mkdir()
        (self.services / "qwen36.yaml").write_text(
            f"playbook: qwen36-27b\nreplicas:\n{listed}router:\n  host: node-a\n  port: {self.router_port}\n"
            "  policy: round_robin\ndrain_s: 10\n"
        )
        self.events: list[events.Event] = []
        self.unreachable: set[str] = set()  # hosts fleet cannot connect to

    @contextmanager
    def connect(self, host: Any) -> Iterator[Any]:
        if host.name in self.unreachable:
            raise HostUnreachable(f"{host.name}: unreachable (the test cut it off).", "")
        yield self.hosts[host.name].transport()

    def run(self, playbook: str = "qwen36-27b", services: Path | None = None) -> ServiceRun:
        svc = load_service("qwen36", services or self.services)
        pb = load_playbook(playbook, ROOT / "playbooks") if "/" not in playbook else load_playbook(playbook, ROOT)
        return ServiceRun(svc, self.inventory, pb, self.connect, lambda where: self.events.append)

    @property
    def router_url(self) -> str:
        return f"http://{self.hosts['node-a'].spec.address}:{self.router_port}"

    def ask(self, timeout: float = 30.0) -> str:
        body = json.dumps(
            {"model": "qwen36", "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        ).encode()
        request = urllib.request.Request(
            self.router_url + "/v1/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return str(json.loads(r.read())["choices"][0]["message"]["content"])

    def workers(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.router_url + "/workers", timeout=10) as r:
            return list(json.loads(r.read())["workers"])

    def record(self, host: str, deployment: str) -> dict[str, Any]:
        return json.loads(simhost.record(self.hosts[host].dir, "state.json", deployment).read_text())

    def url_of_b(self) -> str:
        return f"http://{self.hosts['node-b'].spec.address}:30000"

    def close(self) -> None:
        for h in self.hosts.values():
            h.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    yield f
    f.close()


def request_loop(fleet: Fleet) -> RequestLoop:
    """Requests through the router until the block ends; each must be answered "Paris"."""
    return RequestLoop(lambda: None if "Paris" in fleet.ask() else "wrong answer")


def roll_under_requests(fleet: Fleet) -> tuple[Any, RequestLoop]:
    """A rolling restart with requests going through the router from a second before it to a second after."""
    with request_loop(fleet) as loop:
        time.sleep(1)
        result = fleet.run().roll()
        time.sleep(1)
    return result, loop


def test_up_deploys_every_replica_registers_them_and_proves_a_request_through_the_router(fleet: Fleet) -> None:
    result = fleet.run().up()
    assert result.ok, result.reason
    assert [o.name for o in result.replicas] == ["node-a/qwen36-1", "node-b/qwen36-2"]
    assert result.answer and result.answer["ok"]
    urls = {w["url"] for w in fleet.workers()}
    assert urls == {o.url for o in result.replicas}
    assert all(w["is_healthy"] for w in fleet.workers())
    assert "Paris" in fleet.ask()
    # a second `up` leaves everything as it is: the replicas are adopted, the router kept
    pids = {o.name: fleet.record(*o.name.split("/"))["pid"] for o in result.replicas}
    again = fleet.run().up()
    assert again.ok and all(o.result and o.result.adopted for o in again.replicas)
    assert {o.name: fleet.record(*o.name.split("/"))["pid"] for o in again.replicas} == pids
    said = [e.what for e in fleet.events if isinstance(e, events.ServiceStep)]
    assert any(w.startswith("router started") for w in said) and any(w.startswith("router running") for w in said)


def test_rolling_restart_drops_no_request_and_replaces_every_replica(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    before = {n: fleet.record(n, f"qwen36-{i}")["pid"] for i, n in ((1, "node-a"), (2, "node-b"))}
    result, loop = roll_under_requests(fleet)
    assert result.ok, result.reason
    assert loop.failures == [], loop.failures[:5]
    assert loop.answered > 10
    after = {n: fleet.record(n, f"qwen36-{i}")["pid"] for i, n in ((1, "node-a"), (2, "node-b"))}
    assert all(after[n] != before[n] for n in before)
    assert len(fleet.workers()) == 2


def test_an_engine_upgrade_goes_through_a_roll_and_every_replica_then_runs_the_new_version(fleet: Fleet) -> None:
    """Both hosts run fleet's own environments (`engines: {sglang: fleet}`), 0.5.11 current and 0.5.23
    installed beside it; `fleet engine use` then a roll moves every replica, with no request dropped."""
    import msgspec

    from fleet.control.engines import engine_step
    from fleet.inventory.hosts import managed_python

    hosts = {}
    for name, h in fleet.hosts.items():
        for version in ("0.5.11", "0.5.23"):
            simhost.engine_env(h.dir, version)
        current = managed_python(h.host.settings.state_dir, "sglang", None)  # what `sglang: fleet` loads as
        h.host = replace(h.host, settings=msgspec.structs.replace(h.host.settings, engines={"sglang": current}))
        assert engine_step(h.transport(), h.host, "use", "sglang==0.5.11")["e"] == "current"
        hosts[name] = h.host
    fleet.inventory = Inventory(fleet.root / "inventory.yaml", hosts, {})

    def versions() -> dict[str, tuple[str, str]]:
        plans = {n: fleet.record(n, f"qwen36-{i}")["plan"] for i, n in ((1, "node-a"), (2, "node-b"))}
        return {n: (p["engine_version"], Path(p["argv"][0]).parent.parent.name) for n, p in plans.items()}

    assert fleet.run().up().ok
    assert versions() == {n: ("0.5.11", "sglang-0.5.11") for n in fleet.hosts}
    for h in fleet.hosts.values():
        assert engine_step(h.transport(), h.host, "use", "sglang==0.5.23")["e"] == "current"
    result, loop = roll_under_requests(fleet)
    assert result.ok, result.reason
    assert loop.failures == [], loop.failures[:5]
    assert versions() == {n: ("0.5.23", "sglang-0.5.23") for n in fleet.hosts}
    assert "Paris" in fleet.ask()


def test_a_replica_whose_new_plan_crashes_stops_the_roll_and_rollback_restores_it(fleet: Fleet, tmp_path: Path) -> None:
    assert fleet.run().up().ok
    changed = tmp_path / "qwen36-27b.yaml"
    changed.write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + "context_length: 8192\n")
    simhost.set_host(fleet.hosts["node-b"].dir, inject_scheduler_error="RuntimeError: fleet has never seen this")
    with request_loop(fleet) as loop:
        result = fleet.run(str(changed)).roll()
        time.sleep(1)
    assert not result.ok
    assert [o.ok for o in result.replicas] == [True, False]  # node-a rolled; node-b failed and the roll stopped
    assert "failed" in result.reason
    assert loop.failures == [], loop.failures[:5]  # node-a served throughout
    assert [w["url"] for w in fleet.workers()] == [result.replicas[0].url]
    assert "--context-length" in fleet.record("node-a", "qwen36-1")["plan"]["argv"]
    simhost.set_host(fleet.hosts["node-b"].dir, inject_scheduler_error=None)
    back = fleet.run(str(changed)).roll(rollback=True)
    assert back.ok, back.reason
    assert [o.name for o in back.replicas] == ["node-b/qwen36-2"]  # only the replica that was not serving
    assert "--context-length" not in fleet.record("node-b", "qwen36-2")["plan"]["argv"]  # its last good plan
    assert len(fleet.workers()) == 2


def test_a_replica_killed_behind_the_routers_back_is_noticed_and_healed(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    b = fleet.hosts["node-b"]
    pid = fleet.record("node-b", "qwen36-2")["pid"]
    b.shell(f"python3 -c 'import os, signal; os.killpg({pid}, signal.SIGKILL)'")
    time.sleep(1)
    h = service_health(fleet.run(), heal=False)
    assert h.status == "warning"  # one of two serves: at least min_healthy (1)
    assert any(c.name == "replica" and "node-b/qwen36-2" in c.detail for c in h.checks)
    options = HealthOptions(heal=True)
    host = check_host(b.transport(), b.host, options)
    assert "qwen36-2" in host.healable
    heal_host(
        b.transport(),
        b.host,
        host,
        options,
        lambda name: ops.restart(b.transport(), b.host, force=False, progress=events.ignore, name=name),
    )
    healed = service_health(fleet.run(), heal=True)
    assert healed.status == "ok", [c for c in healed.checks if c.status != "ok"]
    assert len(fleet.workers()) == 2 and "Paris" in fleet.ask()


def test_the_last_serving_replica_is_never_taken_out(tmp_path: Path) -> None:
    f = Fleet(tmp_path, replicas=1)
    try:
        assert f.run().up().ok
        pid = f.record("node-a", "qwen36-1")["pid"]
        result = f.run().roll()
        assert not result.ok and "no serving replica" in result.reason
        assert f.record("node-a", "qwen36-1")["pid"] == pid  # nothing was restarted
        assert len(f.workers()) == 1 and "Paris" in f.ask()
    finally:
        f.close()


def test_a_router_port_held_by_another_process_refuses_before_any_replica_is_deployed(fleet: Fleet) -> None:
    a = fleet.hosts["node-a"]
    a.shell(f"setsid python3 -m http.server {fleet.router_port} --bind {a.spec.address} >/dev/null 2>&1 &")
    time.sleep(1)
    with pytest.raises(PreflightError, match=f"port {fleet.router_port} is in use"):
        fleet.run().up()
    assert not (a.dir / "state" / "deployments" / "qwen36-1").exists()


def router_pid(fleet: Fleet) -> int:
    return int(json.loads((fleet.hosts["node-a"].dir / "state/services/qwen36/router.json").read_text())["pid"])


def said(fleet: Fleet) -> list[str]:
    return [e.what for e in fleet.events if isinstance(e, events.ServiceStep)]


def test_a_router_change_whose_new_port_is_taken_leaves_the_running_router_serving(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    a, pid = fleet.hosts["node-a"], router_pid(fleet)
    taken = fleet.router_port + 1
    a.shell(f"setsid python3 -m http.server {taken} --bind {a.spec.address} >/dev/null 2>&1 &")
    time.sleep(1)
    path = fleet.services / "qwen36.yaml"
    path.write_text(
        path.read_text().replace("  policy: round_robin\n", f"  policy: round_robin\n  metrics_port: {taken}\n")
    )
    with pytest.raises(PreflightError, match=f"metrics_port {taken} is in use") as err:
        fleet.run().up()
    assert "metrics_port" in err.value.hint
    assert router_pid(fleet) == pid and "Paris" in fleet.ask()  # nothing was changed


def test_up_after_a_playbook_change_leaves_serving_replicas_for_the_roll(fleet: Fleet, tmp_path: Path) -> None:
    assert fleet.run().up().ok
    pids = [fleet.record("node-a", "qwen36-1")["pid"], fleet.record("node-b", "qwen36-2")["pid"]]
    changed = tmp_path / "qwen36-27b.yaml"
    changed.write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + "context_length: 8192\n")
    with request_loop(fleet) as loop:
        result = fleet.run(str(changed)).up()
    assert not result.ok
    assert all(o.error and "serves another plan" in str(o.error) for o in result.replicas)
    assert [fleet.record("node-a", "qwen36-1")["pid"], fleet.record("node-b", "qwen36-2")["pid"]] == pids
    assert loop.failures == [] and len(fleet.workers()) == 2


def test_a_roll_uses_the_running_router_even_when_its_options_changed(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    pid = router_pid(fleet)
    path = fleet.services / "qwen36.yaml"
    path.write_text(path.read_text().replace("policy: round_robin", "policy: cache_aware"))
    with request_loop(fleet) as loop:
        assert fleet.run().roll().ok
    assert router_pid(fleet) == pid and loop.failures == []
    assert any("router options changed" in w and "fleet up qwen36" in w for w in said(fleet))


def test_up_keeps_the_worker_of_a_replica_whose_host_it_cannot_reach(fleet: Fleet) -> None:
    first = fleet.run().up()
    fleet.unreachable.add("node-b")
    again = fleet.run().up()
    assert not again.ok and isinstance(again.replicas[1].error, HostUnreachable)
    assert {w["url"] for w in fleet.workers()} == {o.url for o in first.replicas}  # node-b still serves


def test_another_service_file_of_the_same_name_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    assert fleet.run().up().ok
    pid = router_pid(fleet)
    other = tmp_path / "staging"
    other.mkdir()
    (other / "qwen36.yaml").write_text(
        (fleet.services / "qwen36.yaml").read_text().replace(str(fleet.router_port), str(fleet.router_port + 5))
    )
    with pytest.raises(PreflightError, match="was started from") as err:
        fleet.run(services=other).up()
    assert "Two service files are named qwen36" in err.value.hint
    with pytest.raises(PreflightError, match="was started from"):
        service_down(fleet.run(services=other))
    assert router_pid(fleet) == pid and "Paris" in fleet.ask()


def test_rollback_refuses_a_good_record_from_another_host(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    simhost.set_host(fleet.hosts["node-b"].dir, inject_scheduler_error="RuntimeError: fleet has never seen this")
    assert not fleet.run().roll().ok
    path = fleet.services / "qwen36.yaml"
    path.write_text(path.read_text().replace("  - host: node-b\n", "  - host: node-a\n"))
    back = fleet.run().roll(rollback=True)
    assert not back.ok and "its last good record is from host node-b, not node-a" in back.reason


def test_a_roll_interrupted_mid_replica_registers_a_still_serving_replica_again(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fleet.run().up().ok

    def interrupted(self: ServiceRun, r: Any, good: Any) -> Any:
        raise KeyboardInterrupt  # Ctrl-C after the replica left the router, before it was redeployed

    monkeypatch.setattr(ServiceRun, "_redeploy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fleet.run().roll()
    assert len(fleet.workers()) == 2  # its old server still serves, and is back in the router
    assert any("registered again" in w for w in said(fleet))


def test_a_roll_redeploys_replicas_that_do_not_serve_first(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    pid = fleet.record("node-b", "qwen36-2")["pid"]
    fleet.hosts["node-b"].shell(f"python3 -c 'import os, signal; os.killpg({pid}, signal.SIGKILL)'")
    time.sleep(1)
    result = fleet.run().roll()
    assert result.ok, result.reason
    assert [o.name for o in result.replicas] == ["node-b/qwen36-2", "node-a/qwen36-1"]


def test_a_roll_does_not_take_out_a_replica_while_the_router_holds_the_others_circuit_open(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    simhost.set_host(fleet.hosts["node-b"].dir, generation_http_500=True)
    for _ in range(30):  # the router retries each on node-a; node-b's circuit opens after ten failures
        assert "Paris" in fleet.ask()
    run = fleet.run()
    run.circuit_wait_s = 2
    # node-b does not serve (its circuit is open): the roll redeploys it first, and its new start fails too
    result = run.roll()
    assert not result.ok and (result.reason or "").startswith("node-b/qwen36-2 failed"), result
    assert "Paris" in fleet.ask()  # node-a, the one serving, was never taken out
    # and the router step itself refuses to take out the last replica it sends requests to
    with run.session() as rt:
        url_a = f"http://{fleet.hosts['node-a'].spec.address}:30000"
        take_out = {"do": "remove", "url": url_a, "keep_one_healthy": True, "circuit_wait_s": 2}
        refused = run.router(rt, take_out)[-1].get("refused")
    assert refused and "taking " + url_a + " out would leave it nothing to send requests to" in refused
    assert url_a in [w["url"] for w in fleet.workers()] and "Paris" in fleet.ask()


def test_status_and_health_say_a_replica_whose_circuit_is_open_does_not_serve(fleet: Fleet) -> None:
    """`fleet status` said "2/2 serving" while the router refused node-b every request (its circuit open),
    reading /workers' is_healthy only; health and the roll read the circuit. One truth now: the router
    step's workers carry the circuit, and a replica serves only with it closed (issue 38, 39)."""
    assert fleet.run().up().ok
    simhost.set_host(fleet.hosts["node-b"].dir, generation_http_500=True)
    for _ in range(30):  # node-b fails; its circuit opens after ten failures (the router retries on node-a)
        assert "Paris" in fleet.ask()
    run = fleet.run()
    with run.session() as rt:
        states = {s.replica: s for s in run.states(rt)[0]}
    b = states["node-b/qwen36-2"]
    assert b.registered and b.circuit_open and not b.serving and b.in_router == "circuit open (requests refused)"
    assert states["node-a/qwen36-1"].serving
    health = service_health(run, heal=False, ask=False)
    assert health is not None
    said = {c.name: c.detail for c in health.checks if c.name == "replicas"}
    assert said["replicas"].startswith("1 of 2 serving")
    assert any("circuit open" in c.detail for c in health.checks if c.name == "replica")


def test_down_says_which_replica_it_could_not_stop(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    fleet.unreachable.add("node-b")
    done, failed = service_down(fleet.run())
    assert len(failed) == 1 and isinstance(failed[0], HostUnreachable)
    assert any(line.startswith("node-b/qwen36-2: NOT stopped") for line in done)


def test_down_stops_replicas_and_router_when_the_routers_workers_answer_is_nonsense(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet down` stopped at a router's malformed /workers answer and left the replicas and the router
    running (issue 39). The router's own answer is parsed by the host step (tested against a real HTTP
    server in test_router_workers_answers); here its refusal reaches `down`, which goes on."""
    from fleet.errors import DeployFailed

    assert fleet.run().up().ok
    real = ServiceRun.router

    def nonsense(self: ServiceRun, t: Any, *actions: dict[str, Any], timeout_s: float = 300.0) -> Any:
        if any(a.get("do") == "workers" for a in actions):
            raise DeployFailed(
                "node-a: the router of service qwen36: workers: the router's /workers answer has no "
                "list of workers: '{\"workers\": 5}'",
                "",
            )
        return real(self, t, *actions, timeout_s=timeout_s)

    monkeypatch.setattr(ServiceRun, "router", nonsense)
    done, failed = service_down(fleet.run())
    assert failed == []
    assert any(line.startswith("workers not deregistered") for line in done), done
    assert any(line.startswith("router stopped") for line in done), done
    for host, name in (("node-a", "qwen36-1"), ("node-b", "qwen36-2")):
        assert fleet.record(host, name)["status"] == "stopped"


def test_a_second_command_on_the_service_while_a_roll_runs_is_refused_and_heal_waits(fleet: Fleet) -> None:
    import threading

    from fleet.errors import LockedError

    assert fleet.run().up().ok
    lease = fleet.hosts["node-a"].dir / "state" / "services" / "qwen36" / "lease.json"
    rolled: list[Any] = []
    roll = threading.Thread(target=lambda: rolled.append(fleet.run().roll()))
    roll.start()
    deadline = time.monotonic() + 20
    while not lease.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lease.exists()
    with pytest.raises(LockedError) as err:
        fleet.run().up()
    assert "is running `restart` on it" in err.value.message
    healed = service_health(fleet.run(), heal=True)
    assert healed is not None and any("not healed: `restart`" in h for h in healed.heal)
    roll.join(timeout=120)
    assert rolled and rolled[0].ok, rolled and rolled[0].reason
    assert not lease.exists()  # released at the end


def test_a_lease_left_by_a_run_that_died_is_taken_over(fleet: Fleet) -> None:
    assert fleet.run().up().ok
    lease = fleet.hosts["node-a"].dir / "state" / "services" / "qwen36" / "lease.json"
    stale = time.time() - 120
    lease.write_text(
        json.dumps({"run_id": "gone", "owner": "someone", "command": "restart", "since": stale, "touched": stale})
    )
    assert fleet.run().up().ok
    assert not lease.exists()


def test_a_service_whose_every_replica_is_refused_before_anything_changed_exits_4(fleet: Fleet) -> None:
    """Issue #24: a service whose replicas pre-flight or the engine's own check refused exited 7, as if a
    deploy had failed; like a refused deploy it is a pre-flight refusal (exit 4), nothing launched."""
    from fleet.cli.services import print_service

    result = fleet.run("qwen35-nvfp4").up()  # NVFP4 on the A6000 replicas: SGLang 0.5.11 cannot run it
    assert not result.ok and result.refused, [str(o.error) for o in result.replicas]
    assert all(o.error is not None and o.error.exit_code == 4 for o in result.replicas)
    with pytest.raises(click.exceptions.Exit) as exc:
        print_service(result, as_json=True)
    assert exc.value.exit_code == 4
    for h in fleet.hosts.values():  # nothing launched, nothing recorded, on either host
        assert not any(simhost.record(h.dir, "state.json", d).exists() for d in ("qwen36-1", "qwen36-2"))


def test_a_replica_the_engine_refused_counts_as_refused_and_one_that_crashed_does_not() -> None:
    from fleet.control.outcomes import Attempt, DeployResult, ReplicaOutcome, ServiceResult
    from fleet.errors import DeployFailed
    from fleet.inventory.services import PlacedReplica

    def outcome(*outcomes: str) -> ReplicaOutcome:
        attempts = [Attempt(n, [], outcome=o) for n, o in enumerate(outcomes, 1)]
        replica = PlacedReplica(1, "node-a", "qwen36-1", None)
        return ReplicaOutcome(replica, result=DeployResult("node-a", "p", False, attempts, None))  # type: ignore[arg-type]

    refused = ServiceResult("s", False, "", "", [outcome("rejected", "rejected")])
    assert refused.refused
    assert not ServiceResult("s", False, "", "", [outcome("rejected"), outcome("rejected", "crashed")]).refused
    failed = ReplicaOutcome(PlacedReplica(1, "node-a", "qwen36-1", None), error=DeployFailed("x", ""))
    assert not ServiceResult("s", False, "", "", [failed]).refused
    assert not ServiceResult("s", False, "", "", []).refused


def test_a_deployment_of_its_own_under_a_replicas_name_is_neither_replaced_nor_stopped(fleet: Fleet) -> None:
    """An operator's `fleet deploy qwen36-27b --name qwen36-2` on node-b holds replica 2's name: the
    service refuses that replica, routes only to its own, and `down` leaves the operator's server serving."""
    b = fleet.hosts["node-b"]
    playbook = load_playbook("qwen36-27b", ROOT / "playbooks")
    alone = ops.deploy(
        b.transport(), b.host, playbook, force=False, engine_check=False, progress=events.ignore, name="qwen36-2"
    )
    assert alone.ok and fleet.record("node-b", "qwen36-2")["service"] == ""
    pid = fleet.record("node-b", "qwen36-2")["pid"]
    result = fleet.run().up()
    assert not result.ok and "1 of 2 replicas failed: node-b/qwen36-2" in result.reason
    assert "is a deployment of qwen36-27b alone, not a replica of service qwen36" in str(result.replicas[1].error)
    assert [w["url"] for w in fleet.workers()] != [] and fleet.url_of_b() not in [w["url"] for w in fleet.workers()]
    done, failed = service_down(fleet.run())
    assert failed == [] and any(line.startswith("node-b/qwen36-2: left as it is") for line in done), done
    after = fleet.record("node-b", "qwen36-2")
    assert (
        after["status"] == "ready" and after["pid"] == pid and fleet.record("node-a", "qwen36-1")["status"] == "stopped"
    )
