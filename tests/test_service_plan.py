"""Services without a host: the service file (validated with file:line), where its replicas go, the
router's command line (read by the real router's own parser), when a replica may leave the router, and
the service's health from what the router and the hosts said."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT
from fleet.errors import ConfigError
from fleet.health.checks import CRITICAL, OK, WARNING
from fleet.host.common import base_url
from fleet.inventory import load_inventory
from fleet.inventory.services import load_service
from fleet.plan.service import (
    ReplicaState,
    reachable_address,
    router_argv,
    service_checks,
    strangers,
    take_out_refusal,
    url_host,
    with_router,
)

INVENTORY = load_inventory(ROOT / "inventory" / "hosts.yaml")
GOOD = "playbook: qwen36-27b\nreplicas: 3\nhosts: [gpu]\nrouter: {host: ct129}\n"


def service(tmp_path: Path, text: str, name: str = "svc") -> object:
    (tmp_path / f"{name}.yaml").write_text(text)
    return load_service(name, tmp_path)


def test_the_example_service_places_one_replica_per_listed_host() -> None:
    svc = load_service("qwen36", ROOT / "services")
    placed = svc.replicas(INVENTORY)
    assert [(r.host, r.deployment, r.gpus) for r in placed] == [
        ("ct129", "qwen36-1", None),
        ("blackwell", "qwen36-2", (6, 7)),
    ]
    assert svc.router_host(INVENTORY) == "ct129"
    assert svc.spec.router.metrics == 40080


def test_a_count_of_replicas_is_spread_over_the_group_one_per_host_first(tmp_path: Path) -> None:
    svc = service(tmp_path, GOOD)
    assert [(r.host, r.deployment) for r in svc.replicas(INVENTORY)] == [  # type: ignore[attr-defined]
        ("blackwell", "svc-1"),
        ("ct129", "svc-2"),
        ("blackwell", "svc-3"),
    ]


def test_replicas_sharing_a_host_pack_as_fit_and_a_replica_alone_takes_the_free_gpus(tmp_path: Path) -> None:
    """gpus: left out takes the host's free GPUs: two replicas on blackwell would leave the second none,
    so replicas that share a host take as many as the model needs each; ct129's replica, alone there,
    and a replica with gpus: given keep the playbook's own."""
    from fleet.control.service import replica_playbook
    from fleet.inventory import load_playbook

    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    replicas = service(tmp_path, GOOD).replicas(INVENTORY)  # type: ignore[attr-defined]
    assert [replica_playbook(pb, r, replicas).spec.gpus for r in replicas] == ["fit", None, "fit"]
    given = [replace(r, gpus=(0,)) if r.deployment == "svc-1" else r for r in replicas]
    assert replica_playbook(pb, given[0], given).spec.gpus is None


