"""The branches of a service (fleet.control.service.ServiceRun) against scripted hosts and a scripted
router (fleet_testbed.fakehost, fleet_testbed.fakerouter), in milliseconds: `up` registers exactly the
replicas that proved they answer, a roll takes one replica out at a time and stops at the first that
fails, the router's refusals and the service's lease change nothing, a rollback redeploys a replica's
last good record. The same service over simulated hosts and the real SGLang router, with requests going
through it, is in test_services.py; over real sshd in test_services_ssh.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from factsdata import RTX_A6000, facts
from fleet import events
from fleet.control.service import ServiceRun
from fleet.control.service_health import service_down, service_health
from fleet.control.status_rows import status_row
from fleet.errors import DeployFailed, HostUnreachable, LockedError, PreflightError
from fleet.health import CRITICAL, OK, WARNING
from fleet.inventory import Host, load_inventory, load_playbook
from fleet.inventory.services import load_service
from fleet.protocol import READY
from fleet_testbed.fakehost import ScriptedHost, Watch, crashes, ready
from fleet_testbed.fakerouter import ROUTER_PID, ScriptedRouter

INVENTORY = """\
hosts:
  node-a: {address: 10.0.0.1, engines: {sglang: /opt/sglang/.venv/bin/python}, models_dir: /models}
  node-b: {address: 10.0.0.2, engines: {sglang: /opt/sglang/.venv/bin/python}, models_dir: /models}
"""
SERVICE = """\
playbook: qwen36-27b
replicas:
  - host: node-a
  - host: node-b
