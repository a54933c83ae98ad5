"""SGLang's weight cache daemon under fleet (issue 41), in the fast tier: which plans may use it and the
daemon's command line (fleet.plan.weight_cache), what the act step keeps or stops (fleet.host.weight_cache),
and fleet's launcher holding the engine back until the daemon's ranks listen (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ROOT, classify_table
from fleet.errors import ConfigError
from fleet.host.launch import LAUNCHER
from fleet.host.procs import boot_id, start_ticks
from fleet.host.weight_cache import WAIT_ENV, keep_or_stop, running_daemon, wait_spec
from fleet.inventory import load_playbook
from fleet.model import parse_model_spec
from fleet.plan import Flag, weight_cache
from test_plan import BLACKWELL_GPUS, CT129_GPUS, plan, playbook

MATRIX = ROOT / "tests" / "data" / "matrix"


def cached(**changes: object):  # type: ignore[no-untyped-def]
    """Qwen3.6-27B on the 2x A6000 box with weight_cache: (no MTP: SGLang refuses the two together)."""
    return playbook("qwen36-27b", speculative=None, weight_cache=True, **changes)


def test_a_cached_plan_runs_the_engine_as_the_daemons_client_and_the_daemon_with_its_cache_settings_only() -> None:
    r = plan(cached(), "ct129", CT129_GPUS, version="0.5.23")
    assert not r.errors and r.plan is not None
    argv = r.plan.argv()
    assert argv[argv.index("--weight-cache-mode") + 1] == "client"
    daemon = weight_cache.daemon_argv(r.plan)
    assert daemon[1:3] == ["-m", "sglang.srt.weight_cache.daemon"]
    assert daemon[3:] == ["--model-path", "/models/Qwen3.6-27B", "--tp-size", "2"]
    assert weight_cache.ranks(r.plan) == 2


def test_the_daemons_key_ignores_what_a_fix_changes_and_follows_what_its_cache_config_holds() -> None:
    """A graph-batch or memory-fraction fix relaunches against the same daemon; another GPU set, TP size,
    engine version or checkpoint needs a new one."""
    base = plan(cached(), "ct129", CT129_GPUS, version="0.5.23").plan
    assert base is not None
    key = weight_cache.daemon_key(base)
    fixed = plan(cached(mem_fraction=0.7, extra_args=["--cuda-graph-max-bs-decode", "16"]), "ct129", CT129_GPUS,
                 version="0.5.23").plan  # fmt: skip
    assert fixed is not None and weight_cache.daemon_key(fixed) == key
    other_tp = plan(cached(tp=1, gpus=1), "ct129", CT129_GPUS, version="0.5.23").plan
    assert other_tp is not None and weight_cache.daemon_key(other_tp) != key
    trusted = plan(cached(trust_remote_code=True), "ct129", CT129_GPUS, version="0.5.23").plan
    assert trusted is not None and weight_cache.daemon_key(trusted) != key
    # a backend can change how the weights are prepared (DeepGEMM requantises block-FP8 MoE scales)
    runner = plan(cached(extra_args=["--moe-runner-backend", "triton"]), "ct129", CT129_GPUS, version="0.5.23").plan
    assert runner is not None and weight_cache.daemon_key(runner) != key
    assert "--moe-runner-backend" in weight_cache.daemon_argv(runner)


@pytest.mark.parametrize(
    ("changes", "version", "why"),
    [
        ({}, "0.5.11", "SGLang 0.5.11 has no weight cache daemon"),
        ({"tp": 1, "extra_args": ["--dp-size", "2"]}, "0.5.23", "runs data-parallel replicas"),
    ],
)
def test_a_cached_plan_the_daemon_cannot_serve_is_refused_before_anything_is_stopped(
    changes: dict, version: str, why: str
) -> None:
    r = plan(cached(**changes), "ct129", CT129_GPUS, version=version)
    errors = [v.message for v in r.errors if v.rule == "weight-cache"]
    assert errors and why in errors[0] and "Leave weight_cache: out" in errors[0], r.errors


def test_a_group_and_a_container_are_refused_for_now() -> None:
    """The daemon of a group would need its own rendezvous, and one in a container the image's: fleet runs
    it beside a server process on one host only, and says so."""
    base = plan(cached(), "ct129", CT129_GPUS, version="0.5.23").plan
    assert base is not None
    model = parse_model_spec("/m", json.loads((MATRIX / "Qwen3-8B" / "config.json").read_text()), None, None)
    group = replace(base, flags=(*base.flags, Flag("--nnodes", "2", "group", "")))
    assert "spans several" in weight_cache.refusals("ct129", model, group)[0].message
    boxed = replace(base, container=object())  # type: ignore[arg-type]
    assert "not in a container" in weight_cache.refusals("ct129", model, boxed)[0].message
    assert weight_cache.refusals("ct129", model, base) == []


def test_nvfp4_weights_are_refused_as_sglang_refuses_them_for_ipc() -> None:
    """protocol.py IPC_QUANT_ALLOWLIST: unquantised and block-wise FP8 only; the NVFP4 story model is not."""
    r = plan(playbook("qwen35-nvfp4", speculative=None, weight_cache=True), "blackwell", BLACKWELL_GPUS, "0.5.23")
    assert any("'modelopt_fp4'" in v.message for v in r.errors if v.rule == "weight-cache"), r.errors


def test_block_fp8_is_shared_and_per_tensor_fp8_is_not() -> None:
    cfg = json.loads((MATRIX / "DeepSeek-V3" / "config.json").read_text())
    assert parse_model_spec("/m", cfg, None, None).fp8_blocks  # weight_block_size [128, 128]
    per_tensor = dict(cfg, quantization_config={"quant_method": "fp8", "activation_scheme": "dynamic"})
    assert not parse_model_spec("/m", per_tensor, None, None).fp8_blocks


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("speculative: {steps: 1}", "SGLang refuses the two together"),
        ("engine: vllm", "vllm has none"),
        ("env: {FLEET_WEIGHT_CACHE_WAIT: '{}'}", "a variable fleet sets itself"),
        ("extra_args: [--weight-cache-mode, 'off']", "which fleet sets itself; use weight_cache: true"),
    ],
)
def test_a_playbook_asking_for_what_sglang_refuses_is_an_error_at_its_line(
    tmp_path: Path, extra: str, said: str
) -> None:
    text = "engine: sglang\nmodel: Qwen3.6-27B\nserved_name: q\nweight_cache: true\n"
    text += "smoke: {prompt: Capital of France?, expect: Paris}\n"
    text += extra + "\n"
    if extra.startswith("engine:"):
        text = text.replace("engine: sglang\n", "")
    (tmp_path / "pb.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_playbook("pb", tmp_path)
    assert said in str(err.value) and "pb.yaml" in str(err.value)


def detached(*argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), start_new_session=True, stdin=subprocess.DEVNULL)


def entry_for(proc: subprocess.Popen[bytes], tmp_path: Path, key: str = "k1") -> dict:
    return {
        "pid": proc.pid,
        "pgid": proc.pid,
        "start_ticks": start_ticks(proc.pid),
        "boot_id": boot_id(),
        "log": str(tmp_path / "daemon.log"),
        "exit_file": str(tmp_path / "daemon.exit"),
        "key": key,
    }


def test_the_recorded_daemon_is_kept_for_the_same_key_and_stopped_otherwise(tmp_path: Path) -> None:
    daemon = detached("sleep", "60")
    try:
        record = {"pgid": 77, "weight_cache": entry_for(daemon, tmp_path)}
        want = {"argv": ["python"], "key": "k1", "ranks": 1}
        kept, stop, why = keep_or_stop(want, record)
        assert kept is not None and stop is None and "reused" in why
        kept, stop, why = keep_or_stop(dict(want, key="k2"), record)
        assert kept is None and stop == daemon.pid and "settings changed" in why
        kept, stop, why = keep_or_stop(None, record)  # a stop, or a deploy without weight_cache:
        assert kept is None and stop == daemon.pid
        # it refused the last engine (a new torch under it): started again whatever its key says
        kept, stop, why = keep_or_stop(dict(want, restart="it refused"), record)
        assert kept is None and stop == daemon.pid and why == "started again: it refused"
        (tmp_path / "daemon.exit").write_text("0\n")  # its launcher saw it end
        assert running_daemon(record) is None
    finally:
        daemon.kill()
        daemon.wait()


@pytest.mark.parametrize(
    "damage",
    [
        {"start_ticks": 1},  # a pid reused by another process: its start differs
        {"pgid": "77"},
        {"pid": None},
        {"key": ["k1"]},
        {"exit_file": None},
        {"same_as_server": True},  # the server's own group is never "the daemon" to keep
    ],
)
def test_a_damaged_record_names_no_daemon_to_keep_or_stop(tmp_path: Path, damage: dict) -> None:
    daemon = detached("sleep", "60")
    try:
        entry = dict(entry_for(daemon, tmp_path), **{k: v for k, v in damage.items() if k != "same_as_server"})
        record = {"pgid": daemon.pid if damage.get("same_as_server") else 77, "weight_cache": entry}
        assert running_daemon(record) is None
        assert keep_or_stop({"argv": ["python"], "key": "k1", "ranks": 1}, record)[:2] == (None, None)
    finally:
        daemon.kill()
        daemon.wait()


def launch_with_daemon(
    tmp_path: Path, daemon: subprocess.Popen[bytes], started_now: bool = True, ranks: int = 2
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "wc").mkdir(exist_ok=True)
    spec = wait_spec(entry_for(daemon, tmp_path), str(tmp_path / "wc"), ranks, started_now)  # type: ignore[arg-type]
    env = {"PATH": os.environ["PATH"], WAIT_ENV: spec}
    engine = [
        sys.executable,
        "-c",
        "import os; print('engine; the wait passed on:', 'FLEET_WEIGHT_CACHE_WAIT' in os.environ)",
    ]
    argv = [sys.executable, "-c", LAUNCHER, "fleet-launch", str(tmp_path / "engine.exit"), *engine]
    return subprocess.run(argv, input=json.dumps(env) + "\n", text=True, capture_output=True, timeout=60)


DAEMON_LINES = [
    "2026-12-05 10:00:00,001 [Daemon gpu=0 tp_rank=0] INFO [WeightCacheDaemon gpu=0] Loading model from disk: /m",
    "2026-12-05 10:00:01,001 [Daemon gpu=0 tp_rank=0] INFO [WeightCacheDaemon gpu=0] Listening on /w/a.sock",
    "2026-12-05 10:00:01,201 [Daemon gpu=1 tp_rank=1] INFO [WeightCacheDaemon gpu=1] Listening on /w/b.sock",
]
# A stand-in daemon: its log lines, then each rank's .ready file (pid=its own) as SGLang writes it after the
# socket is bound, then it serves on
FAKE_DAEMON = """import os, sys, time
log, ready = sys.argv[1], sys.argv[2]
for i, line in enumerate(sys.argv[3:]):
    time.sleep(0.3)
    open(log, 'a').write(line + '\\n')
    if i:
        open(os.path.join(ready, 'GPU-%d.ready' % i), 'w').write('pid=%d\\nconfig={}\\n' % os.getpid())