BAD = [
    ("replicas: 2\nrouter: {host: ct129}\n", "svc.yaml:1", 'required field "playbook" is missing'),
    (
        "playbook: p\nreplicas: 2\nrouter: {host: ct129}\n",
        "svc.yaml:2",
        'field "replicas" is a count (2), which needs hosts:',
    ),
    ("playbook: p\nreplicas: []\nrouter: {host: ct129}\n", "svc.yaml:2", "lists no replica"),
    (
        "playbook: p\nreplicas: [{host: ct129}]\nhosts: [gpu]\nrouter: {host: ct129}\n",
        "svc.yaml:3",
        "is only read with a count of replicas",
    ),
    ("playbook: p\nreplicas: 0\nhosts: [gpu]\nrouter: {host: ct129}\n", "svc.yaml:2", "must be at least 1"),
    (
        "playbook: p\nreplicas: [{host: ct129, gpu: 1}]\nrouter: {host: ct129}\n",
        "svc.yaml:2",
        'unknown key "replicas.0.gpu"',
    ),
    (
        "playbook: p\nreplicas: [{host: ct129}]\nrouter: {host: ct129, policy: fastest}\n",
        "svc.yaml:3",
        "must be one of 'cache_aware', 'round_robin', 'power_of_two', 'random'",
    ),
    (
        "playbook: p\nreplicas: [{host: ct129}]\nrouter: {host: ct129, port: 80}\n",
        "svc.yaml:3",
        "must be at least 1024",
    ),
    (
        "playbook: p\nreplicas: [{host: ct129}]\nrouter: {host: ct129, port: 60000}\n",
        "svc.yaml:3",
        "leaves no default metrics port (70000)",
    ),
    (
        "playbook: p\nreplicas: [{host: ct129}]\nrouter: {host: ct129, python: 'py; rm -rf /'}\n",
        "svc.yaml:3",
        'field "router.python" must be an absolute path',
    ),
    (
        "playbook: p\nreplicas: [{host: 'a\\nb'}]\nrouter: {host: ct129}\n",
        "svc.yaml:2",
        "must be a host name from the inventory",
    ),
    (
        "playbook: p\nreplicas: [{host: ct129}]\nrouter: {host: ct129}\nmin_healthy: 2\n",
        "svc.yaml:4",
        "more than the 1",
    ),
    ("playbook: p\nreplicas: [{host: ct129}]\n", "svc.yaml:1", 'required field "router" is missing'),
]


