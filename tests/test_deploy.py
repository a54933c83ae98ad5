"""`fleet deploy` and friends end to end: real sshd, simulated GPU hosts, real processes, real HTTP."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import BLACKWELL, CT129, ROOT, Background, run_cli
from fleet_testbed import simhost
from simengine import client_connected, wait_until

pytestmark = pytest.mark.ssh


@pytest.fixture
def playbooks(fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped playbooks plus the test's own, in one directory fleet reads."""
    d = tmp_path / "playbooks"
    shutil.copytree(ROOT / "playbooks", d)
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(d))
    return d


def add_playbook(d: Path, name: str, base: str, extra: str) -> str:
    (d / f"{name}.yaml").write_text((d / f"{base}.yaml").read_text() + extra)
    return name


def remote(sb: simhost.Sandbox, spec: simhost.HostSpec, command: str) -> str:
    return subprocess.run([*simhost.ssh_argv(sb, spec), command], capture_output=True, text=True, timeout=30).stdout


def state(sb: simhost.Sandbox, name: str, deployment: str | None = None) -> dict:
    """The newest deployment record on the host, or `deployment`'s."""
    if deployment is not None:
        return json.loads(simhost.record(sb.host_dir(name), "state.json", deployment).read_text())
    return json.loads(simhost.newest_record(sb.host_dir(name)).read_text())


def engine_pids(sb: simhost.Sandbox, spec: simhost.HostSpec) -> list[int]:
    out = remote(sb, spec, "pgrep -f '[s]glang.launch_server|[s]glang::' || true")
    return sorted(int(x) for x in out.split())