time.sleep(60)
"""


def test_the_engine_starts_once_every_rank_is_ready_with_the_daemons_lines_in_its_log(tmp_path: Path) -> None:
    (tmp_path / "wc").mkdir()
    (tmp_path / "wc" / "GPU-9.ready").write_text("pid=999999999\n")  # a dead rank's file: not ready
    daemon = detached(
        sys.executable, "-c", FAKE_DAEMON, str(tmp_path / "daemon.log"), str(tmp_path / "wc"), *DAEMON_LINES
    )
    try:
        run = launch_with_daemon(tmp_path, daemon)  # the engine's line after the second rank's: it waited
        assert run.stdout.splitlines() == [*DAEMON_LINES, "engine; the wait passed on: False"], run
        assert (tmp_path / "engine.exit").read_text() == "0\n"
    finally:
        daemon.kill()
        daemon.wait()


def test_a_daemon_that_ends_before_it_is_ready_starts_no_engine_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "daemon.log").write_text(DAEMON_LINES[0] + "\ntorch.OutOfMemoryError: CUDA out of memory\n")
    daemon = detached("sleep", "0.5")
    try:
        run = launch_with_daemon(tmp_path, daemon)
    finally:
        daemon.wait()
    assert "engine" not in run.stdout and "CUDA out of memory" in run.stdout  # its last words, in the attempt's log
    assert f"weight cache daemon (pid {daemon.pid}) ended before it was ready" in run.stderr, run
    assert (tmp_path / "engine.exit").read_text() == "1\n"


def test_a_kept_daemon_is_not_relayed_again_and_its_log_is_never_waited_on(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "daemon.log")  # a log that would block a reader: never opened but as a regular file
    (tmp_path / "wc").mkdir()
    daemon = detached("sleep", "60")
    try:
        for i in range(2):
            (tmp_path / "wc" / f"GPU-{i}.ready").write_text(f"pid={daemon.pid}\n")
        run = launch_with_daemon(tmp_path, daemon, started_now=False)
        assert run.stdout.splitlines() == ["engine; the wait passed on: False"], run
        run = launch_with_daemon(tmp_path, daemon, started_now=True)  # the FIFO: skipped, not read
        assert run.stdout.splitlines() == ["engine; the wait passed on: False"], run
    finally:
        daemon.kill()
        daemon.wait()


def test_a_wait_that_cannot_be_read_starts_no_engine(tmp_path: Path) -> None:
    """A damaged request (here: no rank count) must not start the engine beside an unready daemon."""
    env = {"PATH": os.environ["PATH"], WAIT_ENV: json.dumps({"dir": str(tmp_path), "ranks": None})}
    argv = [sys.executable, "-c", LAUNCHER, "fleet-launch", str(tmp_path / "engine.exit"), "true"]
    run = subprocess.run(argv, input=json.dumps(env) + "\n", text=True, capture_output=True, timeout=60)
    assert "could not be waited for" in run.stderr and (tmp_path / "engine.exit").read_text() == "1\n"


def classified(monkeypatch: pytest.MonkeyPatch, procs: dict, on_gpus: dict, **free: object) -> tuple[dict, list]:
    """fleet.host.free.classify with the host's probes answering from `on_gpus` (pid -> GPU 0): (stopped
    pid -> why, refused)."""
    targets, refused, _ = classify_table(monkeypatch, procs, on_gpus, gpus=[0], **free)
    return {pid: t["why"] for pid, t in targets.items()}, refused


def proc(pid: int, pgid: int, *argv: str) -> dict:
    return {"pid": pid, "ppid": 1, "pgid": pgid, "uid": os.getuid(), "user": "me", "comm": argv[0][:15],
            "state": "S", "start_ticks": 1, "cmdline": " ".join(argv), "argv": list(argv)}  # fmt: skip


DAEMON = {
    600: proc(600, 600, "python3", "-c", "launcher", "fleet-launch", "/l/wc.exit", "python3"),
    601: proc(601, 600, "python3", "-m", "sglang.srt.weight_cache.daemon", "--model-path", "/m", "--tp-size", "1"),
    602: proc(602, 600, "python3", "-c", "from multiprocessing.spawn import spawn_main", "--multiprocessing-fork"),
}


def test_the_act_step_keeps_stops_or_refuses_a_daemon_by_what_the_record_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's rank holds GPU 0. Kept for a launch with the same settings: neither stopped nor refused.
    Named by the record but not kept: stopped whole, as fleet's daemon. Named by no record: a non-engine GPU
    holder, refused (started by hand, or another deployment's: never stopped unasked)."""
    stopped, refused = classified(monkeypatch, DAEMON, {602: 0}, recorded_pgid=None, kept_cache_pgid=600)
    assert stopped == {} and refused == []
    stopped, refused = classified(monkeypatch, DAEMON, {602: 0}, recorded_pgid=None, cache_pgid=600)
    assert stopped == dict.fromkeys((600, 601, 602), "fleet's weight cache daemon") and refused == []
    stopped, refused = classified(monkeypatch, DAEMON, {602: 0}, recorded_pgid=None)
    assert stopped == {} and [r["pid"] for r in refused] == [602] and refused[0]["why"] == "not an inference server"