router: {host: node-a, port: 30080, policy: round_robin}
drain_s: 5
"""
UNKNOWN_CRASH = "RuntimeError: a failure nobody has seen before"
A = "http://10.0.0.1:30000"
B = "http://10.0.0.2:30000"


class Service:
    """Two scripted 2-GPU hosts, one replica on each (qwen36-1 on node-a, qwen36-2 on node-b), the router
    on node-a."""

    def __init__(self, tmp_path: Path, service: str = SERVICE, gpus: int = 2) -> None:
        (tmp_path / "hosts.yaml").write_text(INVENTORY)
        (tmp_path / "services").mkdir()
        (tmp_path / "services" / "qwen36.yaml").write_text(service)
        self.inventory = load_inventory(tmp_path / "hosts.yaml")
        self.service = load_service("qwen36", tmp_path / "services")
        self.playbook = load_playbook("qwen36-27b", ROOT / "playbooks")
        self.hosts = {
            name: ScriptedHost(facts_found=facts(name, RTX_A6000, gpus, model=self.playbook.spec.model), host_name=name)
            for name in ("node-a", "node-b")
        }
        self.unreachable: set[str] = set()
        self.said: list[str] = []

    @property
    def router(self) -> ScriptedRouter:
        return self.hosts["node-a"].router_step

    def script(self, name: str, *watches: Watch) -> None:
        self.hosts[name].watches.extend(watches)

    def run(self) -> ServiceRun:
        @contextlib.contextmanager
        def connect(host: Host) -> Iterator[Any]:
            if host.name in self.unreachable:
                raise HostUnreachable(f"{host.name}: unreachable (the test cut it off).", "")
            yield self.hosts[host.name]

        def progress_for(where: str) -> events.Sink:
            def said(event: events.Event) -> None:
                if isinstance(event, events.ServiceStep):
                    self.said.append(event.what)

            return said

        return ServiceRun(self.service, self.inventory, self.playbook, connect, progress_for)

    def up(self, *watches_a: Watch) -> Any:
        self.script("node-a", *(watches_a or [ready()]))
        self.script("node-b", ready())
        return self.run().up()

    def urls(self) -> list[str]:
        return [w["url"] for w in self.router.workers]

    def serving_pid(self, name: str) -> int:
        return next(iter(self.hosts[name].servers))


@pytest.fixture
def svc(tmp_path: Path) -> Service:
    return Service(tmp_path)


def test_up_starts_the_router_deploys_each_replica_registers_them_and_proves_a_request(svc: Service) -> None:
    result = svc.up()
    assert result.ok, result.reason
    assert svc.urls() == [A, B]
    assert [o.name for o in result.replicas] == ["node-a/qwen36-1", "node-b/qwen36-2"]
    assert svc.router.did("ensure")[0]["replace"] is True
    assert len(svc.router.did("ask")) == 1
    for name, deployment in (("node-a", "qwen36-1"), ("node-b", "qwen36-2")):
        assert svc.hosts[name].records[deployment]["status"] == READY
    # each proven replica's record is kept as its last good one
    assert sorted(svc.router.kept) == ["qwen36-1", "qwen36-2"]
    assert svc.router.kept["qwen36-2"]["host"] == "node-b"
    assert svc.router.lease is None, "the service's lease is given back"


def test_up_registers_only_the_replicas_that_proved_they_answer(svc: Service) -> None:
    result = svc.up(crashes(UNKNOWN_CRASH))
    assert not result.ok and "1 of 2 replicas failed: node-a/qwen36-1" in result.reason
    assert svc.urls() == [B]
    assert sorted(svc.router.kept) == ["qwen36-2"]


def test_up_keeps_the_worker_of_a_replica_whose_host_it_could_not_reach(svc: Service) -> None:
    svc.router.running, svc.router.up, svc.router.argv = True, True, svc.run().argv
    svc.router.workers = [{"id": "w0", "url": B, "load": 0}, {"id": "w1", "url": "http://10.9.9.9:1", "load": 0}]
    svc.unreachable.add("node-b")
    svc.script("node-a", ready())
    result = svc.run().up()
    assert not result.ok and "node-b/qwen36-2" in result.reason
    # node-b's server may still serve: its worker stays; a worker that is no replica of the service goes
    assert sorted(svc.urls()) == [A, B]
    assert any("deregistered http://10.9.9.9:1" in s for s in svc.said)


def test_a_service_under_another_run_is_refused_and_nothing_is_deployed(svc: Service) -> None:
    svc.router.lease = {"run_id": "other", "owner": "op@elsewhere", "command": "restart"}
    with pytest.raises(LockedError, match="op@elsewhere is running `restart`"):
        svc.run().up()
    assert svc.router.did("ensure") == [] and svc.hosts["node-b"].acts == []
    assert svc.router.lease["run_id"] == "other", "another run's lease is left as it was"


def test_a_router_started_from_another_service_file_is_refused_before_any_replica(svc: Service) -> None:
    svc.router.fail["ensure"] = {"error": "the router of qwen36 runs from another file", "foreign": "/srv/q.yaml"}
    with pytest.raises(PreflightError, match="Two service files are named qwen36"):
        svc.run().up()
    assert svc.hosts["node-a"].acts == [] and svc.hosts["node-b"].acts == []
    assert svc.router.lease is None


def test_a_router_that_cannot_start_says_whether_sglang_router_is_missing(svc: Service) -> None:
    svc.router.fail["ensure"] = {"error": "the router exited", "log_tail": ["No module named sglang_router"]}
    with pytest.raises(DeployFailed) as caught:
        svc.run().up()
    assert "pip install sglang-router" in caught.value.hint


def test_a_request_through_the_router_answering_wrong_fails_the_up(svc: Service) -> None:
    svc.router.answers.append({"ok": False, "status": 200, "text": "no idea"})
    result = svc.up()
    assert not result.ok and "did not answer as expected: no idea" in result.reason
    assert svc.urls() == [A, B], "the replicas proved themselves; they stay registered"


def test_a_roll_takes_each_replica_out_redeploys_it_and_puts_it_back_in_turn(svc: Service) -> None:
    assert svc.up().ok
    before = {n: svc.serving_pid(n) for n in svc.hosts}
    svc.script("node-a", ready())
    svc.script("node-b", ready())
    result = svc.run().roll()
    assert result.ok, result.reason
    order = [(a["do"], a.get("url")) for a in svc.router.asked if a["do"] in ("add", "remove")][-4:]
    assert order == [("remove", A), ("add", A), ("remove", B), ("add", B)]
    for name in svc.hosts:
        assert svc.serving_pid(name) != before[name], "each replica runs a new server"
    # the roll is a relaunch: the server of the same plan is not adopted
    assert svc.hosts["node-a"].launches[-1] == svc.hosts["node-a"].launches[0]


def test_a_roll_stops_at_the_first_replica_that_fails_and_the_others_keep_serving(svc: Service) -> None:
    assert svc.up().ok
    svc.router.kept.clear()  # what `up` kept: the roll keeps the serving record itself as it takes it out
    svc.script("node-a", crashes(UNKNOWN_CRASH))
    result = svc.run().roll()
    assert not result.ok and "node-a/qwen36-1 failed; the roll stopped" in result.reason
    assert svc.urls() == [B], "node-b was never taken out"
    assert [o.name for o in result.replicas] == ["node-a/qwen36-1"]
    assert svc.router.kept["qwen36-1"]["good"]["status"] == READY, "its last good record is kept"


def test_a_roll_never_takes_out_the_last_serving_replica(tmp_path: Path) -> None:
    svc = Service(tmp_path, SERVICE.replace("  - host: node-b\n", ""))
    svc.script("node-a", ready())
    assert svc.run().up().ok
    launched = len(svc.hosts["node-a"].launches)
    result = svc.run().roll()
    assert not result.ok and "taking node-a/qwen36-1 out would leave the router no serving replica" in result.reason
    assert svc.router.did("remove") == [] and svc.urls() == [A]
    assert len(svc.hosts["node-a"].launches) == launched


def test_a_router_refusal_at_the_moment_of_removal_leaves_the_replica_serving(svc: Service) -> None:
    assert svc.up().ok
    launched = len(svc.hosts["node-a"].launches)
    svc.router.fail["remove"] = {"refused": "the router has no other healthy worker"}
    result = svc.run().roll()
    assert not result.ok and "no other healthy worker" in result.reason
    assert len(svc.hosts["node-a"].launches) == launched and svc.urls() == [A, B]


def test_a_new_router_is_given_the_ready_replicas_before_the_roll_starts(svc: Service) -> None:
    assert svc.up().ok
    svc.router.running, svc.router.workers = False, []  # the router died and fleet starts a new one
    svc.script("node-a", ready())
    svc.script("node-b", ready())
    assert svc.run().roll().ok
    adds = [a["url"] for a in svc.router.did("add")][-4:]
    assert adds[:2] == [A, B], "both registered again before either was taken out"
    assert svc.urls() == [A, B]


def test_a_rollback_with_every_replica_serving_changes_nothing(svc: Service) -> None:
    assert svc.up().ok
    acts = len(svc.hosts["node-a"].acts)
    result = svc.run().roll(rollback=True)
    assert result.ok and "nothing to roll back" in result.reason
    assert len(svc.hosts["node-a"].acts) == acts


def test_a_rollback_redeploys_a_failed_replica_from_its_last_good_record(svc: Service) -> None:
    assert svc.up().ok
    svc.script("node-a", crashes(UNKNOWN_CRASH))
    assert not svc.run().roll().ok
    # the last good record ran another plan than the playbook gives now: the rollback runs that one
    good = svc.router.kept["qwen36-1"]["good"]
    steps = next(f for f in good["plan"]["flags"] if f["flag"] == "--speculative-num-steps")
    steps["value"] = "3"
    svc.script("node-a", ready())
    result = svc.run().roll(rollback=True)
    assert result.ok, result.reason
    assert svc.urls() == [B, A]
    launched = svc.hosts["node-a"].launches[-1]
    assert launched[launched.index("--speculative-num-steps") + 1] == "3"
    redeployed = svc.hosts["node-a"].records["qwen36-1"]
    assert redeployed["status"] == READY and redeployed["plan"]["flags"] == good["plan"]["flags"]


def test_a_rollback_to_a_record_without_its_smoke_check_is_refused_as_damaged(svc: Service) -> None:
    """A record fleet cannot prove a server with is damaged: never relaunched and recorded ready on /health."""
    assert svc.up().ok
    svc.script("node-a", crashes(UNKNOWN_CRASH))
    assert not svc.run().roll().ok
    del svc.router.kept["qwen36-1"]["good"]["smoke"]
    launched = len(svc.hosts["node-a"].launches)
    result = svc.run().roll(rollback=True)
    assert not result.ok and "the recorded deployment is damaged" in str(result.replicas[0].error)
    assert len(svc.hosts["node-a"].launches) == launched


def test_a_record_whose_status_is_damaged_reads_unreadable_not_none(svc: Service) -> None:
    assert svc.up().ok
    svc.hosts["node-a"].records["qwen36-1"]["status"] = ["ready"]  # type: ignore[typeddict-item]
    host = svc.inventory.hosts["node-a"]
    row = status_row(host, svc.hosts["node-a"].facts({}, []), "qwen36-1")
    assert row["status"] == "unreadable" and row["last_outcome"] == "unreadable"


def test_a_rollback_refuses_a_record_kept_from_another_host(svc: Service) -> None:
    assert svc.up().ok
    svc.script("node-a", crashes(UNKNOWN_CRASH))
    assert not svc.run().roll().ok
    svc.router.kept["qwen36-1"]["host"] = "node-b"
    acts = len(svc.hosts["node-a"].acts)
    result = svc.run().roll(rollback=True)
    assert not result.ok and "its last good record is from host node-b, not node-a" in result.reason
    assert len(svc.hosts["node-a"].acts) == acts


def test_down_deregisters_stops_every_replica_and_the_router(svc: Service) -> None:
    assert svc.up().ok
    done, failed = service_down(svc.run())
    assert failed == [] and svc.router.workers == [] and not svc.router.running
    assert all(not h.servers for h in svc.hosts.values())
    assert done[0] == "deregistered 2 worker(s)" and done[-1] == f"router stopped (pid {ROUTER_PID})"


def test_down_stops_what_it_can_reach_and_says_which_replica_still_runs(svc: Service) -> None:
    assert svc.up().ok
    svc.unreachable.add("node-b")
    done, failed = service_down(svc.run())
    assert len(failed) == 1 and "node-b/qwen36-2: NOT stopped" in "\n".join(done)
    assert svc.hosts["node-b"].servers and not svc.hosts["node-a"].servers and not svc.router.running


def test_the_health_of_a_service_never_brought_up_is_none(svc: Service) -> None:
    assert service_health(svc.run(), heal=False) is None


def test_a_service_serving_through_its_router_is_healthy(svc: Service) -> None:
    assert svc.up().ok
    health = service_health(svc.run(), heal=False)
    assert health is not None and health.status == OK, health.checks
    assert [s.serving for s in health.states] == [True, True] and health.heal == []


def test_status_and_health_agree_a_replica_whose_circuit_is_open_does_not_serve(svc: Service) -> None:
    """`fleet status` once said "2/2 serving" while the router refused one replica every request (its
    circuit open, its /health fine): status and health now read one truth, the router step's workers with
    their circuits (issue 38): ServiceRun.states, which `fleet status` lists and health judges."""
    assert svc.up().ok
    svc.router.circuits_open.add(B)
    run = svc.run()
    with run.session() as rt:
        states = {s.replica: s for s in run.states(rt)[0]}
    b = states["node-b/qwen36-2"]
    assert b.registered and b.healthy_in_router and b.circuit_open and not b.serving
    assert b.in_router == "circuit open (requests refused)" and states["node-a/qwen36-1"].serving
    health = service_health(svc.run(), heal=False)
    assert health is not None and health.status != OK
    assert [s.serving for s in health.states] == [True, False]


def test_a_dead_router_is_critical_and_each_replica_still_says_what_would_serve(svc: Service) -> None:
    assert svc.up().ok
    svc.router.running, svc.router.workers = False, []
    health = service_health(svc.run(), heal=False)
    assert health is not None and health.status == CRITICAL
    assert [s.status for s in health.states] == [READY, READY] and not svc.router.running


def test_heal_starts_a_dead_router_and_registers_the_ready_replicas_again(svc: Service) -> None:
    assert svc.up().ok
    svc.router.running, svc.router.workers = False, []
    health = service_health(svc.run(), heal=True)
    assert health is not None and health.status == OK, health.checks
    assert health.heal == [
        "router started again",
        "registered node-a/qwen36-1 again",
        "registered node-b/qwen36-2 again",
    ]
    assert svc.urls() == [A, B]


def test_heal_leaves_a_service_alone_while_a_roll_holds_it(svc: Service) -> None:
    assert svc.up().ok
    svc.router.workers = [w for w in svc.router.workers if w["url"] != A]  # the roll took it out on purpose
    svc.router.lease = {"run_id": "roll", "owner": "op@elsewhere", "command": "restart"}
    health = service_health(svc.run(), heal=True)
    assert health is not None and health.heal == ["not healed: `restart` by op@elsewhere is under way"]
    assert svc.urls() == [B]


def test_a_worker_that_is_no_replica_of_the_service_is_a_warning(svc: Service) -> None:
    assert svc.up().ok
    svc.router.workers.append({"id": "x", "url": "http://10.9.9.9:8000", "load": 0})
    health = service_health(svc.run(), heal=False)
    assert health is not None and health.status == WARNING
    assert any("also routes to http://10.9.9.9:8000" in c.detail for c in health.checks)


def test_two_replicas_on_one_host_take_gpus_of_their_own(tmp_path: Path) -> None:
    svc = Service(tmp_path, SERVICE.replace("  - host: node-b\n", "  - host: node-a\n"), gpus=8)
    svc.script("node-a", ready(), ready())
    result = svc.run().up()
    assert result.ok, result.reason
    gpus = sorted(tuple(r["gpus"]) for r in svc.hosts["node-a"].records.values())
    assert gpus == [(0, 1, 2, 3), (4, 5, 6, 7)]  # gpus: fit each (4 A6000 for the full context)


def test_the_scripted_host_keeps_records_as_the_real_steps_leave_them(svc: Service) -> None:
    """The fake itself: a launch records its server, a proven attempt is ready, a crash ends its server."""
    host = svc.hosts["node-b"]
    host.watches.append(crashes(UNKNOWN_CRASH))
    run = svc.run()
    with run.session():
        outcome = run._deploy(host, run.replicas[1], relaunch=False)
    assert not outcome.ok and host.servers == {}
    assert host.records["qwen36-2"]["status"] != READY


def test_up_again_keeps_replicas_that_prove_themselves_and_redeploys_one_that_answers_wrong(svc: Service) -> None:
    """A second `up`: each replica already running its plan is asked by a health sweep (alive, /health,
    /v1/models, the smoke prompt) and kept without a restart; one whose server answers the prompt wrongly
    is not kept, and is deployed again."""
    assert svc.up().ok
    kept = {name: svc.serving_pid(name) for name in svc.hosts}
    launched = {name: len(h.launches) for name, h in svc.hosts.items()}
    svc.hosts["node-b"].answers_wrong.add("qwen36-2")
    svc.script("node-b", ready())
    again = svc.run().up()
    assert again.ok, again.reason
    assert svc.hosts["node-a"].sweeps == 1 and len(svc.hosts["node-a"].launches) == launched["node-a"]
    assert svc.serving_pid("node-a") == kept["node-a"]  # kept: nothing restarted
    assert len(svc.hosts["node-b"].launches) == launched["node-b"] + 1  # not kept: deployed again
    assert svc.serving_pid("node-b") != kept["node-b"]
    assert svc.urls() == [A, B]


def deploy_alone(svc: Service, host: str, name: str) -> Any:
    """`fleet deploy qwen36-27b --host HOST --name NAME`: a deployment of its own, under a replica's name."""
    from fleet.control import ops

    svc.script(host, ready())
    return ops.deploy(
        svc.hosts[host],
        svc.inventory.hosts[host],
        svc.playbook,
        force=False,
        engine_check=False,
        progress=events.ignore,
        name=name,
    )


