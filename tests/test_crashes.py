"""Crash diagnosis over real engine output (simulator logs captured here, engine error texts from
engines.md / real-engine-cpu.md) and the pure relaunch policy. Every signature has a sample that must
match it and a near-miss that must not."""

from __future__ import annotations

from pathlib import Path

import pytest

import simengine as sim
from fleet.crashes import GiveUp, LogContext, Relaunch, builtin_signatures, decide, diagnose, normalize, traceback_of
from fleet.plan import Fix
from fleet_testbed import gpustate, simhost

Q35, Q36 = "Qwen3.5-397B-A17B-NVFP4", "Qwen3.6-27B"
SM120 = LogContext(engine="sglang", version=(0, 5, 11), hybrid=True, nvfp4=True, moe=True, sm=120)
SM86 = LogContext(engine="sglang", version=(0, 5, 11), hybrid=True, sm=86)
HANDWRITTEN = [
    "--tp",
    "8",
    "--speculative-algorithm",
    "NEXTN",
    "--speculative-num-draft-tokens",
    "2",
    "--speculative-eagle-topk",
    "1",
]


def sim_log(
    tmp: Path, version: str, model: str, args: list[str], *, gpu: dict = simhost.RTX_PRO_6000, count: int = 8
) -> list[str]:
    hdir = sim.make_host(tmp, name=f"h{version}{count}", gpu=gpu, count=count, version=version)
    _, out = sim.run(hdir, ["--model-path", sim.model(hdir, model), "--host", "127.0.3.2", "--port", "31100", *args])
    return out.splitlines()


# Captured from the simulator at test time: (name, version, model, args, gpu, count, context, signature)
SIM_CASES = [
    ("hybrid-no-buffer", "0.5.11", Q35, HANDWRITTEN, simhost.RTX_PRO_6000, 8, SM120, "sglang-spec-hybrid-no-buffer"),
    (
        "params-incomplete",
        "0.5.11",
        Q35,
        [*HANDWRITTEN, "--mamba-scheduler-strategy", "extra_buffer"],
        simhost.RTX_PRO_6000,
        8,
        SM120,
        "sglang-spec-params-incomplete",
    ),
    (
        "params-incomplete-0523",
        "0.5.23",
        Q35,
        HANDWRITTEN,
        simhost.RTX_PRO_6000,
        8,
        LogContext(engine="sglang", version=(0, 5, 23), sm=120),
        "sglang-spec-params-incomplete",
    ),
    (
        "no-buffer-overlap",
        "0.5.23",
        Q35,
        [*HANDWRITTEN, "--speculative-num-steps", "1", "--mamba-radix-cache-strategy", "no_buffer"],
        simhost.RTX_PRO_6000,
        8,
        LogContext(engine="sglang", version=(0, 5, 23)),
        "sglang-no-buffer-overlap",
    ),
    (
        "old-flag-removed",
        "0.5.20",
        Q36,
        ["--mamba-scheduler-strategy", "extra_buffer"],
        simhost.RTX_A6000,
        2,
        LogContext(engine="sglang", version=(0, 5, 20)),
        "sglang-renamed-flag-unrecognized",
    ),
    (
        "ambiguous",
        "0.5.20",
        Q36,
        ["--cuda-graph-max-bs", "16"],
        simhost.RTX_A6000,
        2,
        LogContext(engine="sglang", version=(0, 5, 20)),
        "sglang-renamed-flag-ambiguous",
    ),
    ("unknown-flag", "0.5.11", Q36, ["--enable-turbo"], simhost.RTX_A6000, 2, SM86, "argparse-unrecognized"),
    (
        "invalid-choice",
        "0.5.11",
        Q36,
        ["--moe-runner-backend", "marlin"],
        simhost.RTX_A6000,
        2,
        SM86,
        "argparse-invalid-choice",
    ),
    ("nvfp4-on-a6000", "0.5.11", Q35, ["--tp", "2"], simhost.RTX_A6000, 2, SM86, "sglang-quant-min-capability"),
    ("sm120-trtllm-moe", "0.5.11", Q35, ["--tp", "8"], simhost.RTX_PRO_6000, 8, SM120, "sm120-nvfp4-trtllm-moe"),
    (
        "gdn-attention-sm120",
        "0.5.11",
        Q36,
        ["--attention-backend", "fa3", "--tp", "2"],
        simhost.RTX_PRO_6000,
        2,
        SM120,
        "hybrid-gdn-attention-allowlist-sm120",
    ),
    (
        "kv-not-enough",
        "0.5.11",
        Q36,
        ["--tp", "2", "--mem-fraction-static", "0.55"],
        simhost.RTX_A6000,
        2,
        SM86,
        "sglang-kv-not-enough-memory",
    ),
    ("no-config", "0.5.11", "Missing-Model", [], simhost.RTX_A6000, 2, SM86, "model-files-missing"),
]


@pytest.mark.parametrize("case", SIM_CASES, ids=[c[0] for c in SIM_CASES])
def test_simulator_crash_logs_are_diagnosed(tmp_path: Path, case: tuple) -> None:
    name, version, model, args, gpu, count, ctx, signature = case
    lines = sim_log(tmp_path, version, model, args, gpu=gpu, count=count)
    d = diagnose(lines, ctx)
    assert d.signature == signature, "\n".join(lines[-8:])
    assert d.evidence


def test_cuda_oom_at_startup_from_the_simulator(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, gpu=simhost.RTX_A6000, count=2)
    simhost.set_host(hdir, gpus=[{**g, "baseline_used_mib": 12000} for g in gpustate.load_host(hdir)["gpus"]])
    _, out = sim.run(
        hdir,
        [
            "--model-path",
            sim.model(hdir, Q36),
            "--port",
            "31101",
            "--host",
            "127.0.3.2",
            "--tp",
            "2",
            "--mem-fraction-static",
            "0.9",
        ],
    )
    d = diagnose(out.splitlines(), SM86)
    assert (d.category, d.signature) == ("cuda_oom_startup", "cuda-oom-startup")


