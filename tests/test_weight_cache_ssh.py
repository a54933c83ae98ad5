"""SGLang's weight cache daemon under fleet, end to end over real sshd (issue 41): the simulated 0.5.23
daemon holds a model's weights in the simulated GPU memory and loads them in a time proportional to their
size; an engine started with --weight-cache-mode client maps them, or refuses as the real loader does.

What is counted is the number of loads from disk (the daemon's "Loading model from disk" line, once per
rank, and the engine's own load), never a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CT129, Background, run_cli
from fleet.host.launch import DAEMON_LOG_SUFFIX
from fleet_testbed import bench_weight_cache, simhost
from fleet_testbed.bench_weight_cache import PLAYBOOK
from simengine import wait_until

pytestmark = pytest.mark.ssh


def graphs_need_memory(sb: simhost.Sandbox) -> None:
    """CUDA graphs that take 64 MiB per batch row: at the playbooks' fraction 0.59 the capture of 512 rows
    runs out of memory (SGLang's fix: 16 rows and 0.05 less), and 0.54 leaves no KV pool (SGLang's fix:
    0.04 more)."""
    simhost.set_host(sb.host_dir("ct129"), graph_mib_per_bs=64)


@pytest.fixture
def cached(fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ct129 on SGLang 0.5.23, loading 0.02 s per GiB. Playbooks: wc (cached), disk (not)."""
    simhost.set_host(fleet_env.host_dir("ct129"), sglang_version="0.5.23", load_s_per_gib=0.02)
    d = tmp_path / "playbooks"
    d.mkdir()
    (d / "wc.yaml").write_text(PLAYBOOK.format(cache="true"))
    (d / "disk.yaml").write_text(PLAYBOOK.format(cache="false"))
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(d))
    return d


def disk_loads(sb: simhost.Sandbox) -> int:
    return bench_weight_cache.disk_loads(sb.host_dir("ct129") / "logs")