def test_a_deployment_of_its_own_under_a_replicas_name_is_left_as_it_is(svc: Service) -> None:
    """A replica is the deployment `SERVICE-N`; one an operator deployed alone under that name is no
    replica: up refuses to replace it, a roll or rollback refuses to start, down and status leave it."""
    assert deploy_alone(svc, "node-b", "qwen36-2").ok
    b = svc.hosts["node-b"]
    assert b.records["qwen36-2"]["service"] == ""
    alone, launched = svc.serving_pid("node-b"), len(b.launches)

    result = svc.up()
    assert not result.ok and "1 of 2 replicas failed: node-b/qwen36-2" in result.reason
    refused = str(result.replicas[1].error)
    assert "deployment qwen36-2 is a deployment of qwen36-27b alone, not a replica of service qwen36" in refused
    assert svc.urls() == [A], "only the replica that is the service's is registered"
    for rollback in (False, True):
        rolled = svc.run().roll(rollback=rollback)
        assert not rolled.ok and "node-b/qwen36-2 is a deployment of qwen36-27b alone" in rolled.reason
    health = service_health(svc.run(), heal=True, ask=False)
    assert health is not None and [s.status for s in health.states] == [READY, "another's"]

    done, failed = service_down(svc.run())
    assert failed == [] and any(line.startswith("node-b/qwen36-2: left as it is") for line in done), done
    assert svc.hosts["node-a"].records["qwen36-1"]["status"] == "stopped"
    assert b.records["qwen36-2"]["status"] == READY and svc.serving_pid("node-b") == alone
    assert len(b.launches) == launched