def test_runtime_typeerror_of_extra_buffer_spec_v2_is_not_fixable(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, gpu=simhost.RTX_A6000, count=2, version="0.5.13")
    args = [
        "--model-path",
        sim.model(hdir, Q36),
        "--host",
        "127.0.3.2",
        "--port",
        "31102",
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
        assert s.wait_for(sim.READY)
        sim.chat("127.0.3.2", 31102, "one")
        sim.chat("127.0.3.2", 31102, "two")
        assert s.wait_for("Received sigquit")
        d = diagnose(s.text().splitlines(), LogContext(engine="sglang", version=(0, 5, 13), hybrid=True, sm=86))
    assert (d.category, d.signature, d.fix) == (
        "spec_decode_hybrid_mamba",
        "sglang-spec-extra-buffer-runtime-typeerror",
        None,
    )


def test_a_healthy_simulator_startup_is_healthy(tmp_path: Path) -> None:
    hdir = sim.make_host(tmp_path, gpu=simhost.RTX_A6000, count=2)
    with sim.Running(
        hdir, ["--model-path", sim.model(hdir, Q36), "--host", "127.0.3.2", "--port", "31103", "--tp", "2"]
    ) as s:
        assert s.wait_for(sim.READY)
        lines = s.text().splitlines()
    assert diagnose(lines, SM86).category == "healthy"


# Error texts as the engines print them (engines.md §5 and real-engine-cpu.md), with log prefixes.
TEXT_CASES = [
    (
        "fp8-on-ampere",
        "ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are "
        "('fp8e4b15', 'fp8e5')",
        LogContext(),
        "fp8-on-ampere",
    ),
    (
        "trtllm-mha",
        "[2026-11-29 10:00:00 TP0] ValueError: TRTLLM MHA backend is only supported on Blackwell GPUs (SM100)",
        LogContext(engine="sglang"),
        "sm120-trtllm-attention",
    ),
    (
        "fmha-runner",
        "RuntimeError: TllmGenFmhaRunner: fmhaRunner.cuh:30: Unsupported architecture",
        LogContext(engine="sglang"),
        "sm120-trtllm-attention",
    ),
    (
        "gdn-allowlist-b200",
        "AssertionError: Only {'triton', 'trtllm_mha', 'flashinfer'} backends are supported on "
        "Blackwell GPUs for hybrid GDN models. Got prefill=fa4, decode=fa4",
        LogContext(engine="sglang", sm=100),
        "hybrid-gdn-attention-allowlist",
    ),
    (
        "vllm-head-dim",
        "(EngineCore pid=4242) ERROR 11-29 10:00:00 [core.py:700] RuntimeError: Unsupported CPU "
        "attention configuration: head_dim=16",
        LogContext(engine="vllm"),
        "vllm-cpu-head-dim",
    ),
    (
        "vllm-kv",
        "(EngineCore pid=77) ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.",
        LogContext(engine="vllm"),
        "vllm-kv-cache-too-small",
    ),
    (
        "graph-capture",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 1.50 GiB\n"
        "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        LogContext(engine="sglang"),
        "cuda-graph-capture-failed",
    ),
    (  # the fourth round of real logs: wordings of known families
        "uvicorn-bind-errno-twice",
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 44319): [errno 98] address "
        "already in use",
        LogContext(engine="vllm"),
        "port-in-use",
    ),
    (
        "tcpstore-cannot-listen",
        "RuntimeError: The server socket has failed to listen on any local network address. port: 46571, "
        "useIpv6: 0, code: -9",
        LogContext(),
        "port-in-use-family",
    ),
    (  # sgl_kernel built for a newer CUDA than the driver's libcuda has (sglang PR 8701)
        "driver-function-missing",
        "ImportError: /usr/local/lib/python3.10/dist-packages/sgl_kernel/common_ops.abi3.so: undefined symbol: "
        "cuGreenCtxDestroy",
        LogContext(engine="sglang"),
        "driver-mismatch",
    ),
    (  # nvcc's own count, without ninja's line after it (a flashinfer JIT build)
        "nvcc-errors-detected",
        'INFO 01-01 00:00:00 [core.py:1] building\n7 errors detected in the compilation of "/root/.cache/flashinfer/'
        'generated/gdn_prefill_kernel_bf16.cu".',
        LogContext(engine="vllm"),
        "jit-compile",
    ),
    (
        "engine-package-minimum",
        "Exception: sgl-kernel is installed with version 0.0.9.post2, which is less than the minimum required "
        "version 0.1.1. Please reinstall the latest version",
        LogContext(engine="sglang"),
        "dependency-mismatch",
    ),
    (  # two ranks' tracebacks interleaved and cut inside the quantisation scheme's check (vllm #26297)
        "cut-in-scheme-check",
        "Traceback (most recent call last):\n"
        '  File "/vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py", line 575, in '
        "_get_scheme_from_parts\n    self._check_scheme_supported(scheme.get_min_capability())",
        LogContext(engine="vllm"),
        "cut-in-quant-capability-check",
    ),
    (
        "runtime-oom",
        "The server is fired up and ready to roll!\n[2026-11-29 11:00:00 TP3] torch.OutOfMemoryError: "
        "CUDA out of memory. Tried to allocate 20.00 MiB",
        LogContext(),
        "cuda-oom-runtime",
    ),
    (  # no ready line in the excerpt, but a request was answered (a 500) before it: a runtime OOM (vllm #13067)
        "runtime-oom-after-a-500",
        "INFO 02-10 18:06:30 engine.py:275] Added request cmpl-30aa-0.\n"
        'INFO:     10.25.164.34:57224 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error\n'
        "ERROR 02-10 18:06:30 engine.py:139] OutOfMemoryError('CUDA out of memory. Tried to allocate 1.27 GiB.')",
        LogContext(engine="vllm"),
        "cuda-oom-runtime",
    ),
    (  # a supervisor's /health asked while the start went on is no request taken: still a start's OOM
        "startup-oom-after-health",
        'INFO:     127.0.0.1:50000 - "GET /health HTTP/1.1" 503 Service Unavailable\n'
        "[2026-11-29 11:00:00 TP0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
        LogContext(engine="sglang"),
        "cuda-oom-family",
    ),
    (
        "port-aux",
        "ValueError: metrics_port at 40290 is not available in 30 seconds. metrics_port is used by a process "
        "already. process.name()='sglang'",
        LogContext(),
        "port-in-use",
    ),
    (
        "port-uvicorn",
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use",
        LogContext(),
        "port-in-use",
    ),
    (
        "nccl",
        "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.",
        LogContext(),
        "nccl-p2p",
    ),
    (
        "illegal",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        LogContext(),
        "illegal-memory-access",
    ),
    ("jit", "ninja: build stopped: subcommand failed.", LogContext(), "jit-compile"),
    (
        "remote-code",
        "ValueError: The repository for /models/x contains custom code which must be executed to "
        "correctly load the model.",
        LogContext(),
        "trust-remote-code",
    ),
    (
        "unknown-arch",
        "ValueError: The checkpoint you are trying to load has model type `qwen3_5_moe` but "
        "Transformers does not recognize this architecture.",
        LogContext(),
        "unknown-architecture",
    ),
    ("torchvision", "RuntimeError: operator torchvision::nms does not exist", LogContext(), "dependency-mismatch"),
    ("no-module", "ModuleNotFoundError: No module named 'sgl_kernel'", LogContext(), "dependency-mismatch"),
    (
        "driver",
        "RuntimeError: The NVIDIA driver on your system is too old (found version 12020).",
        LogContext(),
        "driver-mismatch",
    ),
    (
        "health-timeout",
        "[2026-11-29 10:00:00] Health check failed. Server couldn't get a response from detokenizer "
        "for last 20 seconds.",
        LogContext(),
        "worker-timeout",
    ),
    ("no-progress", "[fleet] no log progress for 300 s", LogContext(), "fleet-no-progress"),
    (
        "cutedsl-garbage",  # fleet's own line, after the server's ready line and the smoke request's answer
        "The server is fired up and ready to roll!\n"
        'INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
        "[fleet] smoke check failed: garbage output (answer ' !!!!!!')",
        LogContext(engine="sglang", sm=120, argv=("--moe-runner-backend", "flashinfer_cutedsl")),
        "sm120-cutedsl-garbage",
    ),
    ("garbage", "[fleet] smoke check failed: garbage output (answer 'zzz')", LogContext(sm=86), "garbage-output"),
    ("oom-killer", "Killed", LogContext(), "killed-by-signal"),
    ("sigkill", "[fleet] engine killed by signal 9", LogContext(), "killed-by-signal"),
    (
        "bf16-on-turing",
        "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU "
        "has compute capability 7.5.",
        LogContext(engine="vllm"),
        "bf16-needs-ampere",
    ),
    ("ready-timeout", "[fleet] ready timeout after 900 s", LogContext(), "fleet-ready-timeout"),
    # SGLang 0.5.23's weight cache (ipc_loader.py, protocol.py) and fleet's launcher waiting for it
    (
        "weight-cache-not-ready",
        "fleet launcher: the weight cache daemon (pid 12) ended before it was ready: see /l/wc.log",
        LogContext(engine="sglang"),
        "weight-cache-not-ready",
    ),
    (
        "weight-cache-mismatch",
        "RuntimeError: [IpcModelLoader] Daemon config mismatch!\n  Engine config: {'tp_size': 2}",
        LogContext(engine="sglang"),
        "weight-cache-config-mismatch",
    ),
    (
        "weight-cache-daemon-died",
        "[2026-12-05 16:00:01 TP0] [IpcModelLoader] Weight cache daemon (pid=33) died while this engine holds its "
        "weights via CUDA IPC. The mapped weight pointers are now dangling; continuing would read freed GPU memory.",
        LogContext(engine="sglang"),
        "weight-cache-daemon-died",
    ),
    (
        "weight-cache-quantization",
        "sglang.srt.weight_cache.protocol.UnsupportedQuantForIPCError: [weight_cache:daemon] quantization method "
        "'modelopt_fp4' is not verified for CUDA IPC zero-copy weight sharing.",
        LogContext(engine="sglang"),
        "weight-cache-quantization",
    ),
    (
        "startup-stall",
        "[fleet] start-up stalled in graphs: no progress for 88 s (bound 87 s; it usually takes 29 s here)",
        LogContext(),
        "fleet-startup-stall",
    ),
    (
        "rendezvous-port",
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
        "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
        LogContext(),
        "port-in-use-family",
    ),
    (
        "mtp-on-hybrid",
        "ValueError: MTP speculative decoding needs the mamba extra_buffer strategy for hybrid models",
        LogContext(engine="vllm"),
        "spec-hybrid-mamba-family",
    ),
    (
        "peer-access",
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:368 'peer access is not supported between these "
        "two devices'",
        LogContext(),
        "custom-all-reduce-failed",
    ),
    (  # the custom all-reduce's CUDA IPC refused on an A100 box whose NCCL works (posttrainarena #46)
        "custom-all-reduce-invalid-argument",
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:455 'invalid argument'",
        LogContext(engine="vllm"),
        "custom-all-reduce-failed",
    ),
    (  # SGLang's cudart wrapper, raised from its custom all-reduce on PCIe RTX 4090s (sglang #4814)
        "cudart-peer-access",
        "RuntimeError: CUDART error: peer access is not supported between these two devices",
        LogContext(engine="sglang"),
        "custom-all-reduce-failed",
    ),
    (  # NCCL's trace: "host:pid:tid [dev]" records, a WARN then INFO lines unwinding it (sglang #3820)
        "nccl-socket-no-route",
        "node5:240:240 [6] misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 10.0.0.4<56849> returned "
        "113(No route to host) errno 115(Operation now in progress)\n"
        "node5:240:240 [6] NCCL INFO misc/socket.cc:570 -> 2\n"
        "node5:240:240 [6] NCCL INFO bootstrap.cc:285 -> 2\n"
        "[2025-02-24 14:09:34 TP14] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 1816, in run_scheduler_process',
        LogContext(engine="sglang"),
        "multinode-nccl-peer-unreachable",
    ),
    (  # an older NCCL's wording of it
        "nccl-net-refused",
        "h1:12:40 [0] NCCL WARN Net : Connect to 10.1.1.2<43125> failed : Connection refused\n"
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219, unhandled system error",
        LogContext(),
        "multinode-nccl-peer-unreachable",
    ),
    (  # vLLM told to use an attention backend this model's head size rules out (vllm #40677)
        "vllm-attention-backend",
        "Using AttentionBackendEnum.FLASHINFER backend.\nValueError: Selected backend AttentionBackendEnum.FLASHINFER "
        "is not valid for this configuration. Reason: ['head_size not supported']",
        LogContext(engine="vllm"),
        "vllm-attention-backend-invalid",
    ),
    (  # NCCL called on a side stream while a graph captured (vllm #4432): the CUDA runtime's capture error
        "capture-uncaptured-work",
        "w6:56890:56890 [0] enqueue.cc:267 NCCL WARN Cuda failure 'dependency created on uncaptured work in another "
        "stream'\nw6:56890:56890 [0] NCCL INFO enqueue.cc:1045 -> 1\nTraceback (most recent call last):\n"
        '  File "/vllm/worker/model_runner.py", line 921, in capture',
        LogContext(engine="vllm"),
        "cuda-graph-capture-family",
    ),
    (
        "cut-in-nccl",
        'Traceback (most recent call last):\n  File "/x/sglang/srt/distributed/device_communicators/pynccl.py", '
        "line 108, in __init__",
        LogContext(),
        "cut-in-nccl-init",
    ),
    (
        "nccl-last-error-oom",  # an NCCL error is what NCCL says of an allocation of its own that failed
        "(VllmWorker rank=7 pid=240) ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "(VllmWorker rank=7 pid=240) Last error:\n(VllmWorker rank=7 pid=240) Cuda failure 'out of memory'",
        LogContext(engine="vllm"),
        "cuda-oom-startup",
    ),
    (
        "a-warning-is-not-the-crash",  # vLLM warns that its kernels did not load, then fails on its port
        "WARNING 10-10 10:22:58 _custom_ops.py:18] Failed to import from vllm._C with ImportError('libcuda.so.1: "
        "cannot open shared object file: No such file or directory')\nOSError: [Errno 98] Address already in use",
        LogContext(engine="vllm"),
        "port-in-use",
    ),
    (  # the draft model of a hybrid model in graph capture (sglang #10392): the deepest frame says most
        "cut-in-hybrid-draft",
        "[2025-09-12 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", line 240, in capture_one_batch_size\n'
        '  File "/x/sglang/srt/models/qwen3_next_mtp.py", line 92, in forward',
        LogContext(engine="sglang"),
        "cut-in-hybrid-draft",
    ),
    (  # SGLang's slot allocator in its words since 0.5 (before: "Prefill out of memory. …")
        "sglang-slot-allocator-oom",
        "[2025-10-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/mem_cache/allocation.py", line 170, in alloc_token_slots\n'
        "RuntimeError: Out of memory. Try to lower your batch size.",
        LogContext(engine="sglang"),
        "kv-cache-budget",
    ),
    (  # a worker died, then the engine core waited for it minute after minute: the waits are not the cause
        "worker-died-then-waits",
        "DEBUG 07-04 17:35:10 [shm_broadcast.py:456] No available shared memory broadcast block found in 60 second.\n"
        "ERROR 07-04 17:35:16 [multiproc_executor.py:140] Worker proc VllmWorker-1 died unexpectedly, shutting down.\n"
        + "DEBUG 07-04 17:36:10 [shm_broadcast.py:456] No available shared memory broadcast block found in 60 second.\n"
        * 3,
        LogContext(engine="vllm"),
        "worker-died",
    ),
    (  # SGLang's slot allocator, its "Out of memory. Try to lower your batch size." cut off (sglang #26265)
        "cut-in-kv-alloc",
        "[2025-10-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/x/sglang/srt/mem_cache/common.py", line 380, in alloc_for_extend\n'
        '  File "/x/sglang/srt/mem_cache/common.py", line 190, in alloc_paged_token_slots_extend',
        LogContext(engine="sglang"),
        "cut-in-kv-alloc",
    ),
    (
        "cut-in-jit-build",
        'Traceback (most recent call last):\n  File "/x/torch/utils/cpp_extension.py", line 1740, in _jit_compile\n'
        '  File "/x/torch/utils/cpp_extension.py", line 2121, in _run_ninja_build',
        LogContext(),
        "cut-in-jit-build",
    ),
    (
        "cut-in-dtype-check",
        'Traceback (most recent call last):\n  File "/x/vllm/worker/worker.py", line 71, in init_model\n'
        '  File "/x/vllm/worker/worker.py", line 231, in _check_if_gpu_supports_dtype',
        LogContext(),
        "cut-in-dtype-check",
    ),
    (
        "cut-in-memory-profiling",
        'Traceback (most recent call last):\n  File "/x/vllm/v1/worker/gpu_worker.py", line 240, in '
        'determine_available_memory\n    self.model_runner.profile_run()\n  File "/x/vllm/v1/worker/'
        'gpu_model_runner.py", line 2600, in profile_run',
        LogContext(),
        "cut-in-memory-profiling",
    ),
    (
        "cut-in-kv-cache-setup",
        'Traceback (most recent call last):\n  File "/x/vllm/engine/llm_engine.py", line 310, in __init__\n'
        '  File "/x/vllm/engine/llm_engine.py", line 449, in _initialize_kv_caches',
        LogContext(),
        "cut-in-kv-cache-setup",
    ),
    (
        "cut-in-registry",
        'Traceback (most recent call last):\n  File "/x/sglang/srt/managers/router/model_runner.py", line 57, in '
        "get_model_cls_by_arch_name",
        LogContext(),
        "cut-in-model-registry",
    ),
    ("disk-full", "OSError: [Errno 28] No space left on device", LogContext(), "disk-full"),
    (
        "container-no-gpu-runtime",
        '[fleet] docker run: docker: Error response from daemon: could not select device driver "" with '
        "capabilities: [[gpu]].",
        LogContext(),
        "container-no-gpu-runtime",
    ),
    (
        "container-name-in-use-podman",
        '[fleet] podman run: Error: creating container storage: the container name "fleet-qwen" is already in use by '
        "2e3f. You have to remove that container to be able to reuse that name: that name is already in use",
        LogContext(),
        "container-name-in-use",
    ),
    (
        "container-name-in-use-docker",
        '[fleet] docker run: docker: Error response from daemon: Conflict. The container name "/fleet-qwen" is '
        'already in use by container "ab12". You have to remove (or rename) that container to be able to reuse '
        "that name.",
        LogContext(),
        "container-name-in-use",
    ),
    (
        "container-shm",
        "node1:77:92 [0] misc/shmutils.cc:72 NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-hMbb1Z (size 9637888)",
        LogContext(),
        "container-shm-too-small",
    ),
    (
        "container-oom",
        "[fleet] container OOM-killed: its memory limit was reached (exit 137)",
        LogContext(),
        "container-oom-killed",
    ),
    # one server over two nodes: torch.distributed's own lines as each rank prints them
    (
        "multinode-missing-rank",
        "[2026-11-30 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", line 189, in _create_c10d_store\n'
        "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients joined.",
        LogContext(engine="sglang"),
        "multinode-peer-never-joined",
    ),
    (
        "multinode-old-torch-barrier",
        "RuntimeError: Timed out initializing process group in store based barrier on rank: 8, for key: "
        "store_based_barrier_key:1 (world_size=16, worker_count=8, timeout=0:30:00)",
        LogContext(engine="sglang"),
        "multinode-peer-never-joined",
    ),
    (
        "multinode-rank0-unreachable",
        "torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while trying to "
        "connect to (10.0.0.1, 50000).",
        LogContext(engine="sglang"),
        "multinode-rank0-unreachable",
    ),
    (
        "multinode-rank0-refused",
        "torch.distributed.DistNetworkError: Connection refused: failed to connect to 10.0.0.1:50000",
        LogContext(engine="vllm"),
        "multinode-rank0-unreachable",
    ),
    (
        "multinode-gloo",
        "RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] no error",
        LogContext(engine="sglang"),
        "multinode-gloo-mesh",
    ),
    (
        "gloo-interface-missing",
        "RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != nullptr. "
        "Unable to find address for: eth9",
        LogContext(engine="sglang"),
        "multinode-socket-interface-missing",
    ),
    (
        "nccl-interface-missing",
        "node-b:1234:1234 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth9\n"
        "node-b:1234:1234 [0] bootstrap.cc:45 NCCL WARN Bootstrap : no socket interface found",
        LogContext(engine="vllm"),
        "multinode-socket-interface-missing",
    ),
    (
        "nccl-watchdog",
        "[rank1]:[E1130 10:00:00.000000000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600030 "
        "milliseconds before timing out.",
        LogContext(engine="sglang"),
        "nccl-collective-watchdog",
    ),
    (  # Ray's OutOfMemoryError is the host's RAM: not a CUDA allocation, and no memory fraction helps
        "ray-memory-monitor",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "Memory on the node (IP: 10.0.0.1, ID: 4f2a) where the task was running was 120.31GB / 125.80GB (0.956), "
        "which exceeds the memory usage threshold of 0.95. Ray killed this worker (ID: 9c1e) because it was the "
        "most recently scheduled task",
        LogContext(engine="vllm"),
        "host-memory-monitor",
    ),
    (  # vLLM's capture bar, then the allocation that failed inside it
        "vllm-capture-oom",
        "INFO 11-30 10:00:00 [gpu_model_runner.py:2000] Capturing CUDA graph shapes:  42%|████▏     | 28/67\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of "
        "47.41 GiB of which 801.25 MiB is free.",
        LogContext(engine="vllm"),
        "cuda-oom-in-graph-capture",
    ),
    (
        "elastic-sigkill",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\nRoot Cause (first observed failure):\n"
        "[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -9 (pid: 4321)\n  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 4321",
        LogContext(),
        "killed-by-sigkill",
    ),
    (
        "child-sigkill",
        "Child process unexpectedly failed with exitcode=-9. pid=4321",
        LogContext(),
        "killed-by-sigkill",
    ),
    (
        "heads-indivisible",
        "ValueError: Total number of attention heads (28) must be divisible by tensor parallel size (8).",
        LogContext(engine="vllm"),
        "parallel-size-indivisible",
    ),
    ("cpu-torch", "AssertionError: Torch not compiled with CUDA enabled", LogContext(), "dependency-mismatch"),
    (  # a Triton kernel tuned for more shared memory than this GPU has (consumer and SM120 parts have less)
        "triton-shared-memory",
        "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 147456, Hardware limit: "
        "101376. Reducing block sizes or `num_stages` may help.",
        LogContext(engine="sglang", sm=120),
        "gpu-arch-unsupported",
    ),
    (
        "sglang-child-sigkill",
        "Child process unexpectedly failed with exitcode=9. pid=32885",
        LogContext(),
        "killed-by-sigkill",
    ),
    (
        "sglang-child-exit-1",
        "Child process unexpectedly failed with exitcode=256. pid=32885",
        LogContext(),
        "worker-died",
    ),
    (
        "vllm-core-sigkill",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore_DP0': -9}",
        LogContext(engine="vllm"),
        "killed-by-sigkill",
    ),
    (
        "ray-memory-pressure",
        "(raylet) node_manager.cc:3007: 2 Workers (tasks / actors) killed due to memory pressure "
        "(OOM), 0 Workers crashed due to other reasons at node (ID: 1f, IP: 10.0.0.2)",
        LogContext(),
        "killed-by-oom-killer",
    ),
    (
        "xid-79",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
        LogContext(),
        "gpu-xid",
    ),
    (
        "device-side-assert",
        "../aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [267,0,0], "
        "thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.",
        LogContext(),
        "illegal-memory-access",
    ),
    (
        "rocm-fault",
        "Memory access fault by GPU node-2 (Agent handle: 0x55d5f3b0c2b0) on address 0x7f1a2c000000. Reason: Unknown.",
        LogContext(),
        "illegal-memory-access",
    ),
    (
        "batch-tokens",
        "ValueError: max_num_batched_tokens (2048) is smaller than max_model_len (32768). This effectively "
        "limits the maximum sequence length to max_num_batched_tokens",
        LogContext(engine="vllm"),
        "engine-args-rejected",
    ),
    (
        "wrapper-kwarg",
        "TypeError: AsyncEngineArgs.__init__() got an unexpected keyword argument 'limit_mm_per_prompt'",
        LogContext(engine="vllm"),
        "dependency-mismatch",
    ),
    (
        "sglang-decode-oom",
        "RuntimeError: Decode out of memory. Try to lower your batch size.",
        LogContext(),
        "kv-cache-budget",
    ),
    (
        "ptx-toolchain",
        "torch.AcceleratorError: CUDA error: the provided PTX was compiled with an unsupported toolchain.",
        LogContext(),
        "driver-mismatch",
    ),
    (
        "hub-unreachable",
        "OSError: We couldn't connect to 'https://huggingface.co' to load this file, couldn't find it "
        "in the cached files and it looks like meta-llama/Llama-2-7b-hf is not the path to a directory "
        "containing a file named config.json.",
        LogContext(),
        "model-files-missing",
    ),
    (
        "disk-full-in-loader",
        "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: "
        'StorageFull, message: "No space left on device" })',
        LogContext(),
        "disk-full",
    ),
    (
        "nccl-warn-beside-a-failure",
        "node01:3384:3384 [0] transport/net_ib.cc:63 NCCL WARN NET/IB : Got async event : "
        "port error\nRuntimeError: worker stopped",
        LogContext(),
        "nccl-warning",
    ),
    (
        "old-shm-wait",
        "WARNING 04-10 10:00:00 [shm_broadcast.py:396] No available block found in 60 second.\n" * 3,
        LogContext(engine="vllm"),
        "worker-shm-broadcast-hang",
    ),
    ("driver-oom", "RuntimeError: CUDA driver error: out of memory", LogContext(), "cuda-oom-family"),
    (
        "sglang-unsupported-arch",
        "ValueError: Unsupported architectures: ChatGLMForConditionalGeneration. Supported list: ['LlamaForCausalLM']",
        LogContext(engine="sglang"),
        "unknown-architecture",
    ),
    (
        "empty-config",
        "OSError: It looks like the config file at '/models/x/config.json' is not a valid JSON file.",
        LogContext(),
        "model-files-missing",
    ),
    (
        "ucx-segfault",
        "[gpu-1:1423 :0:1423] Caught signal 11 (Segmentation fault: address not mapped to object at "
        "address 0x17)\n==== backtrace (tid:   1423) ====",
        LogContext(),
        "native-crash",
    ),
    ("compose-137", "sglang-1 exited with code 137", LogContext(), "exit-137"),
    (
        "engine-core-died",
        "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        LogContext(),
        "worker-died",
    ),
    # the fifth round of real logs: families in other words, and prefixes that hid their level
    (
        "vllm-free-below",
        "ValueError: Free memory on device cuda:1 (20.1/23.5 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 21.15 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        LogContext(engine="vllm"),
        "vllm-free-memory-below-utilization",
    ),
    (
        "ptxas-subprocess",
        "subprocess.CalledProcessError: Command '/venv/lib/python3.12/site-packages/triton/backends/nvidia/bin/"
        "ptxas -lineinfo -v --gpu-name=sm_121a /tmp/t.ptx -o /tmp/t.cubin' returned non-zero exit status 255.",
        LogContext(engine="sglang"),
        "jit-compile",
    ),
    (
        "kernel-refuses-device",
        "RuntimeError: CUTLASS grouped GEMM kernel does not support current device sm_121",
        LogContext(engine="vllm"),
        "gpu-arch-unsupported",
    ),
    (
        "moe-backend-refuses",
        "ValueError: Fp8 MoE backend 'DEEPGEMM' does not support the deployment configuration since kernel "
        "does not support this GPU.",
        LogContext(engine="vllm"),
        "gpu-arch-unsupported",
    ),
    (
        "no-moe-backend",
        "NotImplementedError: No MxFp4 MoE backend supports the deployment configuration.",
        LogContext(engine="vllm"),
        "gpu-arch-unsupported",
    ),
    (
        "no-compiled-kernel",
        "RuntimeError: No compiled cutlass_scaled_mm for CUDA device capability: 121. Required capability: 90",
        LogContext(engine="vllm"),
        "gpu-arch-unsupported",
    ),
    (  # the inner cause, not the capture wrapper SGLang puts around it
        "capture-wraps-no-arch",
        "Exception: Capture cuda graph failed: No supported CUDA architectures found for major versions [12].",
        LogContext(engine="sglang"),
        "gpu-arch-unsupported",
    ),
    (  # PyTorch's C++ logging (glog): its E is an error, and the watchdog says it its own way
        "nccl-watchdog-glog",
        "[rank1]:[E305 09:12:01.123456789 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0 Rank 1] Timeout at "
        "NCCL work: 7, last enqueued NCCL work: 7, last completed NCCL work: 6.",
        LogContext(engine="sglang"),
        "nccl-collective-watchdog",
    ),
    (
        "nccl-watchdog-exception",
        "[rank0]:[E305 09:12:01.000000001 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0 Rank 0] Exception "
        "(either an error or timeout) detected by watchdog at work: 12",
        LogContext(engine="vllm"),
        "nccl-collective-watchdog",
    ),
    (
        "expandable-segments-oom",
        "RuntimeError: expandable_segments: memory mapping failed with OOM on device 3 while trying to map "
        "2097152 bytes (free: 1048576, total: 85017755648)",
        LogContext(engine="vllm"),
        "cuda-oom-family",
    ),
    (  # a padded traceback: its exception line indented
        "padded-timeout",
        'Traceback (most recent call last):\n  File "/x/shm_broadcast.py", line 500, in acquire_read\n'
        "    raise TimeoutError\n  TimeoutError   ",
        LogContext(engine="vllm"),
        "worker-timeout",
    ),
    (  # uvicorn's own lines as it ends in order, in stern's "POD CONTAINER" prefix
        "server-shut-down",
        "chat-7d9f8b6c5d-x2x9q vllm INFO:     Shutting down\n"
        "chat-7d9f8b6c5d-x2x9q vllm INFO:     Application shutdown complete.\n"
        "chat-7d9f8b6c5d-x2x9q vllm INFO:     Finished server process [1]",
        LogContext(engine="vllm"),
        "server-shut-down",
    ),
]


