"""Embedding models and rerankers deployed end to end on the simulated fleet (real sshd, the simulated SGLang
held to the real one's embedding mode): planned as what they are, proved on the endpoint they serve, and
never reported up when that endpoint refuses."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import CT129, ROOT, run_cli
from fleet_testbed import simhost

pytestmark = pytest.mark.ssh
MATRIX = ROOT / "tests" / "data" / "matrix"
PLAYBOOK = """engine: sglang
model: {model}
served_name: {name}
port: {port}
smoke: {{prompt: "What is the capital of France?", expect: "(?i)paris"}}
"""


@pytest.fixture
def playbooks(fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The published embedding and reranker checkpoints on ct129, and a playbook for each."""
    d = tmp_path / "playbooks"
    d.mkdir()
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(d))
    for model, name, port in (("Qwen3-Embedding-4B", "embed", 30010), ("bge-reranker-v2-m3", "rerank", 30020)):
        dest = fleet_env.host_dir("ct129") / "models" / model
        shutil.copytree(MATRIX / model, dest, dirs_exist_ok=True)
        simhost.write_weights(dest)
        (d / f"{name}.yaml").write_text(PLAYBOOK.format(model=model, name=name, port=port))
    return d


def state(sb: simhost.Sandbox, deployment: str) -> dict:
    return json.loads(simhost.record(sb.host_dir("ct129"), "state.json", deployment).read_text())


def test_an_embedding_model_and_a_reranker_are_planned_and_proved_on_their_endpoints(
    fleet_env: simhost.Sandbox, playbooks: Path
) -> None:
    """The embedding model takes the PCIe box as TP 1 x 2 data-parallel replicas (one GPU holds it), and
    the simulated SGLang runs a scheduler per replica; the reranker, on the box after it, gets the
    attention backend its rerank models support."""
    r = run_cli("deploy", "embed", "--host", "ct129")
    assert r.code == 0, r.out + r.err
    assert "3 embeddings of 2560 numbers" in r.out + r.err  # asked /v1/embeddings, not chat
    argv = state(fleet_env, "embed")["plan"]["argv"]
    assert "--is-embedding" in argv and argv[argv.index("--dp-size") + 1] == "2"
    ps = [*simhost.ssh_argv(fleet_env, CT129), "ps -eo args= | grep -o 'sglang::scheduler_DP[0-9]' | sort"]
    titles = subprocess.run(ps, capture_output=True, text=True, timeout=30).stdout
    assert titles.split() == ["sglang::scheduler_DP0", "sglang::scheduler_DP1"]
    health = json.loads(run_cli("health", "--host", "ct129", "--json").out)
    checks = {(c["deployment"], c["name"]): c for c in health["checks"]}
    assert checks[("embed", "generation")]["status"] == "ok", checks[("embed", "generation")]
    # a restart asks the same endpoint: the task is in the record
    r = run_cli("restart", "--host", "ct129/embed")
    assert r.code == 0 and "3 embeddings of 2560 numbers" in r.out + r.err, r.out + r.err
    assert run_cli("stop", "--host", "ct129/embed").code == 0
    r = run_cli("deploy", "rerank", "--host", "ct129")
    assert r.code == 0, r.out + r.err
    assert "the answering document scored" in r.out + r.err
    argv = state(fleet_env, "rerank")["plan"]["argv"]
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    health = json.loads(run_cli("health", "--host", "ct129", "--json").out)
    checks = {(c["deployment"], c["name"]): c for c in health["checks"]}
    assert checks[("rerank", "generation")]["status"] == "ok", checks[("rerank", "generation")]


def test_an_embedding_model_launched_as_a_chat_server_is_not_reported_up(
    fleet_env: simhost.Sandbox, playbooks: Path
) -> None:
    """A literal playbook leaves --is-embedding out: the engine starts and says healthy, but refuses
    embeddings in its own words, and the deploy fails on that answer."""
    text = (playbooks / "embed.yaml").read_text() + "literal: true\ntp: 1\nmax_attempts: 1\n"
    (playbooks / "embed.yaml").write_text(text)
    r = run_cli("deploy", "embed", "--host", "ct129")
    assert r.code != 0, r.out + r.err
    assert "does not appear to be an embedding model by default" in r.out + r.err
    assert state(fleet_env, "embed")["status"] != "ready"