def test_the_memory_a_kept_daemon_holds_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the old engine is stopped, the GPU still holds the daemon's 29.5 GiB of weights: the act step
    waits for the rest only (NVML counts memory shared over CUDA IPC under the daemon: docs/real-gpu.md),
    read in the same NVML pass as the GPU's use."""
    import types

    from fleet.host import free as rf
    from test_host_reads import fake_nvml

    listed = [
        types.SimpleNamespace(pid=602, usedGpuMemory=29_500 << 20),
        types.SimpleNamespace(pid=700, usedGpuMemory=None),  # a process NVML cannot size
    ]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(1, 30_000, lambda h: listed))
    assert rf.wait_memory_released([50_000], 0.5, 600, [0], {602})[1] == [500]
    assert rf.wait_memory_released([50_000], 0.2, 600, [0])[1] == [30_000]  # without it: still "in use"


def test_the_daemons_directory_must_be_this_users_alone(tmp_path: Path) -> None:
    """Where the daemon's sockets and .ready files go: made 0700 when missing; one another user could write
    (or a link to one) is refused, before anything is stopped (host/act.py refusal_before_stopping)."""
    from fleet.host.weight_cache import cache_dir, template_env, unsafe_dir

    path = cache_dir(str(tmp_path / "state" / "deployments" / "wc"))
    assert path.startswith(f"/tmp/fleet-wc-{os.getuid()}/") and len(path) + 50 < 107  # a socket path's limit
    assert "{device_uuid}" in template_env(path)["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"]
    mine = tmp_path / "base" / "wc"
    assert unsafe_dir(str(mine)) is None and (mine.stat().st_mode & 0o777) == 0o700
    mine.chmod(0o755)
    assert "alone" in str(unsafe_dir(str(mine)))
    mine.chmod(0o700)
    other = tmp_path / "elsewhere"
    other.mkdir(mode=0o700)
    (tmp_path / "linked").mkdir(mode=0o700)
    (tmp_path / "linked" / "wc").symlink_to(other)
    assert "alone" in str(unsafe_dir(str(tmp_path / "linked" / "wc")))  # a link is not the directory