@pytest.mark.parametrize(("name", "text", "ctx", "signature"), TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_engine_error_texts_are_diagnosed(name: str, text: str, ctx: LogContext, signature: str) -> None:
    assert diagnose(text.splitlines(), ctx).signature == signature


FREE_BELOW = (
    "(EngineCore_DP0 pid=7) ValueError: Free memory on device cuda:0 ({free}/{total} GiB) on startup is less "
    "than desired GPU memory utilization ({asked}, 3.6 GiB). Decrease GPU memory utilization or reduce GPU "
    "memory used by other processes."
)


@pytest.mark.parametrize(
    ("free", "total", "asked", "fitted"),
    [
        ("3.22", "4.0", "0.9", "0.78"),  # what was free, less a margin (vllm #25837: 0.85 would fail again)
        ("75.5", "79.19", "0.95", "0.90"),  # nearly all free: at least a step lower than what failed
        ("30.0", "79.19", "0.9", None),  # most of the GPU held by another process: no smaller fraction hides it
        ("3.22", "0.0", "0.9", None),  # numbers that make no sense: no fix
    ],
)
def test_the_utilization_vllm_could_not_get_is_fitted_to_what_it_found_free(
    free: str, total: str, asked: str, fitted: str | None
) -> None:
    d = diagnose([FREE_BELOW.format(free=free, total=total, asked=asked)], LogContext(engine="vllm"))
    assert d.signature == "vllm-free-memory-below-utilization"
    assert (d.fix.set_flags if d.fix else None) == ((("--gpu-memory-utilization", fitted),) if fitted else None)


def test_a_shut_down_after_a_traceback_is_the_tracebacks_and_a_tracing_error_is_a_failure() -> None:
    crashed = (
        "Traceback (most recent call last):\nValueError: nobody knows this\nINFO:     Application shutdown complete."
    )
    assert diagnose(crashed.splitlines(), LogContext(engine="vllm")).category == "other"
    assert diagnose(crashed.splitlines(), LogContext(engine="vllm")).signature is None
    # Rust's tracing after its timestamp (Dynamo's frontends): an ERROR there is a failure, never "starting"
    traced = (
        "2025-11-05T01:56:54.292138Z  INFO dynamo_runtime::x: started\n2025-11-05T01:56:55.1Z ERROR scheduler.run: gone"
    )
    assert diagnose(traced.splitlines(), LogContext(engine="sglang")).category == "unknown"
    # a CI viewer's line number before a request handler's traceback: the handler's, not the engine's failure
    handled = "4558\t(ApiServer_3 pid=20) ERROR 03-01 13:31:08 [serving.py:214] Traceback (most recent call last):"
    assert diagnose(handled.splitlines(), LogContext(engine="vllm")).category == "starting"


NEAR_MISSES = [
    # (text, context, signature that must NOT match)
    (  # the engine's words in a request's path are the client's, not the engine's start-up
        'INFO:     10.0.0.9:4242 - "GET /Free%20memory?x=ValueError: Free memory on device cuda:0 (1.0/80.0 GiB) on '
        'startup is less than desired GPU memory utilization (0.9, 72.0 GiB) HTTP/1.1" 404 Not Found',
        LogContext(engine="vllm"),
        "vllm-free-memory-below-utilization",
    ),
    (  # SGLang's fallback: it warns and starts without the custom all-reduce (sglang #12496)
        "[2025-11-01 16:50:36 TP1] Setup Custom allreduce failed with CUDART error: peer access is not supported "
        "between these two devices. To silence this warning, specify --disable-custom-all-reduce explicitly.",
        LogContext(engine="sglang"),
        "custom-all-reduce-failed",
    ),
    (  # ncclSystemError: sockets and system calls (a network, a dead peer), not P2P (vllm #16707)
        "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)",
        LogContext(engine="vllm"),
        "nccl-p2p",
    ),
    (  # twice the tokens the cache holds: a few percent more memory cannot close that (bonito #7)
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (16816). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`",
        LogContext(engine="vllm"),
        "kv-fix-only-when-close",
    ),
    (  # a PD decode node raises it spuriously; extra_buffer there caps its requests (sglang #25116)
        "ValueError: Speculative decoding for Qwen3NextForCausalLM is not compatible with radix cache when using "
        "--mamba-scheduler-strategy no_buffer",
        LogContext(engine="sglang", argv=("--disaggregation-mode", "decode")),
        "sglang-spec-hybrid-no-buffer",
    ),
    (  # the GPU not known: the SM120 variant's flashinfer is what a B300 just rejected (sglang #35080)
        "AssertionError: Only {'trtllm_mha', 'triton', 'fa4'} backends are supported on Blackwell GPUs for hybrid "
        "GDN models. Got attention_backend=flashinfer.",
        LogContext(engine="sglang"),
        "hybrid-gdn-attention-allowlist-sm120",
    ),
    (
        "[2026-11-29 10:00:00] server_args=ServerArgs(speculative_algorithm='NEXTN', "
        "mamba_scheduler_strategy='no_buffer')",
        SM120,
        "sglang-spec-hybrid-no-buffer",
    ),
    (
        "AssertionError: mamba extra_buffer is not supported for FooForCausalLM model",
        SM120,
        "sglang-spec-params-incomplete",
    ),
    (
        "Traceback (most recent call last):\n  File \"a.py\", line 3, in g\nTypeError: 'NoneType' object cannot be "
        "interpreted as an integer",
        SM86,
        "sglang-spec-extra-buffer-runtime-typeerror",
    ),
    ("sglang serve: error: unrecognized arguments: --enable-turbo", SM86, "sglang-renamed-flag-unrecognized"),
    (
        "WARNING: --cuda-graph-max-bs is deprecated, use --cuda-graph-max-bs-decode instead.",
        SM86,
        "sglang-renamed-flag-ambiguous",
    ),
    ("INFO: invalid choice of backend ignored", SM86, "argparse-invalid-choice"),
    ("Quantization method modelopt_fp4 is supported on this GPU", SM120, "sglang-quant-min-capability"),
    ("Using trtllm attention backend", SM120, "sm120-trtllm-attention"),
    (
        "Load weight end. type=Qwen3_5MoeForConditionalGeneration, avail mem=30.00 GB, mem usage=28.00 GB.",
        SM120,
        "cuda-oom-startup",
    ),
    ("INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)", SM120, "port-in-use"),
    ("NCCL INFO Init COMPLETE\nNCCL version 2.21.5+cuda12.4", SM120, "nccl-p2p"),
    ("Killed 3 stale requests", SM120, "killed-by-signal"),
    ("[fleet] smoke check failed: HTTP 500 (Internal Server Error)", SM120, "garbage-output"),
    ("Loading safetensors checkpoint shards: 100% Completed | 94/94", SM120, "model-files-missing"),
    ("WARNING: flash_attn is not installed; using the default attention backend", SM120, "dependency-mismatch"),
    ("INFO: bfloat16 is supported on this GPU (compute capability 8.6)", SM86, "bf16-needs-ampere"),
    ("[fleet] ready after 41 s", SM86, "fleet-ready-timeout"),
    ("[fleet] start-up of graphs took 29 s, not stalled", SM86, "fleet-startup-stall"),
    ("watchdog_timeout=300", SM120, "worker-timeout"),
    ("Not enough memory for prefix cache; evicting", SM120, "sglang-kv-not-enough-memory"),
    (
        "[fleet] smoke check failed: garbage output (answer ' !!!')",
        LogContext(sm=120, argv=("--moe-runner-backend", "flashinfer_cutlass")),
        "sm120-cutedsl-garbage",
    ),
    ("WARNING: unrecognized arguments in the config file are ignored", SM86, "argparse-unrecognized"),
    ("[2026-11-29 10:00:00 TP0] Capture cuda graph end. Time elapsed: 2.10 s.", SM120, "cuda-graph-capture-failed"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", SM120, "cuda-oom-runtime"),
    (
        "INFO 11-29 10:00:00 [kv_cache_utils.py:1] GPU KV cache size: 12,288 tokens",
        LogContext(engine="vllm"),
        "vllm-kv-cache-too-small",
    ),
    ("Using fp8 e4m3 KV cache", SM86, "fp8-on-ampere"),
    (
        "none of the configured backends are usable on sm120",
        LogContext(engine="sglang", sm=100),
        "sm120-nvfp4-trtllm-moe",
    ),
    (
        "[2026-11-29 10:00:00] Attention backend not specified. Use flashinfer backend by default.",
        SM120,
        "hybrid-gdn-attention-allowlist",
    ),
    (
        "AssertionError: Only {'triton'} backends are supported on Blackwell GPUs for hybrid GDN models. Got fa3",
        LogContext(engine="sglang", sm=100),
        "hybrid-gdn-attention-allowlist-sm120",
    ),
    ("INFO: Using CPU attention backend (head_dim=32)", LogContext(engine="vllm"), "vllm-cpu-head-dim"),
    ("Set CUDA_LAUNCH_BLOCKING=1 to debug memory access errors", SM120, "illegal-memory-access"),
    ("JIT compiling flashinfer kernels, this may take a while", SM120, "jit-compile"),
    ("server_args=ServerArgs(trust_remote_code=False)", SM120, "trust-remote-code"),
    (
        "INFO 11-29 10:00:00 [model.py:1] Resolved architecture: Qwen3NextForCausalLM",
        LogContext(engine="vllm"),
        "unknown-architecture",
    ),
    ("CUDA driver version 13.0, runtime 12.9", SM120, "driver-mismatch"),
    (  # SGLang's warning on PCIe boxes at TP > 2 (a hand-written command without the flag): it serves on
        "[2026-11-29 10:00:00 TP0] Custom allreduce is disabled because it's not supported on more than two "
        "PCIe-only GPUs. To silence this warning, specify disable_custom_all_reduce=True explicitly.",
        SM120,
        "nccl-p2p-family",
    ),
    ("[fleet] log progress resumed", SM120, "fleet-no-progress"),
    ("[2026-11-29 10:00:00 TP0] Scheduler started; Initialization finished", SM120, "engine-child-failed"),
    (
        "server_args=ServerArgs(mamba_radix_cache_strategy='no_buffer')",
        LogContext(engine="sglang", version=(0, 5, 23)),
        "sglang-no-buffer-overlap",
    ),
    (  # an allocation that failed after capture finished is not capture's
        "Capturing CUDA graph shapes: 100%|██████████| 67/67\nGraph capturing finished in 12 secs, took 0.52 GiB\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        LogContext(engine="vllm"),
        "cuda-oom-in-graph-capture",
    ),
    (  # capture named only in a logged request: the failure's own line is not there
        'INFO:     127.0.0.1:5 - "POST /v1/completions?q=Capturing CUDA graph shapes CUDA out of memory HTTP/1.1" '
        "200 OK",
        LogContext(engine="vllm"),
        "cuda-oom-in-graph-capture",
    ),
    (  # a request or a path echoed in the log that quotes the loader's message is not the loader's error
        'INFO:     127.0.0.1:51234 - "POST /generate?q=[IpcModelLoader] Daemon config mismatch HTTP/1.1" 200 OK',
        LogContext(engine="sglang", version=(0, 5, 23)),
        "weight-cache-config-mismatch",
    ),
]


@pytest.mark.parametrize(("text", "ctx", "signature"), NEAR_MISSES, ids=[c[2] for c in NEAR_MISSES])
def test_near_misses_do_not_match(text: str, ctx: LogContext, signature: str) -> None:
    d = diagnose(text.splitlines(), ctx)
    if signature == "kv-fix-only-when-close":  # the family is right; the fix is what must not come
        assert d.signature == "vllm-kv-cache-too-small" and d.fix is None
    else:
        assert d.signature != signature


def test_every_signature_has_a_sample_and_every_fix_a_near_miss() -> None:
    """Families are sampled by the real corpus (tests/test_corpus.py) or by engine texts here; a signature
    that changes what runs (a fix) also has a near miss that must not trigger it."""
    sampled = (
        {c[-1] for c in SIM_CASES}
        | {c[3] for c in TEXT_CASES}
        | {"cuda-oom-startup", "sglang-spec-extra-buffer-runtime-typeerror"}
        | corpus_signatures()
    )
    near = {c[2] for c in NEAR_MISSES}
    sigs = builtin_signatures()
    assert {s.id for s in sigs} - sampled == set()
    assert {s.id for s in sigs if s.fix is not None} - near == set()


def corpus_signatures() -> set[str]:
    from test_corpus import CASES, diagnose_case

    return {d.signature for d in map(diagnose_case, CASES) if d.signature}


def test_messy_prefixes_are_stripped() -> None:
    raw = [
        "sglang_1  | [2026-11-29 10:00:00 TP3] Load weight begin.",
        "(EngineCore pid=12) INFO 11-29 10:00:00 [core.py:1] init engine took 1.0 s",
        "2026-11-29T10:00:00.123Z \x1b[31mValueError: boom\x1b[0m",
        "[TP0] Scheduler hit an exception: Traceback (most recent call last):\\n  File \"a\", line 1\\nKeyError: 'x'",
        "INFO 2025-11-19T20:16:36.096638074Z [resource.labels.containerName: vllm] (EngineCore_DP0 pid=270) ERROR "
        "11-19 12:16:36 [v1/engine/core.py:842] torch.OutOfMemoryError: CUDA out of memory.",  # Google Cloud Logging
    ]
    assert normalize(raw) == [
        "Load weight begin.",
        "init engine took 1.0 s",
        "ValueError: boom",
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "a", line 1',
        "KeyError: 'x'",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ]
    from fleet.crashes.logtext import normalize_log

    assert normalize_log(raw[-1:]).levels == ("ERROR",)  # the engine's level, not the viewer's INFO


def test_docker_compose_prefixed_valueerror_is_still_recognised(tmp_path: Path) -> None:
    lines = [f"sglang-1  | {x}" for x in sim_log(tmp_path, "0.5.11", Q35, HANDWRITTEN)]
    assert diagnose(lines, SM120).signature == "sglang-spec-hybrid-no-buffer"


def test_a_complete_unknown_exception_is_other_with_its_evidence() -> None:
    d = diagnose(["Traceback (most recent call last):", '  File "x", line 1, in y', "WeirdError: nope"])
    assert (d.category, d.signature) == ("other", None)
    assert "WeirdError: nope" in d.evidence and d.basis.startswith("no signature")


def test_an_exception_named_only_by_its_module_is_still_a_failure() -> None:
    """ "triton.runtime.errors.OutOfResources" ends in neither Error nor Exception: its module says what it is.
    A log that ends in one is a failure shown with its evidence, never one still starting."""
    d = diagnose(["Traceback (most recent call last):", '  File "k.py", line 9, in run', "somelib.errors.Refused: no"])
    assert d.category == "other" and "somelib.errors.Refused: no" in d.evidence
    assert diagnose(["Loading weights", "somelib.exceptions.Gone"]).category not in ("starting", "healthy")


@pytest.mark.parametrize(
    "line",
    [
        "Jun 02 10:00:01 gpu-node-1 vllm[1234]: ValueError: Invalid repository ID or local directory specified: '/m'",
        "[default0]:ValueError: Invalid repository ID or local directory specified: '/m'",
        "[rank0]: ValueError: Invalid repository ID or local directory specified: '/m'",
        "(ActorWorker(actor_infer-0) pid=12266, ) ValueError: Invalid repository ID or local directory specified: '/m'",
    ],
)
def test_the_failure_behind_journald_torchrun_and_ray_actor_prefixes_is_read(line: str) -> None:
    """A prefix left on the line hid the exception behind it: the log read as still starting."""
    assert diagnose(["INFO starting", line]).signature == "model-files-missing"


def test_a_fix_is_still_found_behind_a_rank_prefix() -> None:
    """'[rank0]: ' left a space before the exception, and the fixes' ^-anchored lines never matched."""
    d = diagnose(["[rank0]: RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."])
    assert d.signature == "sglang-kv-not-enough-memory" and d.fix is not None


@pytest.mark.parametrize(
    "noise",
    [
        "deepseek-0:5969:5969 [0] NCCL INFO NET/Plugin: Plugin load returned 2 : libnccl-net.so: cannot open shared "
        "object file: No such file or directory : when loading libnccl-net.so",
        "node01:3384:3384 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
    ],
)
def test_nccls_own_trace_and_warnings_beside_a_serving_server_are_healthy(noise: str) -> None:
    lines = [
        noise,
        "INFO:     Application startup complete.",
        'INFO:     1.2.3.4:5 - "POST /v1/chat/completions HTTP/1.1" 200',
    ]
    assert diagnose(lines).category == "healthy"


@pytest.mark.parametrize(
    "lines",
    [
        [
            "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:268, remote process exited or there was "
            "a network error, NCCL version 2.21.5",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        ],
        [
            "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.21.5",
            "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000",
        ],
    ],
    ids=["peer-gone", "two-ranks-one-gpu"],
)
def test_an_nccl_failure_that_is_not_peer_to_peer_gets_no_p2p_fix(lines: list[str]) -> None:
    """Disabling P2P and custom all-reduce cannot help a peer that died or two ranks on one GPU."""
    d = diagnose(lines)
    assert d.category == "nccl_p2p" and d.fix is None


def test_a_scheduler_child_failure_shows_the_real_exception() -> None:
    d = diagnose(
        [
            "[2026-11-29 10:00:00 TP2] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "x.py", line 1, in f',
            "ZeroDivisionError: division by zero",
        ]
    )
    assert d.category == "other" and "ZeroDivisionError: division by zero" in d.evidence


def test_a_failure_without_its_exception_is_unknown_with_evidence() -> None:
    d = diagnose(["INFO loading", "ERROR 05-26 07:50:26 [core.py:396] EngineCore failed to start."])
    assert d.category == "unknown" and d.evidence == ("EngineCore failed to start.",)


def test_a_traceback_cut_before_its_exception_says_where_its_frames_point() -> None:
    d = diagnose(
        [
            "Traceback (most recent call last):",
            '  File "/x/sglang/srt/model_executor/model_runner.py", line 344, in init_cuda_graphs',
            '  File "/x/sglang/srt/model_executor/cuda_graph_runner.py", line 148, in capture',
            '  File "/x/torch/nn/modules/module.py", line 1736, in _wrapped_call_impl',
        ]
    )
    assert (d.category, d.signature, d.fix) == ("cuda_graph_capture", "cut-in-graph-capture", None)
    assert "cut before its exception line" in d.basis


def test_a_message_wrapped_over_lines_is_matched_whole() -> None:
    lines = [
        "ValueError: Speculative decoding for Qwen3_5MoeForConditionalGeneration is not compatible",
        "with radix cache when using --mamba-scheduler-strategy no_buffer. To use radix cache with",
    ]
    assert diagnose(lines, SM120).signature == "sglang-spec-hybrid-no-buffer"


def test_a_single_shm_broadcast_wait_is_a_slow_load_and_a_run_of_them_a_hang() -> None:
    wait = (
        "(EngineCore pid=1) INFO 12-09 11:25:53 [shm_broadcast.py:466] No available shared memory broadcast "
        "block found in 60 seconds."
    )
    assert diagnose([wait], LogContext(engine="vllm")).category == "starting"
    assert diagnose([wait] * 3, LogContext(engine="vllm")).category == "worker_timeout"


def test_an_error_that_is_retried_is_not_a_crash() -> None:
    err = (
        "(APIServer pid=1) ERROR 02-02 14:28:39 [repo_utils.py:47] Error retrieving safetensors: Repo id must "
        "be in the form 'a/b'"
    )
    assert diagnose([f"{err}, retrying 1 of 2", err]).category == "starting"


def test_copies_of_a_crash_said_to_be_retried_do_not_hide_the_crash() -> None:
    """A client that could put lines in the log copies the crash it expects, each ending in "retrying":
    a raised exception is never a try's report, so the real crash after them is still one."""
    crash = [
        "[2025-06-02 10:05:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2700, in run_scheduler_process',
        "    scheduler.event_loop_overlap()",
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "",
        "[2025-06-02 10:05:01] Received sigquit from a child process. It usually means the child failed.",
    ]
    copies = [  # a frame's line with the exception after it is how a window reads a traceback's end
        "Scheduler hit an exception: Traceback (most recent call last): retrying",
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered retrying",
        "    scheduler.event_loop_overlap() torch.AcceleratorError: CUDA error: an illegal memory access was "
        "encountered retrying",
        "Received sigquit from a child process. It usually means the child failed retrying",
    ]
    d = diagnose([*SGLANG_READY, *copies, *crash], LogContext(engine="sglang"))
    assert d.category == "illegal_memory_access"


def test_a_client_error_after_ready_is_still_healthy() -> None:
    lines = [
        "INFO:     Application startup complete.",
        "ERROR 03-18 09:02:03 [serving_chat.py:133] Error with model object='error' message='The model `x` does "
        "not exist.' type='NotFoundError' param=None code=404",
    ]
    assert diagnose(lines).category == "healthy"


def test_remote_code_is_never_enabled_as_a_fix() -> None:
    d = diagnose(["ValueError: The repository for /m contains custom code which must be executed to load it."])
    assert d.signature == "trust-remote-code" and d.fix is None
    assert "operator" in d.explanation


def test_a_fix_comes_from_the_failure_line_not_from_text_inside_another_line() -> None:
    """A logged prompt can carry any phrase; a fix must start the line that reports the failure."""
    crafted = (
        "RuntimeError: Segmentation fault while handling prompt 'Speculative decoding for X is not compatible "
        "with radix cache when using --mamba-scheduler-strategy no_buffer'"
    )
    d = diagnose([crafted], SM120)
    assert d.fix is None
    logged = "INFO Received request: prompt='torch.OutOfMemoryError: CUDA out of memory'"
    assert diagnose([logged]).fix is None


VLLM_READY = [
    "INFO:     Application startup complete.",
    'INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
]
SGLANG_READY = ["[2025-06-02 10:00:05] The server is fired up and ready to roll!"]
LOGGER = "INFO 05-13 10:46:43 [request_logger.py:70] "


@pytest.mark.parametrize(
    ("engine", "lines"),
    [
        (  # a request id with a newline in it: vLLM's request logger gives the second line its prefix too
            "vllm",
            [*VLLM_READY, LOGGER + "Received request chatcmpl-x\r",
             LOGGER + "No available memory for the cache blocks: params: SamplingParams(n=1), lora_request: None."],
        ),
        (  # the same before the handlers moved: "logger.py:39]"
            "vllm",
            [*VLLM_READY, "INFO 12-27 08:52:17 logger.py:39] Received request x\r",
             "INFO 12-27 08:52:17 logger.py:39] No available memory for the cache blocks\r"],
        ),
        (  # a bad model name with a literal "\n", echoed by a handler (serving.py since vLLM 0.14)
            "vllm",
            [*VLLM_READY, "ERROR 02-21 16:58:46 [serving.py:280] Error with model error=ErrorInfo(message='The "
             "model `Traceback\\nNCCL error: unhandled cuda error\\nX` does not exist.', code=404)"],
        ),
        (  # --enable-log-outputs: the model's words, which a prompt steers
            "vllm",
            [*VLLM_READY, LOGGER + "Generated response chatcmpl-a: output: 'Traceback (most recent call last):\\n"
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\\n', finish_reason: stop"],
        ),
        (  # an access line whose method is not one of the usual, and its query
            "vllm",
            [*VLLM_READY, 'INFO:     10.0.0.9:41234 - "M-SEARCH /v1/models?Traceback\\nncclSystemError\\nX '
             'HTTP/1.1" 405'],
        ),
        (  # SGLang --log-requests-level 2, and its JSON request log
            "sglang",
            [*SGLANG_READY, "Receive OpenAI: obj={'messages': [{'role': 'user', 'content': 'Traceback (most recent "
             "call last):\\nRuntimeError: Not enough memory. Please try to increase --mem-fraction-static'}]}",
             '{"event": "request.received", "rid": "a", "obj": {"text": "Traceback (most recent call last):\\n'
             'RuntimeError: Not enough memory. Please try to increase --mem-fraction-static"}}'],
        ),
        (  # a request id with a raw newline that an error for the request echoes: the line after it is
            # unprefixed, but what only a start can say (a pool too small, a flag) cannot follow the ready line
            "sglang",
            [*SGLANG_READY, "[2025-06-02 10:01:00] [http_server] Error: Duplicate request ID detected: x",
             "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static",
             "launch_server.py: error: unrecognized arguments: --cuda-graph-max-bs 8",
             "NCCL error: unhandled cuda error", "OSError: [Errno 98] Address already in use"],
        ),
    ],
    ids=["vllm-request-id", "vllm-old-logger", "vllm-model-name", "vllm-outputs", "odd-method", "sglang-request-logs",
         "after-ready"],
)  # fmt: skip
def test_a_clients_words_never_become_a_fix(engine: str, lines: list[str]) -> None:
    """Found by a hostile pass: each of these once relaunched the engine with a changed memory fraction,
    P2P disabled, flags respelled or the port moved, from text an API client controls."""
    d = diagnose(lines, LogContext(engine=engine, argv=("--cuda-graph-max-bs", "8")))
    assert d.fix is None, (d.signature, d.evidence)


ASYNC_LLM = "(APIServer pid=4242) INFO 05-13 10:46:05 [async_llm.py:436] "


@pytest.mark.parametrize(
    "lines",
    [
        [  # AsyncLLM logs a request's id raw when it aborts it: an engine module, at INFO
            *VLLM_READY, ASYNC_LLM + "Request chatcmpl-x",
            ASYNC_LLM + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            ASYNC_LLM + " aborted.",
        ],
        [  # a logger prefix inside the client's text: the outermost prefix is the logger's
            "INFO:     Application startup complete.", LOGGER + "Received request chatcmpl-x\r",
            LOGGER + "INFO 05-13 10:46:05 [core.py:1] ValueError: No available memory for the cache blocks\r",
            "[fleet] engine killed by signal 9",
        ],
        [  # vLLM takes requests once it says it starts its API server (uvicorn got a socket bound before)
            "INFO 05-13 10:45:00 [api_server.py:1900] Starting vLLM API server 0 on http://0.0.0.0:8000",
            ASYNC_LLM + "Request chatcmpl-x", ASYNC_LLM + "RuntimeError: NCCL error: unhandled cuda error",
            "[fleet] engine killed by signal 9",
        ],
        [  # fleet's own smoke verdict, forged in what a model wrote before the answer fleet checked
            "[2025-06-02 10:00:05] The server is fired up and ready to roll!",
            "[2025-06-02 10:00:06] Failed to parse JSON part: ",
            "[fleet] smoke check failed: garbage output (answer 'zz')",
            '[2025-06-02 10:00:07] INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        ],
    ],
    ids=["async-llm-abort", "nested-prefix", "vllm-api-server", "forged-smoke-verdict"],
)  # fmt: skip
def test_a_clients_words_never_become_a_fix_second_pass(lines: list[str]) -> None:
    """A second hostile pass, after the first's routes were closed."""
    for engine in ("vllm", "sglang"):
        d = diagnose(lines, LogContext(engine=engine, sm=120, argv=("--moe-runner-backend", "flashinfer_cutedsl")))
        assert d.fix is None, (engine, d.signature, d.evidence)


def test_a_runtime_fix_comes_from_after_the_last_request_the_server_answered() -> None:
    """An out-of-memory line the server outlived (it answered after it) is not why it ended."""
    oom = "[2026-11-29 11:00:00 TP3] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"
    answered = '[2026-11-29 11:00:01] INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK'
    assert diagnose([*SGLANG_READY, answered, oom]).fix is not None
    assert diagnose([*SGLANG_READY, oom, answered]).fix is None


def test_a_segfault_is_not_hidden_by_the_exit_code_137_that_follows_it() -> None:
    """SGLang kills its own process tree after a child fails: compose then says 137 for every crash."""
    d = diagnose(["Fatal Python error: Segmentation fault", "", "Thread 0x7f (most recent call first):",
                  "sglang-decode exited with code 137"])  # fmt: skip
    assert d.signature == "native-crash"


def test_a_bind_that_fails_after_uvicorns_startup_line_keeps_its_fix() -> None:
    """uvicorn says "Application startup complete" before it binds; no client can reach a socket that
    never listened, so the port error's fix still holds."""
    bind = "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use"
    d = diagnose(["INFO:     Application startup complete.", bind])
    assert d.signature == "port-in-use" and d.fix is not None


def test_sglangs_custom_allreduce_fallback_warning_in_a_start_that_serves_is_healthy() -> None:
    lines = [
        "[2025-10-01 10:00:00 TP0] Setup Custom allreduce failed with CUDART error: peer access is not supported "
        "between these two devices. To silence this warning, specify --disable-custom-all-reduce explicitly.",
        "[16:43:29 TP0] Decode batch. #running-req: 1, #token: 80, token usage: 0.00, gen throughput (token/s): 50.1",
        "[2025-10-01 10:00:09] The server is fired up and ready to roll!",
    ]
    assert diagnose(lines, LogContext(engine="sglang")).category == "healthy"


def test_a_user_signature_with_an_unanchored_fix_is_refused() -> None:
    from fleet.crashes import parse_signatures

    raw = [
        {
            "id": "x",
            "category": "other",
            "patterns": ["boom"],
            "fix": {"set_flags": {"--dtype": "half"}},
            "explanation": "e",
        }
    ]
    with pytest.raises(ValueError, match="anchor every pattern"):
        parse_signatures(raw, "crashes/site.yaml")


def test_an_operators_signature_with_a_broken_expression_is_refused_when_read_naming_its_file() -> None:
    from fleet.crashes import parse_signatures

    raw = [{"id": "x", "category": "other", "patterns": ["^ok"], "unless": ["(unclosed"], "explanation": "e"}]
    with pytest.raises(ValueError, match=r"crashes/site.yaml: signature #1: missing \)"):
        parse_signatures(raw, "crashes/site.yaml")


def test_every_expression_of_fleets_own_signatures_compiles() -> None:
    """fleet's own file is compiled only when a log is read (a command that reads none pays nothing): this
    is where a broken expression in it is caught."""
    for sig in builtin_signatures():
        assert len(sig.patterns) == len(sig.pattern_texts) > 0
        assert len(sig.requires) == len(sig.requires_texts) and len(sig.unless) == len(sig.unless_texts)


def test_whole_traceback_is_captured_not_a_tail() -> None:
    lines = (
        ["noise"] * 100
        + ["Traceback (most recent call last):"]
        + [f'  File "f", line {i}, in g' for i in range(60)]
        + ["ValueError: x", "after"]
    )
    tb = traceback_of(lines)
    assert tb[0].startswith("Traceback") and tb[-1] == "ValueError: x" and len(tb) == 62


# --- the relaunch policy (pure; no clocks) ----------------------------------------------------------------

FIXABLE = diagnose(
    [
        "ValueError: Speculative decoding for M is not compatible with radix cache when using "
        "--mamba-scheduler-strategy no_buffer."
    ],
    SM120,
)


def test_a_known_fix_is_applied() -> None:
    decision = decide(FIXABLE, applied=[], attempt=1, max_attempts=3)
    assert isinstance(decision, Relaunch) and decision.signature == "sglang-spec-hybrid-no-buffer"
    assert ("--mamba-scheduler-strategy", "extra_buffer") in decision.fix.set_flags


def test_the_same_signature_after_its_fix_gives_up() -> None:
    decision = decide(FIXABLE, applied=["sglang-spec-hybrid-no-buffer"], attempt=2, max_attempts=3)
    assert isinstance(decision, GiveUp) and "came back after its fix" in decision.reason


def test_an_unknown_failure_gives_up_at_once() -> None:
    d = diagnose(["Traceback (most recent call last):", "WeirdError: nope"])
    assert isinstance(decide(d, [], 1, 3), GiveUp)


def test_attempts_are_bounded() -> None:
    assert isinstance(decide(FIXABLE, [], attempt=3, max_attempts=3), GiveUp)


def test_a_known_failure_without_fix_gives_up_with_its_explanation() -> None:
    d = diagnose(["RuntimeError: CUDA error: an illegal memory access was encountered"])
    decision = decide(d, [], 1, 3)
    assert isinstance(decision, GiveUp)
    assert decision.reason == (
        "known failure without an automatic fix: a kernel faulted (engine bug or a broken "
        "backend for this GPU); not fixable by relaunching"
    )


def test_fix_round_trips_through_json() -> None:
    fix = Fix(
        set_flags=(("--x", None), ("--y", "1")), remove_flags=("--z",), set_env=(("A", "1"),), derive="sweep_port"
    )
    assert Fix.from_json(fix.to_json()) == fix


def test_a_failure_at_the_end_of_a_very_long_line_is_still_seen() -> None:
    """Progress bars joined by carriage returns make one line of megabytes; the crash is at its end."""
    bars = "".join(f"Loading safetensors checkpoint shards: {i % 100}% |####| {i}/9999\r" for i in range(20000))
    line = bars + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    d = diagnose([line], LogContext())
    assert d.signature == "cuda-oom-startup", d


def test_an_upgrade_preview_names_the_known_crashes_the_new_version_drops_and_gains() -> None:
    from fleet.crashes.signatures import knowledge_diff

    lines = knowledge_diff(builtin_signatures(), "sglang", (0, 5, 11), (0, 5, 23))
    assert any(line.startswith("- known crash sglang-spec-hybrid-no-buffer (0.5.10 to 0.5.13)") for line in lines)
    assert any(line.startswith("+ known crash sglang-no-buffer-overlap (0.5.14 and later)") for line in lines)
    assert knowledge_diff(builtin_signatures(), "sglang", (0, 5, 23), (0, 5, 23)) == []
    assert not any("sglang-" in line for line in knowledge_diff(builtin_signatures(), "vllm", (0, 5, 11), (0, 5, 23)))


# --- a client's words are never evidence (issue 39: access logs, request bodies, \r and \n) -------------

FORGED_OOM = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.85"


@pytest.mark.parametrize(
    "lines",
    [
        ['INFO:     127.0.0.1:5000 - "GET /health?EngineDeadError HTTP/1.1" 200 OK'],
        ['INFO:     [::1]:5000 - "POST /v1/chat/completions?q=Segmentation%20fault HTTP/1.1" 200 OK'],
        [
            "[2026-11-29 10:00:00 TP0] Receive: obj=GenerateReqInput(text='Traceback (most recent call last):"
            f"\\n{FORGED_OOM}')"
        ],
        [f"[2026-11-29 10:00:00 TP0] Receive: obj=GenerateReqInput(text='x\r{FORGED_OOM}')"],
        [f"[2026-11-29 10:00:00 TP0] Finish: obj=GenerateReqInput(text='a'), out={{'text': '\r\n{FORGED_OOM}'}}"],
        [
            "INFO 03-18 09:03:16 [logger.py:39] Received request chatcmpl-1: prompt: 'torch.OutOfMemoryError: CUDA "
            "out of memory. Tried to allocate 2.00 GiB', params: SamplingParams(n=1)"
        ],
        [
            "INFO 03-18 09:03:16 [logger.py:39] Received request chatcmpl-2: prompt: 'ok\\n"
            "ValueError: Unsupported conversion from f16 to f16', params: SamplingParams(n=1)"
        ],
        [  # vLLM's handler logging one request's error: every line of the message gets its prefix
            "ERROR 03-18 09:03:16 [serving_chat.py:200] Error in preprocessing prompt inputs",
            "ERROR 03-18 09:03:16 [serving_chat.py:200] Traceback (most recent call last):",
            'ERROR 03-18 09:03:16 [serving_chat.py:200]   File "/x/serving_chat.py", line 200, in create',
            "ERROR 03-18 09:03:16 [serving_chat.py:200] jinja2.exceptions.TemplateError: the user wrote",
            "ERROR 03-18 09:03:16 [serving_chat.py:200] torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB",
        ],
    ],
    ids=[
        "access-query",
        "access-ipv6",
        "body-literal-newline",
        "body-carriage-return",
        "output-crlf",
        "vllm-prompt",
        "vllm-prompt-literal-newline",
        "vllm-handler-error",
    ],
)
def test_a_clients_text_in_the_log_is_never_a_failure_or_a_fix(lines: list[str]) -> None:
    d = diagnose(lines, SM120)
    assert d.category in ("starting", "healthy") and d.fix is None, d


TOOL_CALL = "[2026-12-07 10:00:01] WARNING: Invalid Inkling tool call payload: <call>"
HERMES = "ERROR 12-07 10:00:01 [hermes_tool_parser.py:117] "
RUNTIME_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


@pytest.mark.parametrize(
    "lines",
    [
        # SGLang's tool-call parser prints what a model wrote, newlines and all: its logger prefixes the
        # record's first line only
        [*SGLANG_READY, TOOL_CALL, "x", RUNTIME_OOM, "Received sigquit from a child process."],
        [*SGLANG_READY, "[2026-12-07 10:00:01] Error in detect_and_parse: bad call", RUNTIME_OOM],
        # a line of the echo that looks like a logged request again: the echo goes on after it
        [*SGLANG_READY, TOOL_CALL, "Receive: obj=x", RUNTIME_OOM],
        # the grammar a request sent, which SGLang's grammar backend refused, logged at ERROR
        [*SGLANG_READY, f"[2026-12-07 10:00:01] Hit invalid ebnf: key_string='{RUNTIME_OOM}', e=ValueError()"],
        # vLLM's tool-call parsers log a model's output that did not parse, every line prefixed
        [*VLLM_READY, HERMES + "Error in extracting tool call from response.", HERMES + RUNTIME_OOM],
    ],
    ids=["sglang-tool-call", "sglang-detect-and-parse", "echoed-receive", "sglang-grammar", "vllm-tool-parser"],
)
def test_a_models_or_clients_words_a_parser_echoes_never_become_a_fix(lines: list[str]) -> None:
    """What a tool-call parser or a grammar backend says of one request holds the request's or the model's
    words (a prompt steers both): never a fix, and what goes on from it unprefixed is no proof of serving."""
    d = diagnose(lines, SM120)
    assert d.fix is None, d


def test_a_carriage_return_in_a_logged_record_starts_no_record_of_the_engines() -> None:
    """vLLM logs an aborted request's id as the client sent it: after a carriage return in it, a forged
    prefix and crash are the record's text, at its level (found by a hostile pass)."""
    forged = f"Request chatcmpl-x\rERROR 05-13 10:46:06 [core.py:962] {RUNTIME_OOM}\r aborted."
    d = diagnose([*VLLM_READY, ASYNC_LLM + forged], LogContext(engine="vllm"))
    assert d.fix is None, d


def test_an_echoed_retrying_hides_no_crash_of_the_engines() -> None:
    """A client's echoed lines, each ending "retrying", once made the engine's own crash lines read as the
    last try of something retried: the crashed log was called healthy (found by a hostile pass)."""
    crash = [
        "Fatal Python error: Segmentation fault",
        "Received sigquit from a child process. It usually means the child failed.",
        "[fleet] engine killed by signal 9",
    ]
    echoed = [f"{line}, retrying" for line in crash]
    access = '[2026-12-07 10:00:04] INFO:     127.0.0.1:5001 - "POST /v1/chat/completions HTTP/1.1" 200 OK'
    d = diagnose([*SGLANG_READY, "[2026-12-07 10:00:03] Error in detect_and_parse: x", *echoed, access, *crash])
    assert d.category != "healthy" and d.found_failure, d


def test_a_ready_line_echoed_after_a_parsers_record_proves_nothing() -> None:
    d = diagnose([TOOL_CALL, "The server is fired up and ready to roll!"])
    assert d.category == "starting", d


@pytest.mark.parametrize(
    ("crash", "category"),
    [
        (['Traceback (most recent call last):', '  File "scheduler.py", line 1, in run', RUNTIME_OOM], "kv_cache_oom"),
        (["terminate called after throwing an instance of 'c10::Error'",
          "  what():  CUDA error: an illegal memory access was encountered"], None),
    ],
    ids=["traceback", "native"],
)  # fmt: skip
def test_an_engines_crash_printed_raw_after_a_parsers_record_is_still_a_failure(
    crash: list[str], category: str | None
) -> None:
    """A traceback's head ends the echo: the engine printed it, and its known fix stands. A native crash's
    lines may be the client's (no fix from them) but are never read as a healthy log."""
    d = diagnose([*SGLANG_READY, TOOL_CALL, *crash])
    assert d.category != "healthy" and d.found_failure, d
    if category:
        assert d.category == category and d.fix is not None, d
    else:
        assert d.fix is None, d


def test_a_real_failure_after_a_logged_request_is_still_seen() -> None:
    """The quote ends at the engine's next record: its own error is evidence again."""
    lines = [
        "[2026-11-29 10:00:00 TP0] Receive: obj=GenerateReqInput(text='hello')",
        "[2026-11-29 10:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "scheduler.py", line 1, in run',
        FORGED_OOM,
    ]
    d = diagnose(lines)
    assert d.category == "kv_cache_oom" and d.fix is not None


def test_served_requests_in_the_access_log_still_prove_serving() -> None:
    d = diagnose(['INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 200 OK'])
    assert d.category == "healthy"


def test_a_traceback_right_after_an_access_line_or_a_closed_request_is_the_engines() -> None:
    """Python prints a crash without a prefix; the record before it was a client's: an access line (one
    line by HTTP) or a logged request whose brackets closed. The traceback is still the engine's."""
    tb = ["Traceback (most recent call last):", '  File "scheduler.py", line 1, in run', FORGED_OOM]
    for before in (
        'INFO:     127.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK',
        "[2026-11-29 10:00:00 TP0] Receive: obj=GenerateReqInput(text='hello', sampling_params={'max_new_tokens': 8})",
        # a prompt's unmatched bracket: the engines log it as a repr on one line, so nothing is left open
        "[2026-11-29 10:00:00 TP0] Receive: obj=GenerateReqInput(text='sad :(', rid='a')",
        "INFO 03-18 09:03:16 [logger.py:39] Received request c-1: prompt: '[{ unclosed', params: SamplingParams(n=1)",
    ):
        d = diagnose([before, *tb])
        assert d.category == "kv_cache_oom", (before, d)


def test_a_start_fix_is_not_taken_from_after_health_answered_when_the_log_has_no_ready_line() -> None:
    """An engine at --log-level warning prints no ready or access line, so the log alone cannot say when
    clients could write to it; the watcher's own word that /health answered does (control.attempt_watch).
    A known start failure quoted after it by a request (an echoed grammar, a tool call) is no start
    failure: a crash after it is diagnosed without a start's fix."""
    from fleet.crashes.classify import ANSWERED_HEALTH

    t = "[2026-04-05 20:02:53] "
    echoed = [t + 'Skip invalid ebnf: ebnf=root ::= "a"', "OSError: [Errno 98] Address already in use", ", e=x"]
    crash = [t + "Scheduler hit an exception: Traceback (most recent call last):", "KeyError: 'rid-123'"]
    sglang = LogContext(engine="sglang")
    without = diagnose([t + "WARNING: a start-up warning", *echoed, *crash], sglang, builtin_signatures())
    assert without.fix is not None  # what the log alone allows: why the watcher's word is needed
    said = diagnose([t + "WARNING: a start-up warning", ANSWERED_HEALTH, *echoed, *crash], sglang, builtin_signatures())
    assert said.fix is None and not isinstance(decide(said, [], 1, 3), Relaunch)


def test_a_warning_alone_still_names_its_family() -> None:
    """A warning explains a crash only where no error line a signature knows does; alone, it still does."""
    warned = "WARNING 10-10 10:22:58 _custom_ops.py:18] Failed to import from vllm._C with ImportError('x.so')"
    assert diagnose([warned, "torch.OutOfMemoryError: CUDA out of memory."]).signature == "cuda-oom-startup"
    assert diagnose([warned, "RuntimeError: something else"]).signature == "dependency-mismatch"


def test_an_engine_that_ended_itself_over_an_exception_was_not_killed_from_outside() -> None:
    """SGLang's warm-up failed ("... warmup error: Traceback ..." on one line) and it SIGKILLed its own
    processes: the shell's "Killed" is not an OOM kill."""
    log = [
        "[2024-12-13 01:47:34] Initialization failed. warmup error: Traceback (most recent call last):",
        '  File "/x/sglang/srt/server.py", line 480, in _wait_and_warmup',
        "AssertionError: res=<Response [502]>, res.text=''",
        "Killed",
    ]
    assert diagnose(log).signature != "killed-by-signal"


def test_a_server_that_hangs_before_it_serves_is_not_healthy() -> None:
    """vLLM says "Starting vLLM API server" before its routes and before the socket is bound, and SGLang
    prints prefill batches before a scheduler that hangs decodes anything: neither proves serving."""
    started = ["(APIServer pid=1) INFO 04-08 20:32:02 [api_server.py:573] Starting vLLM server on http://0.0.0.0:8080"]
    assert diagnose(started).category == "starting"
    assert diagnose([*started, "(APIServer pid=1) INFO:     Application startup complete."]).category == "healthy"
    prefill = "[16:43:29 TP0] Prefill batch. #new-seq: 1, #new-token: 2062, #cached-token: 0, #queue-req: 38"
    assert diagnose([prefill]).category == "starting"
    decode = "[16:43:31 TP0] Decode batch. #running-req: 13, #token: 9000, gen throughput (token/s): 412.0"
    assert diagnose([prefill, decode]).category == "healthy"


def test_wrappers_logging_prefixes_are_stripped() -> None:
    """A framework that logs SGLang's records through its own formatter: "INFO <pid> [file:line] " and
    "[INFO] dotted.module: " (fastrl, sglang-omni)."""
    for line in (
        "2025-12-04 20:34:02 INFO 147907 [scheduler_metrics_mixin.py:287] Decode batch. #running-req: 48, #token: 3894",
        "2026-06-07 10:59:31,659 [INFO] sglang.srt.managers.scheduler_metrics_mixin: Decode batch, #running-req: 1",
    ):
        assert normalize([line])[0].startswith("Decode batch") and diagnose([line]).category == "healthy"


def test_a_kv_cache_a_few_percent_short_gets_more_memory_and_a_cut_number_gets_none() -> None:
    said = "ValueError: The model's max seq len (4096) is larger than the maximum number of tokens that can be stored "
    close = diagnose([said + "in KV cache (3792). Try increasing `gpu_memory_utilization`"], LogContext(engine="vllm"))
    assert close.fix is not None and close.fix.derive == "raise_mem_fraction"
    cut = diagnose([said + "in KV cache ("], LogContext(engine="vllm"))
    assert cut.signature == "vllm-kv-cache-too-small" and cut.fix is None


def test_a_fix_for_one_gpu_family_needs_that_gpu_known() -> None:
    line = "AssertionError: Only {'triton', 'fa4'} backends are supported on Blackwell GPUs for hybrid GDN models."
    assert diagnose([line], LogContext(engine="sglang", sm=120)).signature == "hybrid-gdn-attention-allowlist-sm120"
    assert diagnose([line], LogContext(engine="sglang")).signature == "hybrid-gdn-attention-allowlist"


def test_a_failed_graph_capture_never_gets_a_larger_graph_batch() -> None:
    from fleet.plan.fixes import DERIVED_FIXES
    from fleet.plan.types import Flag

    smaller = DERIVED_FIXES["smaller_graphs"]
    assert smaller([Flag("--cuda-graph-max-bs", "8", "r", "")], None)[0][0] == ("--cuda-graph-max-bs", "4")
    assert smaller([Flag("--cuda-graph-max-bs", "160", "r", "")], None)[0][0] == ("--cuda-graph-max-bs", "16")
    assert smaller([], None)[0][0] == ("--cuda-graph-max-bs", "16")
    spelled = [Flag("--cuda-graph-max-bs-decode", "8", "r", "")]  # SGLang 0.5.20 on: one per phase
    assert smaller(spelled, (0, 5, 23))[0][0] == ("--cuda-graph-max-bs", "4")  # respelled when applied


def test_nccl_errors_in_any_case_and_graph_capture_in_torchs_own_frames() -> None:
    assert diagnose(["NCCL Error 2: unhandled system error"]).category == "nccl_p2p"
    capture = [
        "Traceback (most recent call last):",
        '  File "/x/torch/cuda/graphs.py", line 88, in capture_end',
        "RuntimeError: CUDA error: out of memory",
    ]
    assert diagnose(capture).signature == "cuda-oom-in-graph-capture"


def test_the_memory_fraction_is_not_moved_back_and_forth() -> None:
    """SGLang's "Not enough memory" asks for a larger fraction, and the out-of-memory at that fraction for a
    smaller one (sglang #4330): relaunching would alternate between the two until the attempts ran out."""
    kv = diagnose(["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."], SM120)
    oom = diagnose(["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"], SM120)
    assert isinstance(decide(kv, [], 1, 5), Relaunch) and isinstance(decide(oom, [], 1, 5), Relaunch)
    back = decide(kv, [str(oom.signature)], 2, 5)
    assert isinstance(back, GiveUp) and "no fraction avoids both" in back.reason
    assert isinstance(decide(oom, [str(kv.signature)], 2, 5), GiveUp)


def test_a_fitted_utilization_is_not_raised_again_by_a_kv_cache_too_small() -> None:
    """vLLM's fix fitted to the free memory lowers the fraction as its fixed step does: a KV cache too
    small for one sequence after it would only move it back (and the other way round)."""
    fitted = diagnose([FREE_BELOW.format(free="3.22", total="4.0", asked="0.9")], LogContext(engine="vllm"))
    kv = diagnose(
        ["ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."],
        LogContext(engine="vllm"),
    )
    assert isinstance(decide(fitted, [], 1, 5), Relaunch) and isinstance(decide(kv, [], 1, 5), Relaunch)
    assert isinstance(decide(kv, [str(fitted.signature)], 2, 5), GiveUp)
    assert isinstance(decide(fitted, [str(kv.signature)], 2, 5), GiveUp)


def test_a_larger_fraction_after_smaller_graphs_is_still_tried() -> None:
    """Smaller graphs free the memory the capture took: the KV pool may then take a larger fraction (the
    weight cache's fix loop: capture out of memory, then a pool too small)."""
    kv = diagnose(["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."], SM120)
    assert isinstance(decide(kv, ["cuda-graph-capture-failed"], 2, 5), Relaunch)


def test_a_request_id_saying_traceback_does_not_clear_a_kill() -> None:
    """The engine's own traceback before "Killed" means it ended itself; a client's request id that says
    "Traceback" in an engine's line means nothing."""
    aborted = "INFO 05-06 10:00:01 [async_llm.py:420] Aborted request chatcmpl-Traceback (most recent call last)."
    assert diagnose([aborted, "Killed"]).signature == "killed-by-signal"


def test_an_exceptions_name_in_brackets_after_a_level_is_not_a_logger_prefix() -> None:
    assert normalize(["[ERROR] ValueError: something strange happened"]) == ["ValueError: something strange happened"]
    assert diagnose(["[ERROR] torch.OutOfMemoryError: CUDA out of memory."]).category == "cuda_oom_startup"


def test_an_oom_in_vllms_serving_loop_is_the_running_servers_though_no_request_was_logged() -> None:
    """An excerpt without the access log: the OOM was taken for a start-up one (and a start-up's fix, not
    the running server's smaller static fraction). A
    traceback through the engine core's busy loop, or the front end's output handler failing, shows the
    engine had finished starting, wherever it comes in the log."""
    oom = "(EngineCore pid=112) ERROR 05-01 14:39:06 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. "
    oom += "Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 21.75 MiB is free."
    start = ['  File "/v/vllm/v1/worker/gpu_worker.py", line 290, in determine_available_memory', oom]
    assert diagnose(start, LogContext(engine="vllm")).category == "cuda_oom_startup"
    loop = ['  File "/v/vllm/v1/engine/core.py", line 933, in run_busy_loop', oom]
    handler = [oom, "(APIServer pid=1) ERROR 05-01 14:39:06 [async_llm.py:699] AsyncLLM output_handler failed."]
    for log in (loop, handler):
        d = diagnose(log, LogContext(engine="vllm"))
        assert (d.category, d.signature) == ("kv_cache_oom", "cuda-oom-runtime")
        assert d.fix is not None and d.fix.derive == "lower_mem_fraction"