def test_the_motivating_story_fixes_two_crashes_then_remembers(fleet_env: simhost.Sandbox) -> None:
    r = run_cli("deploy", "qwen35-nvfp4-handwritten", "--host", "blackwell", "--no-engine-check", "--json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert [a["outcome"] for a in out["attempts"]] == ["crashed", "crashed", "ready"]
    assert [a["diagnosis"]["category"] for a in out["attempts"][:2]] == ["spec_decode_hybrid_mamba", "invalid_flags"]
    assert out["new_fixes"] == ["sglang-spec-hybrid-no-buffer", "sglang-spec-params-incomplete"]
    progress = [json.loads(line) for line in r.err.splitlines()]  # --json: progress as JSON lines on stderr
    said = [e["event"] for e in progress if e["event"] != "log"]
    assert said.count("relaunching") == 2 and said[-1] == "ready"
    assert [e["signature"] for e in progress if e["event"] == "relaunching"] == out["new_fixes"]
    assert {e["host"] for e in progress} == {"blackwell"}
    argv = out["argv"]
    assert argv[argv.index("--mamba-scheduler-strategy") + 1] == "extra_buffer"
    assert argv[argv.index("--speculative-num-steps") + 1] == "1"
    st = state(fleet_env, "blackwell")
    assert st["status"] == "ready" and st["attempts"] == 3
    status, body = _chat(BLACKWELL.address, "What is the capital of France?")
    assert status == 200 and "Paris" in body

    assert run_cli("stop", "--host", "blackwell").code == 0
    again = json.loads(run_cli("deploy", "qwen35-nvfp4-handwritten", "--host", "blackwell", "--json").out)
    assert again["ok"] and len(again["attempts"]) == 1
    assert again["learned_applied"] == ["sglang-spec-hybrid-no-buffer", "sglang-spec-params-incomplete"]
    plan = run_cli("plan", "qwen35-nvfp4-handwritten", "--host", "blackwell", "--json")
    assert json.loads(plan.out)["plan"]["applied_fixes"] == again["learned_applied"]


def test_engine_check_rejects_before_anything_is_stopped(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen35-nvfp4", "--host", "blackwell").code == 0
    running = state(fleet_env, "blackwell")["pid"]
    # another deployment on the same GPUs: --replace stops the first, once the new plan passed its check
    r = run_cli("deploy", "qwen35-nvfp4-handwritten", "--host", "blackwell", "--replace")
    assert r.code == 0, r.err
    assert r.err.count("re-checking (nothing was stopped)") == 2
    assert r.err.count("engine's own argument check: rejected") == 2
    assert r.err.index("engine's own argument check: accepted") < r.err.index(
        "stopped deployment qwen35-nvfp4's server (--replace)"
    )
    assert state(fleet_env, "blackwell")["pid"] != running
    replaced = json.loads(simhost.record(fleet_env.host_dir("blackwell"), "state.json", "qwen35-nvfp4").read_text())
    assert replaced["status"] == "stopped" and replaced["reason"] == "replaced by deployment qwen35-nvfp4-handwritten"


def test_a_plan_the_engine_rejects_leaves_the_running_server_and_its_record_alone(
    fleet_env: simhost.Sandbox, playbooks: Path
) -> None:
    """Giving up after the engine's own check refused every command line stopped the old, working server."""
    assert run_cli("deploy", "qwen35-nvfp4", "--host", "blackwell").code == 0
    before = state(fleet_env, "blackwell")
    hand = add_playbook(playbooks, "hand", "qwen35-nvfp4-handwritten", "max_attempts: 1\n")
    r = run_cli("deploy", hand, "--host", "blackwell", "--name", "qwen35-nvfp4")
    assert r.code == 4 and "engine's own argument check: rejected" in r.err  # pre-flight: nothing changed
    assert "before anything on the host was stopped" in r.err
    after = state(fleet_env, "blackwell")
    assert (after["status"], after["pid"]) == ("ready", before["pid"])
    assert json.loads(run_cli("status", "--host", "blackwell", "--json").out)["status"] == "ready"


def test_the_deploy_shows_what_the_engine_resolved_for_the_settings_the_plan_left_to_it(
    fleet_env: simhost.Sandbox,
) -> None:
    """The engine's own check reports its resolution (on the host's GPUs), shown before anything stops."""
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 0, r.err
    said = next(line for line in r.err.splitlines() if "the engine resolved:" in line)
    assert "mamba strategy extra_buffer" in said and "speculative EAGLE" in said and "memory fraction 0.717" in said
    assert r.err.index("the engine resolved:") < r.err.index("launched")


def test_a_memory_fraction_the_engine_resolves_too_small_refuses_before_the_running_server_is_stopped(
    fleet_env: simhost.Sandbox,
) -> None:
    """Issue 42 item 1 on a real act step: the engine's own check resolves mem_fraction_static on the host
    (here a version whose heuristic leaves 0.2 of each 48 GB GPU), less than the weights need: refused
    before the running server is stopped, with the engine's number and what to do."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    before = state(fleet_env, "ct129")
    # a build whose own heuristic leaves less than fleet's formula counted (the simulator's engine_picks)
    simhost.set_host(fleet_env.host_dir("ct129"), engine_picks={"--mem-fraction-static": "0.2"})
    plan = run_cli("deploy", "qwen36-27b", "--host", "ct129", "--name", "second", "--gpus", "0,1", "--replace")
    assert plan.code == 4, plan.err
    assert "the engine's own check resolved mem_fraction_static 0.2 on this host: 9.6 GiB" in plan.err
    after = state(fleet_env, "ct129")
    assert (after["status"], after["pid"]) == ("ready", before["pid"])  # the old server serves on


def test_an_engine_whose_own_pick_fails_here_gets_fleets_flag_before_anything_is_stopped(
    fleet_env: simhost.Sandbox, playbooks: Path
) -> None:
    """Issue #24, rules keyed on what the engine decides: fleet's table says SGLang 0.5.11 picks flashinfer
    for a hybrid model on SM120 itself, so the plan leaves attention to it. This host's engine (another
    build) picks trtllm_mha, whose prefill exists only on SM100: its check says so before anything is
    stopped, fleet plans again with flashinfer and remembers the engine's word, so the next deploy adopts
    that server instead of relaunching it."""
    assert run_cli("deploy", "qwen36-27b", "--host", "blackwell", "--gpus", "6,7", "--name", "small").code == 0
    small = state(fleet_env, "blackwell", "small")["pid"]
    simhost.set_host(fleet_env.host_dir("blackwell"), engine_picks={"--attention-backend": "trtllm_mha"})
    other = add_playbook(playbooks, "other", "qwen36-27b", "gpus: [0, 1]\n")
    assert "--attention-backend" not in run_cli("plan", other, "--host", "blackwell").out
    checked = run_cli("plan", other, "--host", "blackwell", "--check")  # says what a deploy would do
    assert checked.code == 0 and "the engine picks attention trtllm_mha itself here" in checked.out, checked.out
    assert "+--attention-backend flashinfer" in checked.out
    r = run_cli("deploy", other, "--host", "blackwell")
    assert r.code == 0, r.err
    assert "the engine picks attention trtllm_mha itself here" in r.err
    assert "+--attention-backend flashinfer" in r.err
    assert r.err.index("planned again") < r.err.index("launched")  # asked before anything changed
    assert r.err.count(": attempt 1/") == 1  # planned again within the first attempt, not a second one
    st = state(fleet_env, "blackwell", other)
    argv = st["plan"]["argv"]
    assert st["status"] == "ready" and argv[argv.index("--attention-backend") + 1] == "flashinfer"
    flag = next(f for f in st["plan"]["flags"] if f["flag"] == "--attention-backend")
    assert "told by SGLang 0.5.11's check on this host" in flag["replaces"] and "fails here" in flag["replaces"]
    assert state(fleet_env, "blackwell", "small")["pid"] == small  # another deployment was never touched
    # remembered: `fleet plan` and the next deploy stand on the engine's word, and the server is adopted
    assert "--attention-backend flashinfer" in run_cli("plan", other, "--host", "blackwell").out
    again = run_cli("deploy", other, "--host", "blackwell")
    assert again.code == 0 and "planned again" not in again.err and "launched" not in again.err, again.err
    # a plan whose flags the engine's own pick agrees with stands as it is: asked, and not made again
    simhost.set_host(fleet_env.host_dir("blackwell"), engine_picks={})
    assert run_cli("stop", "--host", f"blackwell/{other}").code == 0
    r = run_cli("deploy", other, "--host", "blackwell")
    assert r.code == 0 and "planned again" not in r.err, r.err


def test_an_engine_that_picks_another_working_backend_is_pinned_to_its_own_choice(
    fleet_env: simhost.Sandbox,
) -> None:
    """The FP4 GEMM rule writes down SGLang's own choice (0.5.11: flashinfer_cudnn on SM120); an engine
    that resolves another one itself gets that one written down instead of fleet's table's."""
    simhost.set_host(fleet_env.host_dir("blackwell"), engine_picks={"--fp4-gemm-backend": "flashinfer_cutlass"})
    r = run_cli("deploy", "qwen35-nvfp4", "--host", "blackwell")
    assert r.code == 0, r.err
    assert "the engine picks FP4 GEMM flashinfer_cutlass itself here" in r.err
    assert "--fp4-gemm-backend flashinfer_cudnn -> flashinfer_cutlass" in r.err
    argv = state(fleet_env, "blackwell")["plan"]["argv"]
    assert argv[argv.index("--fp4-gemm-backend") + 1] == "flashinfer_cutlass"
    assert argv[argv.index("--moe-runner-backend") + 1] == "flashinfer_cutlass"  # the failing pick still replaced


def _model_copy(sb: simhost.Sandbox, host: str, name: str, **config: object) -> None:
    """A copy of Qwen3.6-27B on a simulated host, its config.json changed by `config`."""
    src, dest = simhost.MODELS / "Qwen3.6-27B", sb.host_dir(host) / "models" / name
    shutil.copytree(src, dest, dirs_exist_ok=True)
    cfg = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**cfg, **config}))
    simhost.write_weights(dest)  # sparse, as the simulated hosts' own


def test_an_architecture_the_engine_does_not_register_is_refused_before_the_running_server_is_stopped(
    fleet_env: simhost.Sandbox, playbooks: Path
) -> None:
    """SGLang's argument check alone passed it (0.5.23 only parses), and the model load failed after the
    old server was stopped; now the check also resolves the architecture as SGLang's loader does."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    before = state(fleet_env, "ct129")
    _model_copy(fleet_env, "ct129", "Made-Up-27B", architectures=["MadeUpForCausalLM"])
    pb = add_playbook(playbooks, "made-up", "qwen36-27b", "")
    (playbooks / f"{pb}.yaml").write_text((playbooks / f"{pb}.yaml").read_text().replace("Qwen3.6-27B", "Made-Up-27B"))
    r = run_cli("deploy", pb, "--host", "ct129", "--replace")
    assert r.code == 4, r.err
    assert "'MadeUpForCausalLM' is not a registered model" in r.err  # the engine's own words
    assert "unknown_architecture" in r.err and "before anything on the host was stopped" in r.err
    after = state(fleet_env, "ct129")
    assert (after["status"], after["pid"]) == ("ready", before["pid"])
    # without the check the simulated engine fails the same way at load, as SGLang does
    r = run_cli("deploy", pb, "--host", "ct129", "--replace", "--no-engine-check")
    assert r.code == 7 and "'MadeUpForCausalLM' is not a registered model" in r.err


def test_a_model_with_its_own_code_runs_it_only_when_the_playbook_allows(
    fleet_env: simhost.Sandbox, playbooks: Path
) -> None:
    """config.json's auto_map: without trust_remote_code the plan warns and the engine's check refuses it
    (transformers' own refusal, raised by resolution reading the config); with it fleet adds
    --trust-remote-code."""
    code = {"AutoConfig": "custom.CustomConfig", "AutoModel": "custom.CustomModel"}
    _model_copy(
        fleet_env, "ct129", "Custom-27B", architectures=["CustomForCausalLM"], model_type="custom", auto_map=code
    )
    pb = add_playbook(playbooks, "custom", "qwen36-27b", "")
    (playbooks / f"{pb}.yaml").write_text((playbooks / f"{pb}.yaml").read_text().replace("Qwen3.6-27B", "Custom-27B"))
    r = run_cli("plan", pb, "--host", "ct129")
    assert "set trust_remote_code: true in the playbook" in r.out + r.err
    assert "--trust-remote-code" not in r.out
    r = run_cli("deploy", pb, "--host", "ct129")
    assert r.code == 4 and "contains custom code which must be executed" in r.err, r.err
    assert "trust_remote_code: true" in r.err  # the diagnosis says how
    (playbooks / f"{pb}.yaml").write_text((playbooks / f"{pb}.yaml").read_text() + "trust_remote_code: true\n")
    r = run_cli("plan", pb, "--host", "ct129")
    assert r.code == 0 and "--trust-remote-code" in r.out and "trust-remote-code" in r.out


def test_a_failed_deploy_keeps_what_its_attempt_recorded(fleet_env: simhost.Sandbox) -> None:
    """The failed record kept no learned key, engine version or pid, so a restart or heal after it used an
    empty learned key (and then saved no learned fixes)."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    good = state(fleet_env, "ct129")
    simhost.set_host(fleet_env.host_dir("ct129"), inject_scheduler_error="RuntimeError: boom")
    assert run_cli("restart", "--host", "ct129").code == 7
    failed = state(fleet_env, "ct129")
    assert failed["status"] == "failed" and failed["learned_key"] == good["learned_key"] != ""
    assert failed["engine_version"] == good["engine_version"] and isinstance(failed["pid"], int)
    assert failed["pid"] != good["pid"] and failed["log"]
    simhost.set_host(fleet_env.host_dir("ct129"), inject_scheduler_error=None)
    assert run_cli("restart", "--host", "ct129").code == 0
    assert state(fleet_env, "ct129")["learned_key"] == good["learned_key"]


def _chat(address: str, prompt: str, port: int = 30000, timeout: float = 5.0) -> tuple[int | None, str]:
    import urllib.request

    req = urllib.request.Request(
        f"http://{address}:{port}/v1/chat/completions",
        data=json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": 8}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())["choices"][0]["message"]["content"]
    except OSError as exc:
        return None, str(exc)


def _start_stale_server(sb: simhost.Sandbox) -> Background:
    h = sb.host_dir("ct129")
    cmd = (
        f"cd /tmp && setsid {h}/env/bin/python -m sglang.launch_server --model-path {h}/models/Qwen3.6-27B "
        f"--host {CT129.address} --port 30000 --tp 2 > /tmp/stale.log 2>&1; sleep 60"
    )
    return Background([*simhost.ssh_argv(sb, CT129), cmd])


def test_stale_server_is_stopped_and_gpus_freed(fleet_env: simhost.Sandbox) -> None:
    with _start_stale_server(fleet_env):
        assert wait_until(lambda: _chat(CT129.address, "hi")[0] == 200)
        stale = engine_pids(fleet_env, CT129)
        assert stale
        r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
        assert r.code == 0, r.err
        assert "stopped inference server pid" in r.err
        assert not set(stale) & set(engine_pids(fleet_env, CT129))


def test_a_gpu_daemon_is_left_running_and_does_not_block_the_deploy(fleet_env: simhost.Sandbox) -> None:
    """nvidia-persistenced holds /dev/nvidia* on most GPU servers, not the GPU's memory: fleet stops the
    stale server around it and never signals it, not even `fleet stop --force`."""
    dev = fleet_env.host_dir("ct129") / "dev" / "nvidia0"
    daemon = fleet_env.host_dir("ct129") / "bin" / "nvidia-persistenced"  # comm: "nvidia-persiste"
    shutil.copy("/bin/sleep", daemon)
    with (
        _start_stale_server(fleet_env),
        Background([*simhost.ssh_argv(fleet_env, CT129), f"exec 3<{dev}; exec {daemon} 60"]),
    ):
        assert wait_until(lambda: "nvidia-persistenced" in remote(fleet_env, CT129, "ps -eo args"))
        assert wait_until(lambda: _chat(CT129.address, "hi")[0] == 200)
        stale = engine_pids(fleet_env, CT129)
        r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
        assert r.code == 0, r.err
        assert "ct129: left running: GPU daemon or tool nvidia-persistenced (pid " in r.err
        assert not set(stale) & set(engine_pids(fleet_env, CT129))  # the stale server was stopped
        assert "nvidia-persistenced" in remote(fleet_env, CT129, "ps -eo args")
        forced = run_cli("stop", "--host", "ct129", "--force")
        assert forced.code == 0, forced.err
        assert "left running: GPU daemon or tool nvidia-persistenced" in forced.out
        assert "nvidia-persistenced" in remote(fleet_env, CT129, "ps -eo args")


DECOYS = "ps -eo user:20,pid,pgid,args | grep '^fleetdecoy .*sleep 60' || true"


@contextlib.contextmanager
def another_users_gpu_job(sb: simhost.Sandbox) -> Iterator[tuple[int, int]]:
    """(pid, pgid) of a process of user fleetdecoy holding a GPU device on ct129."""
    subprocess.run(["useradd", "--system", "--no-create-home", "fleetdecoy"], capture_output=True)
    dev = sb.host_dir("ct129") / "dev" / "nvidia1"
    # opened as root, then the process becomes fleetdecoy's and keeps the descriptor
    cmd = f"exec 3<{dev}; exec setpriv --reuid=fleetdecoy --regid=fleetdecoy --clear-groups sleep 60"
    with Background([*simhost.ssh_argv(sb, CT129), cmd]):
        assert wait_until(lambda: "fleetdecoy" in remote(sb, CT129, DECOYS))
        _, pid, pgid, *_ = remote(sb, CT129, DECOYS).split()
        yield int(pid), int(pgid)


def test_another_users_gpu_process_is_not_killed(fleet_env: simhost.Sandbox) -> None:
    """Placed by fit (the model needs both GPUs), the deploy is refused in pre-flight, naming the user; on
    the GPUs named (--gpus), freeing them refuses; either way the other user's job runs on."""
    with another_users_gpu_job(fleet_env) as (pid, _):
        r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
        assert r.code == 4 and f"GPU 1: pids {pid} (fleetdecoy)" in r.err and "--force" in r.err
        r = run_cli("deploy", "qwen36-27b", "--host", "ct129", "--gpus", "0,1")
        assert r.code == 6 and "process of user fleetdecoy" in r.err
        assert "fleetdecoy" in remote(fleet_env, CT129, DECOYS)


@pytest.mark.parametrize("stale", ["another boot", "another start time"])
def test_a_recorded_process_group_id_reused_by_another_user_gets_no_trust(
    fleet_env: simhost.Sandbox, stale: str
) -> None:
    """state.json keeps the group id of the server fleet launched; after a reboot or a long time that id
    can name another user's GPU job. fleet trusts it (kills beyond its own user) only while it still names
    the group fleet launched: same boot, leader started when fleet launched it."""
    with another_users_gpu_job(fleet_env) as (pid, pgid):
        boot = remote(fleet_env, CT129, "cat /proc/sys/kernel/random/boot_id").strip()
        record = {"status": "ready", "engine": "sglang", "pid": pid, "pgid": pgid, "port": 30000}
        if stale == "another boot":
            record |= {"boot_id": "0" * 8 + boot[8:], "started": time.time()}
        else:
            record |= {"boot_id": boot, "started": time.time() - 3 * 86400, "start_ticks": 1}
        simhost.write_record(fleet_env.host_dir("ct129"), record)
        r = run_cli("deploy", "qwen36-27b", "--host", "ct129", "--gpus", "0,1")  # placed on them: freeing decides
        assert r.code == 6 and "process of user fleetdecoy" in r.err
        assert "fleetdecoy" in remote(fleet_env, CT129, DECOYS)


def test_a_recorded_group_whose_leader_started_within_seconds_of_the_record_is_not_trusted(
    fleet_env: simhost.Sandbox,
) -> None:
    """Pids are reused within seconds: a group started 1 clock tick away from the one fleet recorded, on
    the same boot, is not fleet's (it was trusted within a 30 s tolerance and killed without --force)."""
    with another_users_gpu_job(fleet_env) as (pid, pgid):
        boot = remote(fleet_env, CT129, "cat /proc/sys/kernel/random/boot_id").strip()
        ticks = int(remote(fleet_env, CT129, f"cat /proc/{pgid}/stat").rsplit(")", 1)[1].split()[19])
        record = {"status": "ready", "engine": "sglang", "pid": pid, "pgid": pgid, "port": 30000, "boot_id": boot}
        record |= {"started": time.time(), "start_ticks": ticks + 1}
        simhost.write_record(fleet_env.host_dir("ct129"), record)
        r = run_cli("stop", "--host", "ct129")
        assert r.code == 0 and f"not stopped: pid {pid} (user fleetdecoy" in r.out, r.out + r.err
        assert "fleetdecoy" in remote(fleet_env, CT129, DECOYS)


def test_another_users_process_inside_fleets_own_group_is_named_and_left_alone(fleet_env: simhost.Sandbox) -> None:
    """A wrapper in fleet's recorded group (exact identity) started a job as another user holding a GPU:
    `fleet stop` stops fleet's own processes and refuses the other user's, saying whose it is (it was
    killed as part of "fleet's server (+N in its group)")."""
    subprocess.run(["useradd", "--system", "--no-create-home", "fleetdecoy"], capture_output=True)
    dev = fleet_env.host_dir("ct129") / "dev" / "nvidia1"
    job = (
        f"exec setsid sh -c 'exec 3<{dev}; "
        "setpriv --reuid=fleetdecoy --regid=fleetdecoy --clear-groups sleep 60 & exec sleep 61'"
    )
    with Background([*simhost.ssh_argv(fleet_env, CT129), job]):
        assert wait_until(lambda: "fleetdecoy" in remote(fleet_env, CT129, DECOYS))
        _, decoy, pgid, *_ = remote(fleet_env, CT129, DECOYS).split()
        boot = remote(fleet_env, CT129, "cat /proc/sys/kernel/random/boot_id").strip()
        ticks = int(remote(fleet_env, CT129, f"cat /proc/{pgid}/stat").rsplit(")", 1)[1].split()[19])
        record = {"status": "ready", "engine": "sglang", "pid": int(pgid), "pgid": int(pgid), "port": 30000}
        record |= {"boot_id": boot, "started": time.time(), "start_ticks": ticks}
        simhost.write_record(fleet_env.host_dir("ct129"), record)
        r = run_cli("stop", "--host", "ct129")
        assert r.code == 0, r.err
        assert f"not stopped: pid {decoy} (user fleetdecoy" in r.out, r.out
        assert "fleetdecoy" in remote(fleet_env, CT129, DECOYS)
        assert "sleep 61" not in remote(fleet_env, CT129, "ps -eo args")  # fleet's own leader was stopped


def test_processes_that_only_mention_the_engine_are_never_stopped(fleet_env: simhost.Sandbox) -> None:
    """Same user, no GPU, no port: a `tail -f` of a file named after the engine and a process renamed to
    mention it. Both were killed as stale servers (by `deploy` and by `stop`) when an engine was a word
    in a command line; an engine is now what runs (host_common.engine_kind)."""
    log = fleet_env.host_dir("ct129") / "sglang.launch_server.log"
    log.write_text("")
    tail = f"exec tail -f {log}"
    renamed = "exec -a 'vim notes-on-sglang serve flags.md' sleep 60"
    with (
        Background([*simhost.ssh_argv(fleet_env, CT129), tail]),
        Background([*simhost.ssh_argv(fleet_env, CT129), f"bash -c {json.dumps(renamed)}"]),
    ):
        look = "ps -eo args | grep -E '^(tail -f .*sglang.launch_server.log|vim notes-on-sglang)' || true"
        assert wait_until(lambda: len(remote(fleet_env, CT129, look).splitlines()) == 2)
        assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
        assert run_cli("stop", "--host", "ct129").code == 0
        assert len(remote(fleet_env, CT129, look).splitlines()) == 2


def test_a_deploy_on_all_gpus_stops_nothing_for_its_name_alone(fleet_env: simhost.Sandbox, playbooks: Path) -> None:
    """Same user, no GPU, no port, outside any group fleet runs: a process that only titled itself like an
    SGLang scheduler and a `python -m sglang.srt.<tool>`. A `gpus: all` deploy and its stop stopped both as
    "inference servers" (issue 39); what is in a deployment's way is what holds its GPUs or port."""
    import sys

    name = add_playbook(playbooks, "whole", "qwen36-27b", "gpus: all\n")
    fake = fleet_env.root / "fake-sglang"
    (fake / "sglang" / "srt").mkdir(parents=True, exist_ok=True)
    for init in (fake / "sglang" / "__init__.py", fake / "sglang" / "srt" / "__init__.py"):
        init.write_text("")
    (fake / "sglang" / "srt" / "some_tool.py").write_text("import time\ntime.sleep(60)\n")
    title = 'import setproctitle; setproctitle.setproctitle("sglang::scheduler_TP0")'
    titled = f"{sys.executable} -c '{title}; import time; time.sleep(60)'"
    tool = f"cd {fake} && exec {sys.executable} -m sglang.srt.some_tool"
    with (
        Background([*simhost.ssh_argv(fleet_env, CT129), f"exec {titled}"]),
        Background([*simhost.ssh_argv(fleet_env, CT129), tool]),
    ):
        look = "ps -eo pid=,args= | grep -E '^ *[0-9]+ (sglang::scheduler_TP0|.*-m sglang.srt.some_tool)$' || true"
        assert wait_until(lambda: len(remote(fleet_env, CT129, look).splitlines()) == 2)
        pids = " ".join(line.split()[0] for line in remote(fleet_env, CT129, look).splitlines())
        r = run_cli("deploy", name, "--host", "ct129")
        assert r.code == 0, r.err
        assert remote(fleet_env, CT129, f"kill -0 {pids} && echo both-alive").strip() == "both-alive"
        assert run_cli("stop", "--host", "ct129").code == 0
        assert remote(fleet_env, CT129, f"kill -0 {pids} && echo both-alive").strip() == "both-alive"


def test_logs_and_diagnose_redact_secrets_and_strip_terminal_controls(
    fleet_env: simhost.Sandbox, playbooks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine may echo a token into its log, and anyone who writes the log can write escape sequences
    (window title, clipboard): neither reaches the operator's terminal through `logs` or `diagnose`."""
    token = "hf_SECRETtoken1234567890"
    monkeypatch.setenv("HF_TOKEN", token)
    name = add_playbook(playbooks, "withtoken", "qwen36-27b", "secret_env: [HF_TOKEN]\n")
    assert run_cli("deploy", name, "--host", "ct129").code == 0
    with open(state(fleet_env, "ct129")["log"], "a") as f:
        f.write(f"using token {token}\n\x1b]0;owned\x07\x1b]52;c;ZWNobw==\x07\x1b[2Jafter\n")
    for argv in (["logs", "--host", "ct129", "-n", "5"], ["diagnose", "--host", "ct129", "--json"]):
        r = run_cli(*argv)
        assert r.code == 0 and token not in r.out + r.err, argv
    logs = run_cli("logs", "--host", "ct129", "-n", "5").out
    assert "using token ***" in logs and "after" in logs and "\x1b" not in logs and "\x07" not in logs
    assert "\x1b]0;owned" in run_cli("logs", "--host", "ct129", "-n", "5", "--raw").out  # asked for raw
    with open(state(fleet_env, "ct129")["log"], "a") as f:  # a crash line reaches health's evidence
        f.write(f"RuntimeError: \x1b]0;owned\x07\x1b[2Jboom with {token}\n")
    health = run_cli("health", "--host", "ct129", "--skip-generation")
    assert "boom" in health.out and "\x1b" not in health.out + health.err, health.out
    assert token not in health.out + health.err


def test_another_users_job_that_looks_like_an_engine_and_carries_escapes_is_left_and_shown_inert(
    fleet_env: simhost.Sandbox,
) -> None:
    """A hostile or unlucky neighbour: another user's process on a GPU, named like an SGLang server, its
    command line carrying an API key, a newline and terminal escapes. `fleet stop` stops fleet's server,
    leaves that job running, says whose it is without offering --force as the way, masks the key and
    prints no control character."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    subprocess.run(["useradd", "--system", "--no-create-home", "fleetdecoy"], capture_output=True)
    dev = fleet_env.host_dir("ct129") / "dev" / "nvidia1"
    name = "python -m sglang.launch_server --api-key sk-neighbour-42 \x1b]0;owned\x07\x1b[2J\nsecond line"
    as_decoy = "setpriv --reuid=fleetdecoy --regid=fleetdecoy --clear-groups"
    job = f"exec 3<{dev}; exec {as_decoy} bash -c 'exec -a \"$0\" sleep 60' \"$(printf '{name}')\""
    find = "pgrep -u fleetdecoy -x sleep || true"
    with Background([*simhost.ssh_argv(fleet_env, CT129), job]):
        assert wait_until(lambda: remote(fleet_env, CT129, find).strip() != "")
        pid = int(remote(fleet_env, CT129, find).split()[0])
        r = run_cli("stop", "--host", "ct129")
        assert r.code == 0, r.err
        said = r.out + r.err
        assert f"not stopped: pid {pid} (user fleetdecoy" in said and "another user's job: ask them" in said
        assert "sk-neighbour-42" not in said and "\x1b" not in said and "\x07" not in said
        assert "--force stops it" not in said
        assert str(pid) in remote(fleet_env, CT129, find)  # still running
        assert state(fleet_env, "ct129")["status"] == "stopped"


def test_stop_stops_fleets_own_server_while_another_users_job_holds_a_gpu(fleet_env: simhost.Sandbox) -> None:
    """Stopping fleet's own server never needs --force (it used to exit 6 and leave the server running,
    offering only --force, which would have killed the other user's job)."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    with another_users_gpu_job(fleet_env) as (pid, _):
        r = run_cli("stop", "--host", "ct129")
        assert r.code == 0, r.err
        assert "stopped inference server" in r.out or "fleet's server" in r.out, r.out
        assert f"not stopped: pid {pid} (user fleetdecoy" in r.out and "another user's job: ask them" in r.out
        assert engine_pids(fleet_env, CT129) == [] and _chat(CT129.address, "hi")[0] is None
        assert "fleetdecoy" in remote(fleet_env, CT129, DECOYS)
        assert state(fleet_env, "ct129")["status"] == "stopped"


def test_unknown_crash_fails_fast_with_the_traceback(fleet_env: simhost.Sandbox) -> None:
    simhost.set_host(fleet_env.host_dir("ct129"), inject_scheduler_error="RuntimeError: CUBLAS_STATUS_WEIRD in gemm")
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 7
    assert "FAILED after 1 attempt(s): unknown failure" in r.err
    assert "RuntimeError: CUBLAS_STATUS_WEIRD in gemm" in r.err
    assert "Traceback (most recent call last):" in r.err
    assert state(fleet_env, "ct129")["status"] == "failed"
    assert not simhost.record(fleet_env.host_dir("ct129"), "lock.json").exists()


def test_same_signature_after_its_fix_gives_up(fleet_env: simhost.Sandbox) -> None:
    simhost.set_host(
        fleet_env.host_dir("ct129"),
        inject_scheduler_error=(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
            "mem_fraction_static=0.85"
        ),
    )
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129", "--json")
    out = json.loads(r.out)
    assert r.code == 7 and not out["ok"]
    assert [a["diagnosis"]["signature"] for a in out["attempts"]] == ["sglang-kv-not-enough-memory"] * 2
    assert out["reason"] == "sglang-kv-not-enough-memory came back after its fix was applied"
    assert not engine_pids(fleet_env, CT129)


def test_weights_that_cannot_fit_are_refused_before_anything_changes(
    fleet_env: simhost.Sandbox, playbooks: Path
) -> None:
    name = add_playbook(playbooks, "tight", "qwen36-27b", "mem_fraction: 0.55\n")
    r = run_cli("deploy", name, "--host", "ct129")
    assert r.code == 4
    assert "tight on ct129: weights need 25.9 GiB per GPU at TP 2, more than 24.4 GiB" in r.err
    assert "Nothing on the host was changed." in r.err
    assert not simhost.record(fleet_env.host_dir("ct129"), "state.json").exists()


def test_a_state_directory_the_host_cannot_write_stops_before_anything_changes(
    fleet_env: simhost.Sandbox, tmp_path: Path
) -> None:
    """The lock is the host-side step's first write: where it cannot be taken (a state_dir under /proc, on
    a read-only mount) the running server is left alone and the setting is named (was a remote traceback)."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    running = json.loads(run_cli("status", "--host", "ct129", "--json").out)
    inventory = tmp_path / "hosts.yaml"
    state_dir = str(fleet_env.host_dir("ct129") / "state")
    inventory.write_text(fleet_env.inventory.read_text().replace(state_dir, "/proc/fleet-state"))
    for argv in (("deploy", "qwen36-27b", "--host", "ct129", "--no-engine-check"), ("stop", "--host", "ct129")):
        r = run_cli("-i", str(inventory), *argv)
        assert r.code == 4 and "state directory /proc/fleet-state on the host cannot be written" in r.err + r.out
        assert "Set state_dir: for this host" in r.err + r.out and "Traceback" not in r.err + r.out
    after = json.loads(run_cli("status", "--host", "ct129", "--json").out)
    assert (after["status"], after["pid"]) == ("ready", running["pid"])


@pytest.fixture
def immutable_dir(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A directory not even root can create files in (chattr +i), as a read-only mount is."""
    path = tmp_path / "immutable"
    path.mkdir()
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a filesystem that has it)")
    yield path
    subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_log_directory_the_host_cannot_write_leaves_the_running_server_alone(
    fleet_env: simhost.Sandbox, tmp_path: Path, immutable_dir: Path
) -> None:
    """Found only when launching, it left the host with its old server stopped and none started."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    running = json.loads(run_cli("status", "--host", "ct129", "--json").out)
    inventory = tmp_path / "hosts.yaml"
    logs = str(fleet_env.host_dir("ct129") / "logs")
    inventory.write_text(fleet_env.inventory.read_text().replace(logs, str(immutable_dir)))
    r = run_cli("-i", str(inventory), "restart", "--host", "ct129")
    assert r.code == 4 and f"the log directory {immutable_dir} on the host cannot be written" in r.err + r.out
    assert "Nothing on the host was changed" in r.err + r.out and "Traceback" not in r.err + r.out
    after = json.loads(run_cli("status", "--host", "ct129", "--json").out)
    assert (after["status"], after["pid"]) == ("ready", running["pid"])
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0  # the lock was released


def test_garbage_output_is_caught_by_the_smoke_check_and_fixed(fleet_env: simhost.Sandbox, playbooks: Path) -> None:
    name = add_playbook(
        playbooks, "cutedsl", "qwen35-nvfp4", "extra_args: [--moe-runner-backend, flashinfer_cutedsl]\n"
    )
    out = json.loads(run_cli("deploy", name, "--host", "blackwell", "--json").out)
    assert out["ok"]
    first = out["attempts"][0]
    assert (first["outcome"], first["diagnosis"]["category"]) == ("smoke_failed", "garbage_output")
    assert first["diagnosis"]["signature"] == "sm120-cutedsl-garbage"
    assert out["argv"][out["argv"].index("--moe-runner-backend") + 1] == "flashinfer_cutlass"


def test_concurrent_deploys_to_one_host_exactly_one_acts(fleet_env: simhost.Sandbox) -> None:
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=4.0)
    results: list = []
    first = threading.Thread(target=lambda: results.append(run_cli("deploy", "qwen36-27b", "--host", "ct129")))
    first.start()
    assert wait_until(lambda: simhost.record(fleet_env.host_dir("ct129"), "lock.json").exists())
    second = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    first.join()
    assert second.code == 5 and "ct129: locked by" in second.err and "(deploy" in second.err
    assert results[0].code == 0


def test_stop_frees_the_port_and_leaves_no_process(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    r = run_cli("stop", "--host", "ct129")
    assert r.code == 0 and "ct129: stopped" in r.out
    assert engine_pids(fleet_env, CT129) == []
    assert _chat(CT129.address, "hi")[0] is None
    assert state(fleet_env, "ct129")["status"] == "stopped"
    status = json.loads(run_cli("status", "--host", "ct129", "--all", "--json").out)
    assert status["status"] == "stopped" and status["pid"] is None
    hidden = json.loads(run_cli("status", "--host", "ct129", "--json").out)  # running ones only, by default
    assert (hidden["status"], hidden["stopped_left_out"]) == ("none", 1)
    # over sshd, as an operator types it: a stopped deployment is forgotten, and status no longer lists it
    forgot = run_cli("forget", "ct129/qwen36-27b")
    assert forgot.code == 0 and "forgot deployment qwen36-27b" in forgot.out, forgot.err
    assert json.loads(run_cli("status", "--host", "ct129", "--json").out)["status"] == "none"


def _server_log(sb: simhost.Sandbox, name: str) -> str:
    return Path(state(sb, name)["log"]).read_text()


def test_an_idle_sglang_server_is_killed_at_once_not_left_to_its_watchdog(fleet_env: simhost.Sandbox) -> None:
    # engines.md §3.3: after SIGTERM an idle SGLang still waits for its watchdog's next 5 s tick.
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    log_before = _server_log(fleet_env, "ct129")
    r = run_cli("stop", "--host", "ct129")
    assert r.code == 0 and "idle: killed at once" in r.out, r.out
    assert engine_pids(fleet_env, CT129) == []
    assert "SIGTERM received" not in log_before + Path(state(fleet_env, "ct129")["log"]).read_text()


def test_a_request_in_flight_is_drained_before_the_server_stops(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    # long enough to outlive the stop's round trips on a loaded machine plus one watchdog tick (5 s x 0.3)
    simhost.set_host(fleet_env.host_dir("ct129"), generation_delay_s=6.0)
    answers: list[tuple[int | None, str]] = []
    client = threading.Thread(
        target=lambda: answers.append(_chat(CT129.address, "What is the capital of France?", timeout=30))
    )
    try:
        client.start()
        assert wait_until(lambda: client_connected(30000), 5)
        r = run_cli("stop", "--host", "ct129")
        client.join(timeout=30)
    finally:
        simhost.set_host(fleet_env.host_dir("ct129"), generation_delay_s=None)
    assert r.code == 0 and "SIGTERM, drained" in r.out, r.out
    assert answers and answers[0][0] == 200 and "Paris" in answers[0][1]
    text = _server_log(fleet_env, "ct129")
    assert "SIGTERM received" in text
    assert text.index("Remaining number of requests 1.") < text.index("Remaining number of requests 0.")
    assert engine_pids(fleet_env, CT129) == []


def test_deploying_the_plan_that_already_runs_checks_it_and_restarts_nothing(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    before = engine_pids(fleet_env, CT129)
    pid = state(fleet_env, "ct129")["pid"]
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 0, r.err
    assert "already runs this plan; checked it instead of restarting it" in r.err
    assert "generation: answer ' Paris.'" in r.err and "nothing was restarted" in r.out
    out = json.loads(run_cli("deploy", "qwen36-27b", "--host", "ct129", "--json").out)
    assert out["ok"] and out["adopted"] and out["attempts"] == []
    assert out["round_trips"] == 2  # facts, then the health check with the smoke prompt
    assert engine_pids(fleet_env, CT129) == before and state(fleet_env, "ct129")["pid"] == pid


def test_a_damaged_record_is_set_aside_and_the_host_redeployed(fleet_env: simhost.Sandbox) -> None:
    """state.json edited into a list: `restart` says the record is damaged (was a KeyError traceback),
    `health` names it, and the next deploy sets it aside (renamed, not deleted) and writes a good one."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    record = simhost.record(fleet_env.host_dir("ct129"), "state.json")
    record.write_text("[1, 2]")
    (fleet_env.host_dir("ct129") / "state" / "health.json").write_text('"not a mapping"')
    r = run_cli("restart", "--host", "ct129")
    assert r.code in (1, 2) and "Traceback" not in r.err, r.err
    out = json.loads(run_cli("health", "--host", "ct129", "--json", "--skip-generation").out)
    assert any("not a JSON object" in c["detail"] for c in out["checks"]), out["checks"]
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    assert state(fleet_env, "ct129")["status"] == "ready"
    assert [p.read_text() for p in record.parent.glob("state.json.corrupt-*")] == ["[1, 2]"]
    health_book = fleet_env.host_dir("ct129") / "state"  # the host's health bookkeeping, beside the deployments
    assert [p.read_text() for p in health_book.glob("health.json.corrupt-*")] == ['"not a mapping"']


def test_a_running_server_that_fails_its_check_is_replaced(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    old = state(fleet_env, "ct129")["pid"]
    simhost.set_host(fleet_env.host_dir("ct129"), generation_http_500=True)
    try:
        r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    finally:
        simhost.set_host(fleet_env.host_dir("ct129"), generation_http_500=None)
    assert "has this plan but fails: generation: wrong or no answer: HTTP 500" in r.err
    assert "stopped fleet's server pid" in r.err and "launched pid" in r.err
    assert old not in engine_pids(fleet_env, CT129)


def test_a_changed_plan_is_deployed_not_adopted(fleet_env: simhost.Sandbox, playbooks: Path) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    old = state(fleet_env, "ct129")["pid"]
    name = add_playbook(playbooks, "q36-ctx", "qwen36-27b", "context_length: 65536\n")
    r = run_cli("deploy", name, "--host", "ct129", "--name", "qwen36-27b", "--json")  # a new plan, same deployment
    assert r.code == 0, r.err
    out = json.loads(r.out)
    assert not out["adopted"] and len(out["attempts"]) == 1
    assert old not in engine_pids(fleet_env, CT129)


def test_the_engine_check_is_skipped_for_a_command_line_that_already_ran_here(fleet_env: simhost.Sandbox) -> None:
    first = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert first.code == 0 and "engine's own argument check: accepted" in first.err
    assert run_cli("stop", "--host", "ct129").code == 0
    again = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert again.code == 0, again.err
    assert "engine's own argument check: not needed (this command line ran with 0.5.11 here)" in again.err
    assert "argument check: accepted" not in again.err


def test_restart_runs_the_recorded_plan_again(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    before = state(fleet_env, "ct129")
    r = run_cli("restart", "--host", "ct129")
    assert r.code == 0, r.err
    after = state(fleet_env, "ct129")
    assert after["pid"] != before["pid"] and after["status"] == "ready"
    assert after["plan"]["argv"] == before["plan"]["argv"]


def test_timeline_shows_a_deployments_starts_phase_by_phase_with_their_median(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    assert run_cli("restart", "--host", "ct129").code == 0
    r = run_cli("timeline", "ct129/qwen36-27b")
    assert r.code == 0, r.err
    heading, header, *rows = r.out.splitlines()
    assert (
        heading.startswith("ct129/qwen36-27b: ")
        and "sglang 0.5.11 on GPUs 0,1 (this deployment's; 2 starts)" in heading
    )
    assert header.split() == [
        "when",
        "outcome",
        "total",
        "distributed",
        "weights",
        "kv_cache",
        "graphs",
        "warmup",
        "fixes",
    ]
    assert [row.split()[2] for row in rows[:2]] == ["ready", "ready"]
    assert rows[2].split()[:4] == ["median", "of", "2", "ready"] and len(rows) == 3
    starts = [json.loads(line) for line in run_cli("timeline", "ct129", "--json").out.splitlines()]
    assert [(s["deployment"], s["outcome"], s["current"]) for s in starts] == [("qwen36-27b", "ready", True)] * 2
    assert starts[0]["at"] < starts[1]["at"] and set(starts[0]["phases"]) == set(header.split()[3:-1])
    missing = run_cli("timeline", "ct129/nope")
    assert missing.code == 2 and "no deployment named nope (deployments there: qwen36-27b)" in missing.err


def test_status_logs_and_diagnose_of_a_running_host(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    rows = [json.loads(line) for line in run_cli("status", "--json").out.splitlines()]
    by_host = {r["host"]: r for r in rows}
    assert by_host["ct129"]["status"] == "ready" and by_host["ct129"]["engine_version"] == "0.5.11"
    assert by_host["blackwell"]["status"] == "none"
    logs = run_cli("logs", "--host", "ct129", "-n", "5")
    assert "The server is fired up and ready to roll!" in logs.out
    d = json.loads(run_cli("diagnose", "--host", "ct129", "--json").out)
    assert d["category"] == "healthy"


def test_logs_of_several_hosts_are_prefixed_and_follow_a_restart(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    assert run_cli("deploy", "qwen36-27b", "--host", "blackwell", "--gpus", "2").code == 0
    both = run_cli("logs", "-H", "ct129/qwen36-27b", "-H", "blackwell", "-n", "3")
    assert both.code == 0 and both.err == "", both.err
    prefixes = {line.split(" | ", 1)[0] for line in both.out.splitlines()}
    assert prefixes == {"ct129/qwen36-27b", "blackwell/qwen36-27b"}  # the newest there, named by its deployment
    follow = subprocess.Popen(
        [str(Path(sys.executable).parent / "fleet"), "--debug", "logs", "-H", "ct129", "-f", "-n", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(120, follow.kill)  # a follow that never shows the restart must not hang the suite
    timer.start()
    try:
        assert follow.stdout is not None and follow.stderr is not None and follow.stdout.readline()
        assert run_cli("restart", "--host", "ct129").code == 0
        marker = follow.stderr.readline()
        assert marker.startswith("fleet: ct129/qwen36-27b restarted; following its new log qwen36-27b-"), marker
        after = iter(follow.stdout.readline, "")
        assert any("The server is fired up and ready to roll!" in line for line in after)  # the new attempt's
    finally:
        timer.cancel()
        follow.send_signal(signal.SIGINT)
        _, err = follow.communicate(timeout=30)  # within fleet.cli.prompt_end's bound, wherever it was
    if "ended now" in err:  # a hang after Ctrl-C that the watchdog ended: where it was stuck, for the record
        warnings.warn(f"fleet logs -f needed its interrupt watchdog:\n{err[-4000:]}", stacklevel=1)


def test_logs_of_a_host_never_deployed_say_so(fleet_env: simhost.Sandbox) -> None:
    for argv in (["logs", "--host", "blackwell"], ["diagnose", "--host", "blackwell"]):
        r = run_cli(*argv)
        assert r.code == 1 and r.out == ""
        assert "blackwell: no server log in" in r.err and "fleet deploy PLAYBOOK --host blackwell" in r.err


def test_secrets_never_reach_argv_state_or_output(
    fleet_env: simhost.Sandbox, playbooks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "hf_SECRETtoken1234567890"
    monkeypatch.setenv("HF_TOKEN", token)
    name = add_playbook(playbooks, "withtoken", "qwen36-27b", "secret_env: [HF_TOKEN]\n")
    r = run_cli("deploy", name, "--host", "ct129", "--json", "--show-log")
    assert r.code == 0, r.err
    assert token not in r.out + r.err
    assert token not in remote(fleet_env, CT129, "ps -eo args")
    host_files = "".join(p.read_text(errors="replace") for p in fleet_env.host_dir("ct129").glob("*/*") if p.is_file())
    assert token not in host_files
    pid = state(fleet_env, "ct129")["pid"]
    engine = remote(fleet_env, CT129, f"pgrep -P {pid}").split()[0]
    assert f"HF_TOKEN={token}" in remote(fleet_env, CT129, f"tr '\\0' '\\n' < /proc/{engine}/environ")
    plan = run_cli("plan", name, "--host", "ct129", "--json")
    assert token not in plan.out


def test_files_fleet_writes_on_the_host_are_private(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    h = fleet_env.host_dir("ct129")
    for path in [simhost.record(h, "state.json"), *(h / "logs").glob("*.log")]:
        if not path.is_symlink():
            assert path.stat().st_mode & 0o077 == 0, path


def test_missing_secret_is_a_clear_error_before_anything_runs(
    fleet_env: simhost.Sandbox, playbooks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    name = add_playbook(playbooks, "needstoken", "qwen36-27b", "secret_env: [HF_TOKEN]\n")
    r = run_cli("deploy", name, "--host", "ct129")
    assert r.code == 2 and "secret_env lists HF_TOKEN, which is not set in your environment" in r.err
    assert not simhost.record(fleet_env.host_dir("ct129"), "state.json").exists()


def test_a_hostile_engine_pick_never_reaches_the_terminal_or_the_learned_record(fleet_env: simhost.Sandbox) -> None:
    """A host whose check answers a pick with an escape sequence and a newline: it is neither shown, nor
    remembered, nor planned on (fleet.plan.picks.told_picks keeps plain words only)."""
    simhost.set_host(fleet_env.host_dir("blackwell"), engine_picks={"--attention-backend": "\x1b[31mx\nFAKE: ok"})
    r = run_cli("deploy", "qwen36-27b", "--host", "blackwell")
    assert "\x1b[31m" not in r.out + r.err and "\nFAKE: ok" not in r.out + r.err
    assert "planned again" not in r.err
    learned = fleet_env.host_dir("blackwell") / "state" / "learned.json"
    assert not learned.exists() or "FAKE" not in learned.read_text()


def test_learned_fixes_are_listed_and_forgotten(fleet_env: simhost.Sandbox) -> None:
    """A fix learned once is applied on every later deploy there: an operator sees which, and can forget
    one (there was no command for either, issue 39). Forgetting is exact and leaves the rest."""
    r = run_cli("deploy", "qwen35-nvfp4-handwritten", "--host", "blackwell", "--no-engine-check", "--json")
    assert r.code == 0 and json.loads(r.out)["new_fixes"] == [
        "sglang-spec-hybrid-no-buffer",
        "sglang-spec-params-incomplete",
    ]
    listed = [json.loads(line) for line in run_cli("fixes", "list", "--host", "blackwell", "--json").out.splitlines()]
    assert {x["signature"] for x in listed} == {"sglang-spec-hybrid-no-buffer", "sglang-spec-params-incomplete"}
    assert all(x["applied"] and x["fix"] and x["gpu"] for x in listed)
    text = run_cli("fixes", "list", "--host", "blackwell").out
    assert "sglang-spec-hybrid-no-buffer" in text and "learned " in text
    assert run_cli("fixes", "forget", "--host", "blackwell").code == 2  # nothing named: nothing forgotten
    gone = run_cli("fixes", "forget", "--host", "blackwell", "sglang-spec-hybrid-no-buffer")
    assert gone.code == 0 and "forgot sglang-spec-hybrid-no-buffer for " in gone.out
    left = [json.loads(line) for line in run_cli("fixes", "list", "--host", "blackwell", "--json").out.splitlines()]
    assert [x["signature"] for x in left] == ["sglang-spec-params-incomplete"]
    plan = run_cli("plan", "qwen35-nvfp4-handwritten", "--host", "blackwell")
    assert "sglang-spec-params-incomplete" in plan.out and "sglang-spec-hybrid-no-buffer" not in plan.out
    again = run_cli("fixes", "forget", "--host", "blackwell", "sglang-spec-hybrid-no-buffer")
    assert again.code == 0 and "no learned fix matched" in again.out
