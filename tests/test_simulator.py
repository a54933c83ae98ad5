"""The SGLang engine simulator reproduces the real engine's behaviour (engines.md), rule by rule: each
rule firing with SGLang's own text, and not firing when its condition is absent."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import simengine as sim
from fleet_testbed import gpustate, simhost

pytestmark = pytest.mark.slow  # starts simulated engines

Q35 = "Qwen3.5-397B-A17B-NVFP4"
Q36 = "Qwen3.6-27B"
HANDWRITTEN = [
    "--tp",
    "8",
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-draft-tokens",
    "2",
    "--speculative-eagle-topk",
    "1",
    "--trust-remote-code",
]
GOOD_SM120 = [
    "--moe-runner-backend",
    "flashinfer_cutlass",
    "--fp4-gemm-backend",
    "flashinfer_cudnn",
    "--mem-fraction-static",
    "0.85",
]


@pytest.fixture
def blackwell(tmp_path: Path) -> Path:
    return sim.make_host(tmp_path)


@pytest.fixture
def a6000(tmp_path: Path) -> Path:
    return sim.make_host(tmp_path, name="a6000", gpu=simhost.RTX_A6000, count=2)


def base(hdir: Path, model: str, port: int) -> list[str]:
    return ["--model-path", sim.model(hdir, model), "--host", "127.0.3.1", "--port", str(port)]


# --- argparse, per version (engines.md §1.1, §7.1) ------------------------------------------------------


def test_unknown_flag_is_an_argparse_error_exit_2(blackwell: Path) -> None:
    code, out = sim.run(blackwell, [*base(blackwell, Q36, 31001), "--bogus-flag", "1"])
    assert code == 2
    assert "sglang serve: error: unrecognized arguments: --bogus-flag 1" in out
    assert out.startswith("usage: sglang serve")


@pytest.mark.parametrize(
    ("version", "flag", "accepted"),
    [
        ("0.5.11", "--mamba-scheduler-strategy", True),
        ("0.5.11", "--mamba-radix-cache-strategy", False),
        ("0.5.15", "--mamba-scheduler-strategy", True),
        ("0.5.15", "--mamba-radix-cache-strategy", True),
        ("0.5.20", "--mamba-scheduler-strategy", False),
        ("0.5.23", "--mamba-radix-cache-strategy", True),
    ],
)
def test_the_mamba_strategy_flag_rename_follows_the_version(
    tmp_path: Path, version: str, flag: str, accepted: bool
) -> None:
    hdir = sim.make_host(tmp_path, version=version)
    code, out = sim.run(hdir, [*base(hdir, Q36, 31002), flag, "bogus_value_to_stop_early"])
    if accepted:  # known flag: argparse then rejects the value with the choices
        assert "invalid choice: 'bogus_value_to_stop_early'" in out
    else:
        assert f"error: unrecognized arguments: {flag} bogus_value_to_stop_early" in out
    assert code == 2


def test_cuda_graph_max_bs_is_ambiguous_from_0520(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, version="0.5.20")
    code, out = sim.run(hdir, [*base(hdir, Q36, 31003), "--cuda-graph-max-bs", "32"])
    assert code == 2
    assert (
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill"
    ) in out


def test_deprecated_alias_warns_on_0515(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, version="0.5.15")
    code, out = sim.run(hdir, [*base(hdir, Q36, 31004), "--cuda-graph-max-bs", "32", "--tp", "99"])
    assert "WARNING: --cuda-graph-max-bs is deprecated, use --cuda-graph-max-bs-decode instead." in out


@pytest.mark.parametrize(("version", "choice", "ok"), [("0.5.11", "marlin", False), ("0.5.23", "marlin", True)])
def test_moe_runner_choices_follow_the_version(tmp_path: Path, version: str, choice: str, ok: bool) -> None:
    hdir = sim.make_host(tmp_path, version=version)
    code, out = sim.run(hdir, [*base(hdir, Q36, 31005), "--moe-runner-backend", choice, "--tp", "99"])
    assert ("invalid choice: 'marlin'" in out) is not ok


# --- resolution errors (engines.md §2.1) ----------------------------------------------------------------


def test_nextn_on_hybrid_without_extra_buffer_is_the_real_valueerror_on_0511(blackwell: Path) -> None:
    code, out = sim.run(blackwell, [*base(blackwell, Q35, 31006), *HANDWRITTEN])
    assert code == 1
    assert out.splitlines()[-1] == (
        "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible with radix cache "
        "when using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
        "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
    )
    assert 'sglang/srt/server_args.py", line 2453, in _handle_mamba_radix_cache' in out


def test_draft_tokens_without_num_steps_is_a_bare_assertion_error(blackwell: Path) -> None:
    code, out = sim.run(
        blackwell, [*base(blackwell, Q35, 31007), *HANDWRITTEN, "--mamba-scheduler-strategy", "extra_buffer"]
    )
    lines = out.splitlines()
    assert code == 1 and lines[-1] == "AssertionError"
    assert lines[-2].strip() == "and self.speculative_num_draft_tokens is None"
    assert "line 3521, in _handle_speculative_decoding" in out


def test_draft_tokens_without_num_steps_on_0523_points_at_speculative_hook(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, version="0.5.23")
    code, out = sim.run(hdir, [*base(hdir, Q35, 31008), *HANDWRITTEN])
    assert code == 1 and out.splitlines()[-1] == "AssertionError"
    assert 'speculative_hook.py", line 1162, in _handle_eagle_family' in out


def test_on_0509_radix_cache_is_disabled_with_a_warning_instead(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, version="0.5.9")
    with sim.Running(hdir, [*base(hdir, Q35, 31009), *HANDWRITTEN, "--speculative-num-steps", "1", *GOOD_SM120]) as s:
        assert s.wait_for(sim.READY)
        assert "Disabling radix cache since speculative decoding for Qwen3_5MoeForConditionalGeneration" in s.text()


def test_explicit_no_buffer_with_spec_on_0523_is_the_overlap_assertion(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, version="0.5.23")
    code, out = sim.run(
        hdir,
        [
            *base(hdir, Q35, 31010),
            *HANDWRITTEN,
            "--speculative-num-steps",
            "1",
            "--mamba-radix-cache-strategy",
            "no_buffer",
        ],
    )
    assert out.splitlines()[-1] == (
        "AssertionError: no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True."
    )


def test_the_fixed_command_starts_and_answers(blackwell: Path) -> None:
    args = [
        *base(blackwell, Q35, 31011),
        *HANDWRITTEN,
        "--speculative-num-steps",
        "1",
        "--mamba-scheduler-strategy",
        "extra_buffer",
        *GOOD_SM120,
        "--served-model-name",
        "m",
    ]
    with sim.Running(blackwell, args) as s:
        assert s.wait_for(sim.READY), s.text()
        text = s.text()
        assert "Max running requests is reset to 48 for speculative decoding." in text
        assert "Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding." in text
        assert "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs." in text
        status, body = sim.chat("127.0.3.1", 31011, "What is the capital of France?")
        assert status == 200 and body["choices"][0]["message"]["content"] == " Paris."
        status, body = sim.http("http://127.0.3.1:31011/v1/models")
        assert body["data"][0]["id"] == "m"
        assert sim.http("http://127.0.3.1:31011/health")[0] == 200
        for path in ("/model_info", "/server_info"):
            assert sim.http(f"http://127.0.3.1:31011{path}")[0] == 200


# --- load-time and runtime failures (engines.md §1.4, §1.7, §5) -------------------------------------------


def test_nvfp4_below_minimum_capability_fails_at_load_on_0511(a6000: Path) -> None:
    code, out = sim.run(a6000, [*base(a6000, Q35, 31012), "--tp", "2"])
    assert "Scheduler hit an exception: Traceback (most recent call last):" in out
    assert (
        "ValueError: The quantization method modelopt_fp4 is not supported for the current GPU. Minimum "
        "capability: 100. Current capability: 86."
    ) in out
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert code == -signal.SIGKILL or code == 137


def test_sm120_nvfp4_moe_with_auto_runner_fails_for_lack_of_kernels(blackwell: Path) -> None:
    code, out = sim.run(blackwell, [*base(blackwell, Q35, 31013), "--tp", "8"])
    assert "none of the configured backends are usable on sm120" in out
    assert "Load weight begin." in out


def test_sm120_cutedsl_serves_garbage_instead_of_crashing(blackwell: Path) -> None:
    args = [*base(blackwell, Q35, 31014), "--tp", "8", "--moe-runner-backend", "flashinfer_cutedsl"]
    with sim.Running(blackwell, args) as s:
        assert s.wait_for(sim.READY), s.text()
        status, body = sim.chat("127.0.3.1", 31014, "What is the capital of France?")
        assert status == 200 and "Paris" not in body["choices"][0]["message"]["content"]


def test_too_low_mem_fraction_leaves_no_kv_pool(a6000: Path) -> None:
    code, out = sim.run(a6000, [*base(a6000, Q36, 31015), "--tp", "2", "--mem-fraction-static", "0.55"])
    assert (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
        "mem_fraction_static=0.55"
    ) in out


def test_too_high_mem_fraction_with_memory_taken_is_a_cuda_oom(a6000: Path) -> None:
    simhost.set_host(a6000, gpus=[{**g, "baseline_used_mib": 12000} for g in gpustate.load_host(a6000)["gpus"]])
    code, out = sim.run(a6000, [*base(a6000, Q36, 31016), "--tp", "2", "--mem-fraction-static", "0.9"])
    assert "torch.OutOfMemoryError: CUDA out of memory." in out
    assert "Load weight end." in out


def test_held_port_is_found_only_when_uvicorn_binds(a6000: Path) -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.3.1", 31017))
        holder.listen()
        code, out = sim.run(a6000, [*base(a6000, Q36, 31017), "--tp", "2"])
    assert (
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.3.1', 31017): address already in use"
    ) in out
    assert out.index("KV Cache is allocated") < out.index("Errno 98")


def test_extra_buffer_spec_v2_on_0513_crashes_after_the_first_request(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, name="a", gpu=simhost.RTX_A6000, count=2, version="0.5.13")
    args = [
        *base(hdir, Q36, 31018),
        "--tp",
        "2",
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "1",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "2",
        "--mamba-scheduler-strategy",
        "extra_buffer",
    ]
    with sim.Running(hdir, args) as s:
        assert s.wait_for(sim.READY), s.text()
        assert sim.chat("127.0.3.1", 31018, "What is the capital of France?")[0] == 200
        sim.chat("127.0.3.1", 31018, "again")
        assert s.wait_for("TypeError: 'NoneType' object cannot be interpreted as an integer")
        assert "set_mamba_track_indices_from_reqs" in s.text()
        s.proc.wait(timeout=10)


def test_extra_buffer_spec_v2_on_0512_keeps_serving(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, name="a", gpu=simhost.RTX_A6000, count=2, version="0.5.12")
    args = [
        *base(hdir, Q36, 31019),
        "--tp",
        "2",
        "--speculative-algorithm",
        "NEXTN",
        "--speculative-num-steps",
        "1",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "2",
        "--mamba-scheduler-strategy",
        "extra_buffer",
    ]
    with sim.Running(hdir, args) as s:
        assert s.wait_for(sim.READY), s.text()
        for _ in range(3):
            assert sim.chat("127.0.3.1", 31019, "What is the capital of France?")[0] == 200


# --- process tree, device files, NVML, shutdown (engines.md §3.3, §3.4) -----------------------------------


def _titles(pgid: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "args=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return sorted(line.strip() for line in out.splitlines() if "sglang::" in line and "<defunct>" not in line)


def test_process_tree_holds_gpus_and_drains_on_sigterm(a6000: Path) -> None:
    with sim.Running(a6000, [*base(a6000, Q36, 31020), "--tp", "2"]) as s:
        assert s.wait_for(sim.READY), s.text()
        assert _titles(s.proc.pid) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
        files = [str(a6000 / "dev" / n) for n in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")]
        holders = subprocess.run(["fuser", *files], capture_output=True, text=True).stdout.split()
        assert len(set(holders)) == 2
        os.environ["SIM_HOST_DIR"] = str(a6000)
        used = [g["memory_used_mib"] for g in gpustate.gpu_table(a6000)]
        assert all(u > 20000 for u in used)
        # a request in flight keeps the server draining (sigterm_watchdog) until it is answered
        simhost.set_host(a6000, generation_delay_s=2.0)
        answers: list[tuple[int | None, object]] = []
        client = threading.Thread(target=lambda: answers.append(sim.chat("127.0.3.1", 31020, "The capital of France?")))
        client.start()
        assert sim.wait_until(lambda: sim.client_connected(31020))
        time.sleep(0.2)  # the handler has taken the request in
        s.proc.send_signal(signal.SIGTERM)
        assert s.wait_for("SIGTERM received. signum=15 Draining requests and shutting down...")
        assert sim.http("http://127.0.3.1:31020/health")[0] == 503
        assert s.wait_for("Gracefully exiting... Remaining number of requests 1. Remaining requests remaining_rids=['")
        client.join(timeout=10)
        assert answers and answers[0][0] == 200
        assert s.proc.wait(timeout=10) == 0
        assert "Gracefully exiting... Remaining number of requests 0. Remaining requests remaining_rids=[]." in s.text()
        time.sleep(0.3)
        assert _titles(s.proc.pid) == []
        assert all(g["memory_used_mib"] == 0 for g in gpustate.gpu_table(a6000))


def test_sigkill_of_the_group_takes_every_child(a6000: Path) -> None:
    with sim.Running(a6000, [*base(a6000, Q36, 31021), "--tp", "2"]) as s:
        assert s.wait_for(sim.READY)
        os.killpg(s.proc.pid, signal.SIGKILL)
        s.proc.wait(timeout=5)
        time.sleep(0.2)
        assert _titles(s.proc.pid) == []


def test_sglang_serve_entry_point_runs_the_same_simulator(a6000: Path) -> None:
    p = subprocess.run(
        [str(a6000 / "env" / "bin" / "sglang"), "serve", "--model-path", sim.model(a6000, Q36), "--bogus"],
        capture_output=True,
        text=True,
        env=sim.env(a6000),
    )
    assert p.returncode == 2 and "sglang serve: error: unrecognized arguments: --bogus" in p.stderr


def test_prepare_server_args_gives_the_launchers_verdict_without_starting(blackwell: Path) -> None:
    check = "import sys\nfrom sglang.srt.server_args import prepare_server_args\nprepare_server_args(sys.argv[1:])\n"
    p = subprocess.run(
        [str(blackwell / "env" / "bin" / "python"), "-c", check, *base(blackwell, Q35, 31022), *HANDWRITTEN],
        capture_output=True,
        text=True,
        env=sim.env(blackwell),
    )
    assert p.returncode == 1 and "is not compatible with radix cache" in p.stderr


def test_on_0523_prepare_server_args_only_parses_and_resolve_once_resolves(tmp_path: Path) -> None:
    """As the real 0.5.23 does (the oracle's motivating-parse/resolve cases): the hand-written command line
    parses, and its speculative arguments fail only in resolution."""
    hdir = sim.make_host(tmp_path, version="0.5.23")
    parse = "import sys\nfrom sglang.srt.server_args import prepare_server_args\nprepare_server_args(sys.argv[1:])\n"
    resolve = parse.replace("prepare_server_args(sys.argv[1:])", "prepare_server_args(sys.argv[1:]).resolve_once()")
    said = {}
    for name, code in (("parse", parse), ("resolve", resolve)):
        p = subprocess.run(
            [str(hdir / "env" / "bin" / "python"), "-c", code, *base(hdir, Q35, 31023), *HANDWRITTEN],
            capture_output=True,
            text=True,
            env=sim.env(hdir),
        )
        said[name] = (p.returncode, p.stderr)
    assert said["parse"][0] == 0, said["parse"][1]
    assert said["resolve"][0] == 1 and "AssertionError" in said["resolve"][1]


def test_engines_on_their_own_gpu_sets_see_and_hold_only_those(blackwell: Path) -> None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: each server's device 0 is its first listed GPU; it holds only
    those device files and NVML (which ignores the variable) shows its memory on those GPUs only."""
    order = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    one = sim.Running(blackwell, [*base(blackwell, Q36, 31030), "--tp", "2"], {**order, "CUDA_VISIBLE_DEVICES": "6,7"})
    two = sim.Running(blackwell, [*base(blackwell, Q36, 31031), "--tp", "2"], {**order, "CUDA_VISIBLE_DEVICES": "2,3"})
    with one as a, two as b:
        assert a.wait_for(sim.READY) and b.wait_for(sim.READY), a.text() + b.text()
        os.environ["SIM_HOST_DIR"] = str(blackwell)
        used = {g["index"] for g in gpustate.gpu_table(blackwell) if g["memory_used_mib"] > 0}
        assert used == {2, 3, 6, 7}
        for s, mine in ((a, {"nvidia6", "nvidia7"}), (b, {"nvidia2", "nvidia3"})):
            held = {
                Path(os.readlink(f"/proc/{pid}/fd/{fd}")).name
                for pid in _group_pids(s.proc.pid)
                for fd in os.listdir(f"/proc/{pid}/fd")
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(blackwell / "dev" / "nvidia"))
            }
            assert held - {"nvidiactl", "nvidia-uvm"} == mine


def test_a_tp_wider_than_the_visible_gpus_is_the_invalid_ordinal_error(blackwell: Path) -> None:
    code, out = sim.run(blackwell, [*base(blackwell, Q36, 31032), "--tp", "4"], {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert code != 0 and "invalid device ordinal (tp_size=4, visible GPUs=2)" in out
    code, out = sim.run(blackwell, [*base(blackwell, Q36, 31033)], {"CUDA_VISIBLE_DEVICES": "9"})
    assert code != 0 and "RuntimeError: No CUDA GPUs are available" in out


def _group_pids(pgid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]
