"""The example service (services/qwen36.yaml: a replica on ct129, one on blackwell's GPUs 6 and 7, the
real SGLang router on ct129) through fleet's command line over real sshd: up, status, health, a rolling
restart under a steady stream of requests through the router (none may fail), down."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import CT129, ROOT, run_cli
from fleet_testbed import simhost
from simengine import RequestLoop, chat

pytestmark = pytest.mark.ssh
pytest.importorskip("sglang_router", reason="the real router: pip install sglang-router")


def routed() -> tuple[int | None, object]:
    return chat(CT129.address, 30080, "What is the capital of France?", served="qwen36")


def test_the_example_service_comes_up_rolls_without_a_failed_request_and_goes_down(
    fleet_env: simhost.Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEET_SERVICES", str(ROOT / "services"))
    # a service file never brought up is a file, not a service: not listed, not checked
    assert "service" not in run_cli("status").out
    before = run_cli("health")
    assert before.code == 0 and "service/qwen36" not in before.out, before.out
    assert not (fleet_env.host_dir("ct129") / "state" / "services").exists()  # looking changed nothing
    up = run_cli("up", "qwen36")
    assert up.code == 0, up.out + up.err
    assert f"service qwen36 is up at http://{CT129.address}:30080" in up.out + up.err
    code, body = routed()
    assert code == 200 and "Paris" in str(body)

    status = run_cli("status")
    assert "service qwen36: router up" in status.out and "2/2 serving" in status.out, status.out
    assert "ct129/qwen36-1" in status.out and "blackwell/qwen36-2" in status.out
    health = run_cli("health")
    assert "service/qwen36" in health.out and health.code == 0, health.out

    def routed_failure() -> object:
        code, body = routed()
        return None if code == 200 and "Paris" in str(body) else (code, body)

    with RequestLoop(routed_failure) as loop:
        rolled = run_cli("restart", "qwen36")
    assert rolled.code == 0, rolled.out + rolled.err
    assert loop.failures == [] and loop.answered > 10, (loop.failures[:5], loop.answered)
    for replica in ("ct129/qwen36-1", "blackwell/qwen36-2"):
        assert (
            f"{replica}: deregistered" in rolled.out + rolled.err
            and f"{replica}: registered" in rolled.out + rolled.err
        )

    refused = run_cli("restart", "qwen36", "--host", "ct129")
    assert refused.code == 2 and "restarted as a whole" in refused.err

    down = run_cli("down", "qwen36")
    assert down.code == 0, down.out
    assert "router stopped" in down.out
    assert routed()[0] is None  # nothing listens on the router's port any more
    assert "service" not in run_cli("status").out and "service/qwen36" not in run_cli("health").out
    for host, name in (("ct129", "qwen36-1"), ("blackwell", "qwen36-2")):
        assert '"status": "stopped"' in simhost.record(fleet_env.host_dir(host), "state.json", name).read_text()


def test_status_and_health_say_a_replica_the_router_refuses_does_not_serve(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38's second defect, over sshd: `fleet status` said "2/2 serving, router: up" while the router
    refused one replica every request (its circuit open after ten failures, its /health still fine), as
    health said otherwise. One truth now, in both commands."""
    # round robin: the example's cache-aware policy sends one prompt asked again to one replica only
    example = (ROOT / "services" / "qwen36.yaml").read_text()
    (tmp_path / "qwen36.yaml").write_text(example.replace("policy: cache_aware", "policy: round_robin"))
    monkeypatch.setenv("FLEET_SERVICES", str(tmp_path))
    assert run_cli("up", "qwen36").code == 0
    try:
        simhost.set_host(fleet_env.host_dir("blackwell"), generation_http_500=True)
        for _ in range(30):  # the router retries each failure on ct129; blackwell's circuit opens after ten
            code, body = routed()
            assert code == 200 and "Paris" in str(body)
        status = run_cli("status")
        assert "1/2 serving" in status.out, status.out
        replica = next(
            x for x in status.out.splitlines() if x.strip().startswith("blackwell/qwen36-2") and "router:" in x
        )
        assert replica.endswith("router: circuit open (requests refused)"), status.out
        health = run_cli("health")
        assert health.code != 0 and "circuit open" in health.out, health.out
    finally:
        simhost.set_host(fleet_env.host_dir("blackwell"), generation_http_500=False)
        assert run_cli("down", "qwen36").code == 0


def test_a_bad_service_file_changes_nothing(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "svc.yaml").write_text("playbook: qwen36-27b\nreplicas: 2\nrouter: {host: ct129}\n")
    monkeypatch.setenv("FLEET_SERVICES", str(tmp_path))
    result = run_cli("up", "svc")
    assert result.code == 2
    assert f'{tmp_path}/svc.yaml:2: field "replicas" is a count (2), which needs hosts:' in result.err
    assert not list((fleet_env.host_dir("ct129") / "logs").iterdir())


def test_a_secret_missing_from_the_environment_is_refused_before_the_service_changes(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As `fleet deploy` refuses it: not after the router started (up) or a replica left it (restart)."""
    one_replica_service(tmp_path, monkeypatch, "secretive", "secret_env: [FLEET_TEST_NOT_SET]\n")
    monkeypatch.delenv("FLEET_TEST_NOT_SET", raising=False)
    for command in (["up", "svc"], ["restart", "svc"]):
        result = run_cli(*command)
        assert result.code == 2, result.out + result.err
        assert "secret_env lists FLEET_TEST_NOT_SET, which is not set" in result.err
    assert not list((fleet_env.host_dir("ct129") / "logs").iterdir())
    assert not (fleet_env.host_dir("ct129") / "state" / "services" / "svc").exists()


def one_replica_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, extra: str) -> Path:
    """Service `svc`: one replica on ct129 of playbook `name` (qwen36-27b's, plus `extra`); its playbooks."""
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / f"{name}.yaml").write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + extra)
    (tmp_path / "svc.yaml").write_text(f"playbook: {name}\nreplicas: 1\nhosts: [ct129]\nrouter: {{host: ct129}}\n")
    monkeypatch.setenv("FLEET_SERVICES", str(tmp_path))
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(playbooks))
    return playbooks


def test_a_service_of_a_playbook_with_an_api_key_is_refused_before_anything_starts(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router would need the engine's key on its command line, readable by every user of the host."""
    playbooks = one_replica_service(tmp_path, monkeypatch, "keyed", "api_key_env: FLEET_TEST_API_KEY\n")
    monkeypatch.setenv("FLEET_TEST_API_KEY", "sk-never-shown")
    for command in (["up", "svc"], ["restart", "svc"]):
        result = run_cli(*command)
        assert result.code == 2, result.out + result.err
        assert f"{tmp_path}/svc.yaml:1: playbook 'keyed' ({playbooks}/keyed.yaml:" in result.err
        assert "process list" in result.err and "sk-never-shown" not in result.out + result.err
    assert not list((fleet_env.host_dir("ct129") / "logs").iterdir())