@pytest.mark.parametrize(("text", "where", "message"), BAD, ids=[b[2][:40] for b in BAD])
def test_a_bad_service_file_is_refused_with_file_line_and_what_is_wrong(
    tmp_path: Path, text: str, where: str, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        service(tmp_path, text)
    assert err.value.message.startswith(f"{tmp_path}/{where}:"), err.value.message
    assert message in err.value.message


def test_hosts_the_inventory_lacks_are_named_with_the_services_line(tmp_path: Path) -> None:
    svc = service(tmp_path, "playbook: p\nreplicas:\n  - host: ct130\nrouter: {host: ct129}\n")
    with pytest.raises(ConfigError, match=r"svc.yaml:2: .*no host or group named \"ct130\""):
        svc.replicas(INVENTORY)  # type: ignore[attr-defined]
    svc = service(tmp_path, "playbook: p\nreplicas: [{host: ct129}]\nrouter: {host: gpu}\n")
    with pytest.raises(ConfigError, match="is a group"):
        svc.router_host(INVENTORY)  # type: ignore[attr-defined]


def test_an_unknown_service_lists_the_known_ones(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    with pytest.raises(ConfigError) as err:
        load_service("b", tmp_path)
    assert "no file" in err.value.message and err.value.hint == "Known services: a."


def test_the_router_command_line_is_accepted_by_the_real_routers_parser() -> None:
    launch = pytest.importorskip("sglang_router.launch_router")
    argv = router_argv("/opt/venv/bin/python", "10.0.0.5", 30080, "cache_aware", 40080)
    assert argv[:3] == ["/opt/venv/bin/python", "-m", "sglang_router.launch_router"]
    args = launch.parse_router_args(argv[3:])
    assert (args.host, args.port, args.policy) == ("10.0.0.5", 30080, "cache_aware")
    assert (args.prometheus_host, args.prometheus_port) == ("10.0.0.5", 40080)
    assert args.worker_urls == []  # workers are registered once they have proved they answer


def test_a_replica_is_reached_at_the_address_it_binds_else_its_ssh_address() -> None:
    assert reachable_address("10.0.0.7", "gpu7.lan", "gpu7") == "10.0.0.7"
    assert reachable_address("0.0.0.0", "gpu7.lan", "gpu7") == "gpu7.lan"
    assert reachable_address("0.0.0.0", None, "gpu7") == "gpu7"
    assert base_url("fd00::7", 30000) == "http://[fd00::7]:30000"


A = ReplicaState("a/svc-1", "http://a:30000", "ready")
B = ReplicaState("b/svc-2", "http://b:30000", "ready")
WORKERS = [
    {"url": "http://a:30000", "is_healthy": True},
    {"url": "http://b:30000", "is_healthy": True},
    {"url": "http://hand-added:8000", "is_healthy": True},
]


def test_the_router_s_view_is_joined_to_each_replica() -> None:
    a, b = with_router([A, B], WORKERS[:1] + [{"url": "http://b:30000", "is_healthy": False}])
    assert a.serving and (b.registered, b.healthy_in_router, b.serving) == (True, False, False)
    assert strangers([A, B], WORKERS) == ["http://hand-added:8000"]


def test_the_last_serving_replica_may_not_leave_the_router() -> None:
    a, b = with_router([A, B], WORKERS)
    assert take_out_refusal(a, [a, b]) is None
    a_alone, b_down = with_router([A, ReplicaState("b/svc-2", "http://b:30000", "dead")], WORKERS)
    refusal = take_out_refusal(a_alone, [a_alone, b_down])
    assert refusal and "no serving replica" in refusal and "serving: a/svc-1" in refusal
    assert take_out_refusal(b_down, [a_alone, b_down]) is None  # one that does not serve may go
    c = ReplicaState("c/svc-3", "http://c:30000", "ready")
    a, b, c = with_router([A, B, c], [*WORKERS, {"url": "http://c:30000", "is_healthy": True}])
    assert take_out_refusal(a, [a, b, c], min_healthy=2) is None
    below = take_out_refusal(a, [a, b, c], min_healthy=3)
    assert below and "2 serving, fewer than min_healthy 3" in below


def test_a_worker_url_is_read_back_to_its_address() -> None:
    assert url_host("http://10.0.0.7:30000") == "10.0.0.7"
    assert url_host(base_url("fd00::7", 30000)) == "fd00::7"
    assert url_host("http://gpu7.lan:30010/") == "gpu7.lan"


def test_service_health_counts_serving_replicas_against_min_healthy() -> None:
    up = {"health": 200}
    answered = {"ok": True, "seconds": 0.2}
    both = with_router([A, B], WORKERS)
    assert [c.status for c in service_checks(up, both, 1, answered)] == [OK, OK, OK]
    one = with_router([A, ReplicaState("b/svc-2", "http://b:30000", "dead")], WORKERS)
    checks = service_checks(up, one, 1, answered)
    assert [(c.name, c.status) for c in checks] == [
        ("router", OK),
        ("replicas", WARNING),
        ("replica", WARNING),
        ("routed_generation", OK),
    ]
    assert "its server is dead" in checks[2].detail
    assert service_checks(up, one, 2, answered)[1].status == CRITICAL
    lost = with_router([A, B], WORKERS[:1])
    assert "not registered in the router" in service_checks(up, lost, 1, None)[2].detail
    wrong = service_checks(up, both, 1, {"ok": False, "status": 503, "text": "no healthy worker"})
    assert wrong[-1].status == CRITICAL and "503" in wrong[-1].detail
    assert service_checks({"health": None, "text": "refused"}, [], 1, None)[0].status == CRITICAL


def test_a_service_records_last_good_replicas_are_read_once_and_a_damaged_entry_is_none() -> None:
    from fleet.plan.service import KeptReplica, kept_replicas

    record = {
        "replicas": {
            "qwen36-1": {"host": "node-a", "good": {"status": "ready", "plan": {}}},
            "qwen36-2": {"host": 7, "good": "ready"},
            "qwen36-3": ["node-c"],
        }
    }
    kept = kept_replicas(record)
    assert kept["qwen36-1"].refusal("node-a") is None
    assert kept["qwen36-1"].refusal("node-b") == "its last good record is from host node-a, not node-b"
    assert kept["qwen36-2"] == KeptReplica(None, None) == kept["qwen36-3"]
    assert kept["qwen36-2"].refusal("node-b") == "no good record to roll back to"
    assert kept_replicas({"replicas": "all"}) == {} == kept_replicas({})