def daemon_pids(sb: simhost.Sandbox) -> list[int]:
    """The daemon processes running on ct129 (main and ranks), by what they run."""
    ps = [*simhost.ssh_argv(sb, CT129), "ps -eo pid=,args="]
    rows = subprocess.run(ps, capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    return [int(r.split()[0]) for r in rows if "weight_cache.daemon" in r or "sim_weight_cache rank" in r]


def record(sb: simhost.Sandbox, name: str) -> dict:
    return json.loads(simhost.record(sb.host_dir("ct129"), "state.json", name).read_text())


def test_two_fixes_a_restart_and_a_heal_load_the_weights_once(fleet_env: simhost.Sandbox, cached: Path) -> None:
    """The issue's loop: a graph-capture OOM fixed by a smaller capture, then a KV pool too small fixed by a
    larger fraction. Without the cache each attempt loads from disk (3 loads); with it the daemon loads
    once and every attempt, the restart and the heal map its weights."""
    graphs_need_memory(fleet_env)
    r = run_cli("deploy", "wc", "--host", "ct129")
    out = r.out + r.err
    assert r.code == 0, out
    assert "fixed on the way: cuda-graph-capture-failed, sglang-kv-not-enough-memory" in out
    assert out.count("weight cache daemon started pid") == 1 and out.count("weight cache daemon kept") == 2, out
    assert disk_loads(fleet_env) == 1
    daemon = record(fleet_env, "wc")["weight_cache"]
    assert run_cli("restart", "--host", "ct129/wc").code == 0
    engine = record(fleet_env, "wc")["pgid"]
    subprocess.run([*simhost.ssh_argv(fleet_env, CT129), f"kill -9 -- -{engine}"], check=True)
    healed = run_cli("health", "--host", "ct129", "--heal")
    assert "wc: restarted: server ready" in healed.out, healed.out + healed.err
    assert disk_loads(fleet_env) == 1 and record(fleet_env, "wc")["weight_cache"]["pid"] == daemon["pid"]
    assert f"weight cache {daemon['pgid']}" in run_cli("status", "--host", "ct129").out
    # its server gone, the daemon still holds the weights: forgetting the deployment would orphan it
    subprocess.run([*simhost.ssh_argv(fleet_env, CT129), f"kill -9 -- -{record(fleet_env, 'wc')['pgid']}"], check=True)
    forgot = run_cli("forget", "ct129/wc")
    assert forgot.code != 0 and f"(process group {daemon['pgid']})" in forgot.err, forgot.out + forgot.err
    stopped = run_cli("stop", "--host", "ct129/wc")
    assert stopped.code == 0 and "fleet's weight cache daemon pid" in stopped.out + stopped.err
    assert daemon_pids(fleet_env) == []


def test_without_the_cache_the_same_loop_loads_once_per_attempt(fleet_env: simhost.Sandbox, cached: Path) -> None:
    graphs_need_memory(fleet_env)
    r = run_cli("deploy", "disk", "--host", "ct129")
    assert r.code == 0, r.out + r.err
    assert "weight cache" not in r.out + r.err and disk_loads(fleet_env) == 3 and daemon_pids(fleet_env) == []


def test_a_new_shape_restarts_the_daemon_and_a_deploy_without_it_stops_it(
    fleet_env: simhost.Sandbox, cached: Path
) -> None:
    """The daemon's settings follow the plan: trusting the model's code is part of how it loads, so the
    daemon is started again and says why; a deploy of the same deployment without weight_cache: stops it as
    fleet's own (not as a foreign GPU holder) and the engine loads from disk."""
    assert run_cli("deploy", "wc", "--host", "ct129").code == 0
    first = record(fleet_env, "wc")["weight_cache"]["pid"]
    (cached / "wc.yaml").write_text(PLAYBOOK.format(cache="true") + "trust_remote_code: true\n")
    r = run_cli("deploy", "wc", "--host", "ct129")
    assert r.code == 0 and "started again: its settings changed" in r.out + r.err, r.out + r.err
    assert record(fleet_env, "wc")["weight_cache"]["pid"] != first and first not in daemon_pids(fleet_env)
    (cached / "wc.yaml").write_text(PLAYBOOK.format(cache="false"))
    loads = disk_loads(fleet_env)
    r = run_cli("deploy", "wc", "--host", "ct129")
    assert r.code == 0, r.out + r.err
    assert "fleet's weight cache daemon pid" in r.out + r.err and daemon_pids(fleet_env) == []
    assert disk_loads(fleet_env) == loads + 1


def test_replacing_a_deployment_stops_its_daemon_too(fleet_env: simhost.Sandbox, cached: Path) -> None:
    """Another deployment on the same GPUs replaces wc (--replace): wc's daemon goes with wc's server, named
    as wc's; the new server loads from disk with the whole GPUs."""
    assert run_cli("deploy", "wc", "--host", "ct129").code == 0
    r = run_cli("deploy", "disk", "--host", "ct129", "--replace")
    assert r.code == 0, r.out + r.err
    assert "deployment wc's server (--replace)" in r.out + r.err and daemon_pids(fleet_env) == []


SERVICE = """playbook: wc
replicas:
  - host: ct129
  - host: blackwell
    gpus: [6, 7]
router: {host: ct129, port: 30080, policy: cache_aware}
min_healthy: 1
drain_s: 2
"""


def test_a_rolling_restart_of_two_cached_replicas_loads_nothing_and_fails_no_request(
    fleet_env: simhost.Sandbox, cached: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service of two replicas, each with its own daemon (ct129, blackwell's GPUs 6 and 7): the roll
    relaunches each replica against its daemon under a steady stream of requests through the real router,
    and `fleet down` stops both daemons with their servers."""
    pytest.importorskip("sglang_router", reason="the real router: pip install sglang-router")
    from simengine import RequestLoop, chat

    simhost.set_host(fleet_env.host_dir("blackwell"), sglang_version="0.5.23", load_s_per_gib=0.02)
    services = tmp_path / "services"
    services.mkdir()
    (services / "wcs.yaml").write_text(SERVICE)
    monkeypatch.setenv("FLEET_SERVICES", str(services))
    up = run_cli("up", "wcs")
    assert up.code == 0, up.out + up.err
    loads = {h: bench_weight_cache.disk_loads(fleet_env.host_dir(h) / "logs") for h in ("ct129", "blackwell")}
    assert loads == {"ct129": 1, "blackwell": 1}

    def routed_failure() -> object:
        code, body = chat(CT129.address, 30080, "What is the capital of France?", served="qwen36")
        return None if code == 200 and "Paris" in str(body) else (code, body)

    with RequestLoop(routed_failure) as loop:
        rolled = run_cli("restart", "wcs")
    assert rolled.code == 0, rolled.out + rolled.err
    assert loop.failures == [] and loop.answered > 0, (loop.failures[:5], loop.answered)
    assert (rolled.out + rolled.err).count("weight cache daemon kept") == 2, rolled.out + rolled.err
    assert {h: bench_weight_cache.disk_loads(fleet_env.host_dir(h) / "logs") for h in loads} == loads
    assert run_cli("down", "wcs").code == 0
    assert daemon_pids(fleet_env) == []


def test_a_lookalike_daemon_and_a_dead_daemons_files_are_never_taken_for_fleets(
    fleet_env: simhost.Sandbox, cached: Path
) -> None:
    """wc's daemon and server are killed outright (their .ready files stay behind, naming dead pids), and a
    process of fleet's own user that merely names the daemon's module holds GPU 0. A deploy on those GPUs
    refuses it (not fleet's: no record names its group) and leaves it running; once it is gone, the deploy
    starts a new daemon and waits for its own ranks, not the stale files."""
    assert run_cli("deploy", "wc", "--host", "ct129").code == 0
    st = record(fleet_env, "wc")
    for group in (st["pgid"], st["weight_cache"]["pgid"]):
        subprocess.run([*simhost.ssh_argv(fleet_env, CT129), f"kill -9 -- -{group}"], check=True)
    dev = fleet_env.host_dir("ct129") / "dev" / "nvidia0"
    lookalike = f"exec 3<{dev}; exec python3 -c 'import time; time.sleep(60)' sglang.srt.weight_cache.daemon"
    with Background([*simhost.ssh_argv(fleet_env, CT129), lookalike]) as bg:
        assert wait_until(lambda: bool(daemon_pids(fleet_env)))
        r = run_cli("deploy", "wc", "--host", "ct129", "--gpus", "0,1")
        assert r.code == 6 and "not an inference server" in r.err, r.out + r.err
        left = daemon_pids(fleet_env)
        assert left and bg.proc.poll() is None  # still running
        subprocess.run([*simhost.ssh_argv(fleet_env, CT129), f"kill -9 {' '.join(map(str, left))}"], check=True)
    r = run_cli("deploy", "wc", "--host", "ct129", "--gpus", "0,1")
    assert r.code == 0 and "weight cache daemon started pid" in r.out + r.err, r.out + r.err
    assert "Loaded model via IPC" in (fleet_env.host_dir("ct129") / "logs" / "wc.latest.log").read_text()


def test_a_daemon_that_refuses_the_engine_is_started_again_once(fleet_env: simhost.Sandbox, cached: Path) -> None:
    """The engine's environment gets a new torch under a running daemon (host.json `torch_version`; the
    daemon keeps the torch it started with), which no key of fleet's can see: the engine's loader refuses the
    daemon's weights as SGLang's does, fleet starts the daemon again with this engine's settings and says
    why, and the relaunch maps the new daemon's weights."""
    assert run_cli("deploy", "wc", "--host", "ct129").code == 0
    first = record(fleet_env, "wc")["weight_cache"]["pid"]
    simhost.set_host(fleet_env.host_dir("ct129"), torch_version="2.12.0+upgraded")
    r = run_cli("restart", "--host", "ct129/wc")
    out = r.out + r.err
    assert r.code == 0, out
    assert "weight-cache-config-mismatch" in out and "Daemon config mismatch" in out, out
    assert "started again: it refused the last engine's configuration" in out, out
    assert record(fleet_env, "wc")["weight_cache"]["pid"] != first and first not in daemon_pids(fleet_env)
    assert "Loaded model via IPC" in (fleet_env.host_dir("ct129") / "logs" / "wc.latest.log").read_text()
    # the restart that follows keeps the daemon started again: it holds this torch's weights
    kept = run_cli("restart", "--host", "ct129/wc")
    assert kept.code == 0 and "weight cache daemon kept" in kept.out + kept.err, kept.out + kept.err
    assert run_cli("stop", "--host", "ct129/wc").code == 0 and daemon_pids(fleet_env) == []


def test_the_daemon_of_a_fleet_killed_mid_deploy_is_known_by_its_record(
    fleet_env: simhost.Sandbox, cached: Path
) -> None:
    """fleet is killed (SIGKILL) while its daemon loads: the daemon, recorded before the engine started, is
    this deployment's, not a foreign GPU holder; the next deploy keeps it and maps its weights (one load
    from disk in all), and `fleet stop` ends it."""
    simhost.set_host(fleet_env.host_dir("ct129"), load_s_per_gib=0.2)  # about 5 s: time to be killed in
    state = simhost.record(fleet_env.host_dir("ct129"), "state.json", "wc")
    with Background([str(Path(sys.executable).parent / "fleet"), "deploy", "wc", "--host", "ct129"]) as fleet:
        assert wait_until(
            lambda: state.exists() and (json.loads(state.read_text()).get("weight_cache") or {}).get("pid"), timeout=30
        )
        fleet.proc.kill()
    daemon = record(fleet_env, "wc")["weight_cache"]["pid"]
    assert daemon in daemon_pids(fleet_env)
    # the killed run's step on the host finishes its launch, then lets the lock go (exit 5 until then)
    deploys: list = []
    assert wait_until(lambda: deploys.append(run_cli("deploy", "wc", "--host", "ct129")) or deploys[-1].code != 5, 60)
    r = deploys[-1]
    out = r.out + r.err
    assert r.code == 0 and "weight cache daemon kept" in out and "will not kill" not in out, out
    assert record(fleet_env, "wc")["weight_cache"]["pid"] == daemon and disk_loads(fleet_env) <= 2
    daemon_logs = list((fleet_env.host_dir("ct129") / "logs").glob(f"*{DAEMON_LOG_SUFFIX}-*.log"))
    assert sum("Loading model from disk" in p.read_text() for p in daemon_logs) == 1
    assert run_cli("stop", "--host", "ct129/wc").code == 0 and daemon_pids(fleet_env) == []