def test_without_nvml_nvidia_smi_says_what_the_kept_daemon_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's own python3 (no NVML binding) asks nvidia-smi, in the same two queries as ever."""
    from fleet.host import free as rf
    from test_host_reads import fake_smi

    fake_smi(
        tmp_path, monkeypatch, "0, GPU-a, 30000\\n1, GPU-b, 100", "GPU-a, 602, 29500\\nGPU-a, 700, [N/A]\\nGPU-b, 9, 90"
    )
    assert rf.nvml_pids_and_memory([0], {602}) == ({602, 700}, [500])
    assert rf.nvml_pids_and_memory(None) == ({602, 700, 9}, [30_000, 100])


def test_a_daemon_that_refuses_the_engine_is_started_again_on_the_next_launch_only() -> None:
    """SGLang's loader refusing the daemon's configuration is known, and its fix changes no flag: the
    relaunch asks the act step to start the daemon again (control/deploy.py), once."""
    from fleet.control.act_request import launch_args
    from fleet.crashes import decide, diagnose
    from fleet.plan import apply_fix

    line = "RuntimeError: [IpcModelLoader] Daemon config mismatch!"
    d = diagnose(["Traceback (most recent call last):", line])
    assert d.signature == "weight-cache-config-mismatch" and d.fix is not None
    action = decide(d, [], 1, 4)
    assert action.fix.describe() == "the weight cache daemon started again with this engine's settings"
    r = plan(cached(), "ct129", CT129_GPUS, version="0.5.23")
    assert r.plan is not None
    planned = r.plan
    assert apply_fix(planned, action.fix, d.signature, d.explanation).argv() == planned.argv()
    from fleet.control.act_request import cache_restart

    # a daemon kept from before may hold another torch: started again; one started for this engine: given up
    why, refused = cache_restart({"weight_cache": {"kept": True, "why": "reused"}}, d.signature)
    assert why == "it refused the last engine's configuration (weight-cache-config-mismatch)" and refused is None
    why, refused = cache_restart({"weight_cache": {"kept": False, "why": "no daemon"}}, d.signature)
    assert why is None and "started for this engine refused" in str(refused)
    asked = launch_args(planned, "wc", 2, "/logs", "it refused the last engine's configuration")
    assert asked["weight_cache"]["restart"] == "it refused the last engine's configuration"
    assert "restart" not in launch_args(planned, "wc", 3, "/logs")["weight_cache"]
    assert decide(d, [d.signature], 2, 4).reason.endswith("came back after its fix was applied")