def test_a_deploy_of_its_own_under_a_replicas_name_is_refused_and_a_restart_keeps_the_tag(svc: Service) -> None:
    from fleet.control import ops

    assert svc.up().ok
    b = svc.hosts["node-b"]
    launched = len(b.launches)
    with pytest.raises(PreflightError, match="deployment qwen36-2 is a replica of service qwen36; it was left"):
        deploy_alone(svc, "node-b", "qwen36-2")
    assert len(b.launches) == launched and b.records["qwen36-2"]["service"] == "qwen36"
    b.watches.append(ready())
    ops.restart(b, svc.inventory.hosts["node-b"], force=False, progress=events.ignore, name="qwen36-2")
    assert len(b.launches) == launched + 1 and b.records["qwen36-2"]["service"] == "qwen36"


def test_a_record_an_older_fleet_wrote_is_a_replica_when_it_ran_the_services_playbook(svc: Service) -> None:
    assert svc.up().ok
    for name, deployment in (("node-a", "qwen36-1"), ("node-b", "qwen36-2")):
        del svc.hosts[name].records[deployment]["service"]  # type: ignore[misc]
    svc.script("node-a", ready())
    svc.script("node-b", ready())
    assert svc.run().roll().ok
    assert svc.hosts["node-b"].records["qwen36-2"]["service"] == "qwen36"
    svc.hosts["node-b"].records["qwen36-2"] = {**svc.hosts["node-b"].records["qwen36-2"], "playbook": "other"}
    del svc.hosts["node-b"].records["qwen36-2"]["service"]  # type: ignore[misc]
    assert "node-b/qwen36-2 is a deployment of other alone" in svc.run().roll().reason
