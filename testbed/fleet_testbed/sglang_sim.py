"""SGLang engine simulator: takes SGLang's real flags, prints SGLang's real log lines and tracebacks.

Launched exactly like the real engine (`<python> -m sglang.launch_server ...` or `sglang serve ...`)
through the stand-in `sglang` package of a simulated host. Behaviour is a table of conditions, each
citing the engines.md fact it reproduces (see `RESOLUTION_RULES` and `RUNTIME_RULES`). It is test
equipment: fleet never imports it.

Traceback frames whose line numbers engines.md records (server_args.py 845/883/2236/2453/3521,
speculative_hook.py 1162, loader.py 244, scheduler.py 3938, engine.py 1187) are exact; other frames
are shaped like the real ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fleet_testbed import gpustate, sim_child, sim_pooling, sim_weight_cache
from fleet_testbed.sglang_flags import RENAMED, Version, build_parser, parse_version

SITE = "/opt/sglang/.venv/lib/python3.12/site-packages/sglang"
HYBRID_ARCHS = {
    "Qwen3NextForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
}
READY_LINE = "The server is fired up and ready to roll!"


class SimError(Exception):
    """An exception the real engine raises; `frames` is the traceback it prints."""

    def __init__(self, exc_type: str, message: str, frames: list[tuple[str, int, str, str]]) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.frames = frames

    def traceback_text(self, head: list[tuple[str, int, str, str]]) -> str:
        lines = ["Traceback (most recent call last):"]
        for file, line, func, src in [*head, *self.frames]:
            lines.append(f'  File "{file}", line {line}, in {func}')
            if src:
                lines.append(f"    {src}")
        lines.append(f"{self.exc_type}: {self.message}" if self.message else self.exc_type)
        return "\n".join(lines)


LAUNCHER_HEAD = [
    ("<frozen runpy>", 198, "_run_module_as_main", ""),
    ("<frozen runpy>", 88, "_run_code", ""),
    (f"{SITE}/launch_server.py", 24, "<module>", "server_args = prepare_server_args(sys.argv[1:])"),
    (f"{SITE}/srt/server_args.py", 5916, "prepare_server_args", "return ServerArgs.from_cli_args(raw_args)"),
    (
        f"{SITE}/srt/server_args.py",
        5428,
        "from_cli_args",
        "return cls(**{attr: getattr(args, attr) for attr in attrs})",
    ),
    ("<string>", 330, "__init__", ""),
]


@dataclass
class Model:
    path: str
    config: dict[str, Any]
    quant_algo: str | None
    weights_bytes: int

    @property
    def text(self) -> dict[str, Any]:
        tc = self.config.get("text_config")
        return tc if isinstance(tc, dict) else self.config

    @property
    def arch(self) -> str:
        return str((self.config.get("architectures") or ["?"])[0])

    @property
    def hybrid(self) -> bool:  # engines.md §4.2
        return self.arch in HYBRID_ARCHS or "linear_attention" in self.text.get("layer_types", [])

    @property
    def moe(self) -> bool:
        return int(self.text.get("num_experts") or 0) > 0

    @property
    def nvfp4(self) -> bool:
        return bool(self.quant_algo and "FP4" in self.quant_algo.upper())


KNOWN_MODEL_TYPES = {
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_next",
    "llama",
    "qwen3",
    "xlm-roberta",
}  # the simulated transformers' configs


def registered_architectures() -> set[str]:
    """The simulated engine's registry, collected as srt/models/registry.py does: each module's EntryClass."""
    import importlib
    import pkgutil

    import sglang.srt.models as package

    names: set[str] = set()
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        entry = getattr(importlib.import_module(info.name), "EntryClass", None)
        names.update(e.__name__ for e in (entry if isinstance(entry, list) else [entry] if entry else []))
    return names


def load_model(path: str) -> Model:
    cfg_path = Path(path) / "config.json"
    if not cfg_path.exists():
        raise SimError(
            "OSError",
            f"{path} does not appear to have a file named config.json. Checkout "
            f"'https://huggingface.co/{path}/tree/main' for available files.",
            [(f"{SITE}/srt/utils/hf_transformers_utils.py", 262, "get_config", "config = AutoConfig.from_pretrained(")],
        )
    config = json.loads(cfg_path.read_text())
    quant = (config.get("quantization_config") or {}).get("quant_algo")
    hq = Path(path) / "hf_quant_config.json"
    if quant is None and hq.exists():
        quant = json.loads(hq.read_text()).get("quantization", {}).get("quant_algo")
    index = Path(path) / "model.safetensors.index.json"
    size = json.loads(index.read_text())["metadata"]["total_size"] if index.exists() else 1 << 30
    return Model(path, config, quant, int(size))


@dataclass
class Resolved:
    args: Any
    version: Version
    model: Model
    gpus: list[dict[str, Any]]
    env: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    garbage: bool = False
    spec_v2: bool = False

    def __getattr__(self, name: str) -> Any:  # the record's fields, as ServerArgs has them
        return getattr(self.args, name)

    @property
    def sm(self) -> int:
        major, minor = self.gpus[0]["compute_capability"].split(".")
        return int(major) * 10 + int(minor)


def _strategy_attr(version: Version) -> str:
    return "mamba_radix_cache_strategy" if version >= RENAMED else "mamba_scheduler_strategy"


def resolve(
    argv: list[str],
    version: Version,
    gpus: list[dict[str, Any]],
    env: dict[str, str],
    picks: dict[str, str] | None = None,
) -> Resolved:
    """Parse + resolve like `prepare_server_args` / `ServerArgs.__post_init__`. argparse errors exit 2.
    `picks`: flag -> what this engine build picks itself where the command line leaves the flag out (a
    host's `engine_picks`, standing for a build that picks otherwise than the released versions)."""
    args = build_parser(version).parse_args(argv)
    if not gpus:  # CUDA_VISIBLE_DEVICES named no GPU of this host: torch finds none when args are resolved
        raise SimError(
            "RuntimeError",
            "No CUDA GPUs are available",
            [(f"{SITE}/srt/server_args.py", 860, "__post_init__", "self._handle_gpu_memory_settings()")],
        )
    model = load_model(args.model_path)
    auto_map = model.config.get("auto_map") or {}
    if (
        "AutoConfig" in auto_map
        and model.config.get("model_type") not in KNOWN_MODEL_TYPES
        and not args.trust_remote_code
    ):
        # transformers' AutoConfig, reading a config whose model type it does not know (dynamic_module_utils.py)
        raise SimError(
            "ValueError",
            f"The repository {args.model_path} contains custom code which must be executed to correctly load the "
            f"model. You can inspect the repository content at {os.path.abspath(args.model_path)} .\n You can "
            f"inspect the repository content at https://hf.co/{args.model_path}.\nPlease pass the argument "
            "`trust_remote_code=True` to allow custom code to be run.",
            [(f"{SITE}/srt/utils/hf_transformers_utils.py", 262, "get_config", "config = AutoConfig.from_pretrained(")],
        )
    r = Resolved(args, version, model, gpus, env)
    algo = (args.speculative_algorithm or "").upper()
    if getattr(args, "weight_cache_mode", "off") != "off" and args.speculative_algorithm:
        raise SimError(  # 0.5.23 arg_groups/model_path_hook.py
            "ValueError",
            "--weight-cache-mode is not supported together with speculative decoding (--speculative-algorithm): the "
            "weight cache daemon does not export the draft model's weights. Disable one of them (--weight-cache-mode "
            "off) for this configuration.",
            [(f"{SITE}/srt/arg_groups/model_path_hook.py", 282, "validate_weight_cache", "raise ValueError(")],
        )
    strategy_attr = _strategy_attr(version)
    strategy = getattr(args, strategy_attr, None) or "auto"

    # engines.md §1.2 + §2.1: mamba strategy resolution, model-specific adjustments run first (0.5.11 L845)
    if model.hybrid and version >= (0, 5, 9):
        if strategy == "auto":  # 0.5.14+: auto -> extra_buffer for these archs; before: no_buffer (0.5.11 L1079)
            strategy = "extra_buffer" if version >= RENAMED and not args.disable_radix_cache else "no_buffer"
        setattr(args, strategy_attr, strategy)
        if algo in ("NEXTN", "EAGLE", "EAGLE3") and strategy == "no_buffer" and not args.disable_radix_cache:
            if version < (0, 5, 10):
                r.warnings.append(
                    f"Disabling radix cache since speculative decoding for {model.arch} is not "
                    "supported with radix cache yet."
                )
                args.disable_radix_cache = True
            elif version < RENAMED:
                raise SimError(
                    "ValueError",
                    (
                        f"Speculative decoding for {model.arch} is not compatible with radix cache when using "
                        "--mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
                        "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."
                    ),
                    [
                        (
                            f"{SITE}/srt/server_args.py",
                            845,
                            "__post_init__",
                            "self._handle_model_specific_adjustments()",
                        ),
                        (
                            f"{SITE}/srt/server_args.py",
                            2236,
                            "_handle_model_specific_adjustments",
                            "self._handle_mamba_radix_cache(",
                        ),
                        (f"{SITE}/srt/server_args.py", 2453, "_handle_mamba_radix_cache", "raise ValueError("),
                    ],
                )
            else:  # engines.md §1.2: 0.5.23 mamba_hook.py L158
                raise SimError(
                    "AssertionError",
                    "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.",
                    [
                        (
                            f"{SITE}/srt/arg_groups/mamba_hook.py",
                            158,
                            "validate_mamba_no_buffer",
                            "assert not server_args.enable_overlap_schedule, (",
                        )
                    ],
                )

    # engines.md §1.3 / §2.1: the bare AssertionError (0.5.11 L3521, 0.5.23 speculative_hook.py L1162)
    if algo:
        if args.speculative_num_steps is None and (
            args.speculative_eagle_topk is not None or args.speculative_num_draft_tokens is not None
        ):
            if version >= (0, 5, 20):
                frames = [
                    (
                        f"{SITE}/srt/arg_groups/speculative_hook.py",
                        1162,
                        "_handle_eagle_family",
                        "and self.speculative_num_draft_tokens is None",
                    )
                ]
            else:
                frames = [
                    (f"{SITE}/srt/server_args.py", 883, "__post_init__", "self._handle_speculative_decoding()"),
                    (
                        f"{SITE}/srt/server_args.py",
                        3521,
                        "_handle_speculative_decoding",
                        "and self.speculative_num_draft_tokens is None",
                    ),
                ]
            raise SimError("AssertionError", "", frames)
        if args.speculative_num_steps is None:  # auto_choose_speculative_params
            args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens = 3, 1, 4
        if args.speculative_eagle_topk == 1 and args.speculative_num_draft_tokens != args.speculative_num_steps + 1:
            r.warnings.append(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
            )
            args.speculative_num_draft_tokens = args.speculative_num_steps + 1
        if args.max_running_requests is None:
            args.max_running_requests = 48
            r.warnings.append(
                "Max running requests is reset to 48 for speculative decoding. You can override this "
                "by explicitly setting --max-running-requests."
            )
        if algo == "NEXTN":
            args.speculative_algorithm = "EAGLE"
        # engines.md §1.9: SGLANG_ENABLE_SPEC_V2 default False <= 0.5.10, True 0.5.11-0.5.13, gone from 0.5.14
        default_v2 = version >= (0, 5, 11)
        flag = env.get("SGLANG_ENABLE_SPEC_V2")
        v2 = default_v2 if flag is None or version >= RENAMED else flag.lower() in ("1", "true")
        if (args.speculative_eagle_topk or 1) > 1 or not v2:
            r.spec_v2 = False
            r.warnings.append(
                "Spec v1 is used for eagle/eagle3/standalone speculative decoding because SGLANG_ENABLE_SPEC_V2=False"
                if not v2
                else "Spec v1 is used because topk > 1"
            )
        else:
            r.spec_v2 = True
            r.warnings.append("Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.")

    # engines.md §1.6: the attention backend SGLang picks itself; then the hybrid GDN allow-list on Blackwell
    if args.attention_backend is None:
        args.attention_backend = default_attention_backend(model, r.sm)
    # test hook: an engine build that picks otherwise than the released versions (resolution's record fields)
    for flag, value in (picks or {}).items():  # {"--attention-backend": "trtllm_mha"}
        if not any(w == flag or w.startswith(flag + "=") for w in argv):
            action = build_parser(version)._option_string_actions[flag]
            setattr(args, action.dest, action.type(value) if callable(action.type) else value)
    if model.hybrid and r.sm >= 100 and args.attention_backend:
        allowed = (
            {"triton", "trtllm_mha", "flashinfer"}
            if version >= (0, 5, 20)
            else {"triton", "trtllm_mha", "fa4", "flashinfer"}
        )
        if args.attention_backend not in allowed:
            raise SimError(
                "AssertionError",
                (
                    f"Only {sorted(allowed)} backends are supported on Blackwell GPUs for hybrid GDN models. Got "
                    f"prefill={args.attention_backend}, decode={args.attention_backend}"
                ),
                [(f"{SITE}/srt/layers/attention/attention_registry.py", 233, "attn_backend_wrapper", "assert (")],
            )
    if args.mem_fraction_static is None:  # engines.md §1.8: 0.745 on 96 GB, 0.717 on 48 GB
        args.mem_fraction_static = 0.745 if gpus[0]["memory_total_mib"] > 60000 else 0.717
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    return r


def default_attention_backend(model: Model, sm: int) -> str:
    """SGLang 0.5.11/0.5.23's own pick (server_args.py `_get_default_attn_backend` and the model-specific
    adjustments, as their resolution gives it on a fake GPU): MLA models trtllm_mla on SM100, triton
    elsewhere but Hopper (fa3); the others fa3 on Hopper, trtllm_mha on SM100, FlashInfer elsewhere (triton
    for gpt-oss, whose attention sinks FlashInfer lacks)."""
    if model.config.get("kv_lora_rank") is not None or (model.config.get("text_config") or {}).get("kv_lora_rank"):
        return {90: "fa3"}.get(sm, "trtllm_mla" if 100 <= sm < 110 else "triton")
    if sm == 90:
        return "fa3"
    if 100 <= sm < 110:
        return "trtllm_mha"
    return "triton" if "GptOssForCausalLM" in (model.config.get("architectures") or []) else "flashinfer"


def current_version() -> Version:
    return parse_version(gpustate.sglang_version(gpustate.load_host()))


def parse_server_args(argv: list[str]) -> Any:
    """What 0.5.23's `prepare_server_args` does: parse only (argparse errors exit 2)."""
    time.sleep(float(gpustate.load_host().get("check_delay_s", 0)))  # test hook: a slow check
    return build_parser(current_version()).parse_args(argv)


def prepare_server_args(argv: list[str]) -> Resolved:
    """What the stand-in `sglang.srt.server_args.prepare_server_args` does up to 0.5.19: parse and resolve."""
    time.sleep(float(gpustate.load_host().get("check_delay_s", 0)))  # test hook: a slow check
    return resolve_server_args(argv)


def resolve_server_args(argv: list[str]) -> Resolved:
    """Resolution on this host's (simulated) GPUs: 0.5.11's `__post_init__`, 0.5.23's `resolve_once()`."""
    picks = gpustate.load_host().get("engine_picks")
    return resolve(argv, current_version(), gpustate.visible_gpus(), dict(os.environ), picks)


# --- the running server ----------------------------------------------------------------------------------


def _ts(tp: int | None = None) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"[{stamp} TP{tp}]" if tp is not None else f"[{stamp}]"


def log(msg: str, tp: int | None = None) -> None:
    sys.stdout.write(f"{_ts(tp)} {msg}\n")
    sys.stdout.flush()


# The start-up lines of SGLang 0.5.23's sources (distributed/bootstrap.py "Init parallel begin.";
# model_runner.py "Load weight end. elapsed=..."; kv_cache_configurator.py "Memory pool end." alone;
# cuda_graph_setup.py "Capture target decode CUDA graph begin. backend=..."); before it, 0.5.11's
# ("Init torch distributed begin.", "KV Cache is allocated." then "Memory pool end.", "Capture cuda graph
# begin."). Both print tqdm bars: checkpoint shards (utils/common.py BAR_FORMAT) and capture batches.
NEW_STARTUP_LINES = (0, 5, 23)


def bar(text: str) -> None:
    """One redraw of a tqdm bar as the log file gets it: a carriage return first; the line ends only when
    the bar closes (close_bar)."""
    sys.stdout.write("\r" + text)
    sys.stdout.flush()


def close_bar() -> None:
    sys.stdout.write("\n")
    sys.stdout.flush()


def _shards_bar(server: Server, shards: int, seconds_per_shard: float) -> None:
    """Loading safetensors checkpoint shards, with SGLang's BAR_FORMAT; `seconds_per_shard` unscaled (a
    test's slow disk)."""
    for i in range(shards + 1):
        bar(
            f"Loading safetensors checkpoint shards: {100 * i // shards:3d}% Completed | {i}/{shards} [00:0{min(i, 9)}<00:00,  1.00it/s]"
        )
        if i < shards:
            _sleep(server, 0.3 / shards)
            time.sleep(seconds_per_shard)
    close_bar()


def _capture_bar(server: Server, sizes: list[int], avail_gb: float, hang_at: int | None) -> None:
    """Capturing batches, as tqdm draws it on rank 0: one redraw per batch size, largest first."""
    n = len(sizes)
    for i in range(n + 1):
        bs = sizes[min(i, n - 1)]
        bar(
            f"Capturing batches (bs={bs} avail_mem={avail_gb:.2f} GB): {100 * i // n:3d}%|{'#' * (10 * i // n):<10}| {i}/{n} [00:0{min(i, 9)}<00:00,  5.00it/s]"
        )
        while hang_at is not None and i >= hang_at:  # test hook: a capture that hangs, its bar standing still
            time.sleep(1)
        if i < n:
            _sleep(server, 0.2 / n)
    close_bar()


def uvicorn(msg: str) -> None:
    sys.stdout.write(f"INFO:     {msg}\n")
    sys.stdout.flush()


ANSWERS = [  # what the simulated model says; the smoke prompts of the shipped playbooks are here
    (re.compile(r"capital of france", re.I), " Paris."),
    (re.compile(r"2\s*\+\s*2", re.I), " 4"),
    (re.compile(r"color of the sky|colour of the sky", re.I), " Blue."),
]
GARBAGE = " !!!!!!!!!!!!!!!!"  # engines.md §1.4: flashinfer_cutedsl on SM120 "Produces Invalid Output"


class Server:
    def __init__(self, r: Resolved, scale: float) -> None:
        self.r = r
        self.scale = scale
        self.status = "Starting"
        self.nccl: Any = None  # rank 0's TCPStore socket, a group's meeting, or the SimError it ended in
        self.requests_served = 0
        self.children: list[sim_child.Forked] = []
        self.started = time.time()
        self.lock = threading.Lock()
        self.in_flight: list[str] = []  # rids of the requests being served (tokenizer_manager.rid_to_state)
        self.generates = sim_pooling.is_generation(r.model.arch, bool(r.args.is_embedding))

    def answer(self, prompt: str) -> str:
        if self.r.garbage or gpustate.load_host().get("serve_garbage"):  # test hook: a server gone bad
            return GARBAGE
        for pattern, text in ANSWERS:
            if pattern.search(prompt):
                return text
        return " I am a simulated model."

    def generate(self, prompt: str) -> str:
        rid = uuid.uuid4().hex
        with self.lock:
            self.requests_served += 1
            n = self.requests_served
            self.in_flight.append(rid)
        try:
            time.sleep(float(gpustate.load_host().get("generation_delay_s", 0)))  # test hook: a long request
            return self._generate(prompt, n)
        finally:
            with self.lock:
                self.in_flight.remove(rid)

    def _generate(self, prompt: str, n: int) -> str:
        # engines.md §2.2: extra_buffer + spec v2 runtime TypeError on 0.5.13-0.5.14, after the first requests
        a = self.r.args
        strategy = getattr(a, "mamba_radix_cache_strategy", None) or getattr(a, "mamba_scheduler_strategy", None)
        if (
            (0, 5, 13) <= self.r.version <= (0, 5, 14)
            and self.r.spec_v2
            and strategy == "extra_buffer"
            and self.r.model.hybrid
            and n >= 2
        ):
            threading.Thread(target=self.crash_scheduler, daemon=True).start()
            raise ConnectionAbortedError
        return self.answer(prompt)

    def crash_scheduler(self) -> None:
        err = SimError(
            "TypeError",
            "'NoneType' object cannot be interpreted as an integer",
            [
                (f"{SITE}/srt/managers/scheduler.py", 3935, "run_scheduler_process", "scheduler.event_loop_overlap()"),
                (
                    f"{SITE}/srt/speculative/eagle_info_v2.py",
                    212,
                    "prepare_for_v2_verify",
                    "batch.seq_lens_cpu, self.draft_token_num)",
                ),
                (
                    f"{SITE}/srt/managers/schedule_batch.py",
                    1890,
                    "set_mamba_track_indices_from_reqs",
                    "mamba_track_indices[i] = int(req.mamba_last_track_seqlen)",
                ),
            ],
        )
        self.child_failed(err, tp=0)

    def child_failed(self, err: SimError, tp: int) -> None:
        """engines.md §2.2/§5.16: scheduler traceback, then the parent's sigquit line, then the tree dies."""
        sys.stdout.write(f"{_ts(tp)} Scheduler hit an exception: {err.traceback_text([])}\n\n")
        sys.stdout.flush()
        log("Received sigquit from a child process. It usually means the child failed.")
        self.kill_tree()

    def kill_tree(self) -> None:
        for child in self.children:
            with contextlib.suppress(OSError):
                child.kill()
        os.kill(os.getpid(), signal.SIGKILL)  # kill_process_tree(include_parent=True)


def _spawn_child(title: str, gpu: int | None, used_mib: int) -> sim_child.Forked:
    return sim_child.Forked(title, -1 if gpu is None else gpu, used_mib)


def _sleep(server: Server, seconds: float) -> None:
    time.sleep(seconds * server.scale)


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    sim: Server
    health_only = False  # a non-zero rank of a group: SGLang's dummy health server (log level warning)

    def log_message(self, format: str, *args: Any) -> None:  # uvicorn's access log format
        if self.health_only:
            return
        uvicorn(
            f'{self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {args[1]} '
            f"{'OK' if str(args[1]) == '200' else ''}".rstrip()
        )

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _unauthorized(self) -> bool:
        """SGLang's API key middleware: with --api-key, every path but /health* and /metrics wants
        `Authorization: Bearer KEY`, else 401 {"error": "Unauthorized"}."""
        key = getattr(self.sim.r.args, "api_key", None)
        path = self.path.split("?")[0]
        if not key or path.startswith("/health") or path.startswith("/metrics"):
            return False
        if self.headers.get("Authorization") == f"Bearer {key}":
            return False
        self._json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        s, a = self.sim, self.sim.r.args
        path = self.path.split("?")[0]
        if self._unauthorized():
            return
        if path in ("/health", "/health_generate"):  # engines.md §3.2: 503 while starting and while draining
            self._json(200 if s.status == "Up" else 503, {})
        elif self.health_only:
            self._json(200 if path == "/ping" else 404, {} if path == "/ping" else {"detail": "Not Found"})
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": a.served_model_name, "object": "model", "owned_by": "sglang", "max_model_len": 262144}
                    ],
                },
            )
        elif path in ("/model_info", "/get_model_info"):
            self._json(
                200,
                {
                    "model_path": a.model_path,
                    "tokenizer_path": a.model_path,
                    "is_generation": s.generates,
                    "architectures": [s.r.model.arch],
                    "weight_version": "default",
                },
            )
        elif path in ("/server_info", "/get_server_info"):
            self._json(
                200,
                {
                    **{k: v for k, v in vars(a).items()},
                    "version": ".".join(map(str, s.r.version)),
                    "internal_states": [{"requests_served": s.requests_served}],
                },
            )
        elif path == "/metrics" and a.enable_metrics:
            body = f"sglang:num_requests_total {s.requests_served}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        s = self.sim
        if self.health_only:
            self._json(404, {"detail": "Not Found"})
            return
        if self._unauthorized():
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": "invalid JSON"})
            return
        path = self.path.split("?")[0]
        if s.status == "Draining":
            self._json(503, {"error": "server is shutting down"})
            return
        if path in ("/v1/embeddings", "/v1/rerank"):
            self._pooling(path, body)
            return
        if path == "/v1/chat/completions":
            prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        elif path in ("/v1/completions", "/generate"):
            prompt = str(body.get("prompt") or body.get("text") or "")
        else:
            self._json(404, {"detail": "Not Found"})
            return
        if gpustate.load_host().get("generation_http_500"):  # test hook: healthy but cannot generate
            self._json(500, {"object": "error", "message": "Internal server error"})
            return
        try:
            text = s.generate(prompt)
        except ConnectionAbortedError:
            self.close_connection = True
            return
        if path == "/v1/chat/completions":
            self._json(
                200,
                {
                    "object": "chat.completion",
                    "model": s.r.args.served_model_name,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                },
            )
        elif path == "/v1/completions":
            self._json(
                200,
                {
                    "object": "text_completion",
                    "model": s.r.args.served_model_name,
                    "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
                },
            )
        else:
            self._json(200, {"text": text, "meta_info": {"finish_reason": {"type": "stop"}}})

    def _pooling(self, path: str, body: dict[str, Any]) -> None:
        s = self.sim
        if s.generates:  # both requests are embedding requests inside SGLang
            self._json(
                400, {"object": "error", "message": sim_pooling.NOT_EMBEDDING, "type": "BadRequestError", "code": 400}
            )
            return
        with s.lock:
            s.requests_served += 1
        if path == "/v1/rerank":
            self._json(200, sim_pooling.rerank_answer(body))
        else:
            hidden = int(s.r.model.text.get("hidden_size") or 1024)
            self._json(200, sim_pooling.embeddings_answer(body, s.r.args.served_model_name, hidden))


def _fail_launcher(err: SimError) -> None:
    sys.stderr.write(err.traceback_text(LAUNCHER_HEAD) + "\n")
    sys.stderr.flush()
    sys.exit(1)


def _free_mib(gpu: dict[str, Any]) -> int:
    return int(gpu["memory_total_mib"] - gpu["memory_used_mib"])


def serve(argv: list[str]) -> None:
    host = gpustate.load_host()
    version = parse_version(gpustate.sglang_version(host))
    gpus = gpustate.visible_gpus()
    try:
        r = resolve(argv, version, gpus, dict(os.environ), host.get("engine_picks"))
    except SimError as err:
        _fail_launcher(err)
        return
    a, m = r.args, r.model
    scale = float(os.environ.get("SIM_SPEED", host.get("startup_scale", 1.0)))
    server = Server(r, scale)
    Handler.sim = server
    sigterm = threading.Event()

    def on_sigterm(signum: int, frame: Any) -> None:  # engines.md §3.3
        log(f"SIGTERM received. signum={signum} Draining requests and shutting down...")
        server.status = "Draining"
        sigterm.set()

    # Until its tokenizer manager handles a first request (the warmup's), SGLang's main process has no
    # SIGTERM handler: Python's default ends it at once and its schedulers die with it (PR_SET_PDEATHSIG).
    # The draining handler comes with that first request (tokenizer_manager.py auto_create_handle_loop:
    # 0.5.11 L1602-1617, 0.5.23 L2440-2455); a start that hangs is not drained for a grace period.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    shown = ", ".join(f"{k}={v!r}" for k, v in vars(a).items())
    log(f"server_args=ServerArgs({shown})")
    for w in r.warnings:
        log(w)
    tp, dp = a.tp_size, max(1, a.dp_size)
    # the ranks on this node (the others are on the group's other nodes); each DP rank is a TP group of its
    # own on the next tp_size GPUs (managers/data_parallel_controller.py: base_gpu_id += tp_size)
    local = tp * dp // max(1, a.nnodes)
    first = local * a.node_rank  # this node's first global rank
    if local > len(gpus):
        err = SimError(
            "RuntimeError",
            f"CUDA error: invalid device ordinal (tp_size={tp}, "
            + (f"dp_size={dp}, " if dp > 1 else "")
            + (f"ranks on this node={local}, " if a.nnodes > 1 else "")
            + f"visible GPUs={len(gpus)})",
            [(f"{SITE}/srt/managers/scheduler.py", 3938, "run_scheduler_process", "")],
        )
        server.children = []
        sys.stdout.write(f"{_ts(len(gpus))} Scheduler hit an exception: {err.traceback_text([])}\n")
        log("Received sigquit from a child process. It usually means the child failed.")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    weights_mib = m.weights_bytes // tp // (1 << 20)
    total_mib = gpus[0]["memory_total_mib"]
    free_mib = min(_free_mib(g) for g in gpus[:local])
    # children: one scheduler per TP rank holding its GPU (engines.md §3.4 titles), plus the detokenizer
    if dp > 1:
        server.children.append(_spawn_child("sglang::data_parallel_controller", None, 0))
    for rank in range(local):  # engines.md §3.4: _DP<i> and _TP<i>, each only when > 1
        parts = (f"_DP{(first + rank) // tp}" if dp > 1 else "") + (f"_TP{(first + rank) % tp}" if tp > 1 else "")
        title = f"sglang::scheduler{parts}"
        server.children.append(_spawn_child(title, gpus[rank]["index"], 600))
    server.children.append(_spawn_child("sglang::detokenizer", None, 0))
    for child in server.children:  # each child reports once titled and holding its GPU
        assert child.stdout is not None
        child.stdout.readline()
        child.stdout.close()
    _sleep(server, 0.2)
    new_lines = version >= NEW_STARTUP_LINES
    for rank in range(local):
        log("Init parallel begin." if new_lines else "Init torch distributed begin.", first + rank)
    while host.get("hang_rendezvous"):  # test hook: ranks that never meet (a peer gone, a port firewalled)
        time.sleep(1)
    if a.nnodes > 1:
        _meet_the_group(server, first)
    else:
        server.nccl = _bind_nccl(a.host, a.nccl_port) if tp > 1 else None  # rank 0's TCPStore, held while serving
    if isinstance(server.nccl, SimError):
        server.child_failed(server.nccl, tp=first)
    _sleep(server, 0.2)
    if tp > 2 and host.get("interconnect", "pcie") == "pcie" and not a.disable_custom_all_reduce:
        log(
            "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. To silence "
            "this warning, specify disable_custom_all_reduce=True explicitly.",
            0,
        )
    if new_lines:
        log(f"Init parallel ends. elapsed={0.2 * scale:.2f} s", first)
    log(f"Load weight begin. avail mem={free_mib / 1024:.2f} GB", first)

    def scheduler_error(err: SimError) -> None:
        server.child_failed(err, tp=first)

    preloaded = 0  # the weights a weight cache daemon holds (model_runner.py adds them back to the budget)
    if getattr(a, "weight_cache_mode", "off") == "client":
        try:
            if sim_weight_cache.weights_over_ipc(server, [(first + n, g) for n, g in enumerate(gpus[:local])]):
                preloaded = weights_mib
        except SimError as refused:
            scheduler_error(refused)
    free_mib += preloaded
    if not preloaded:
        # test hook: a slow disk, each shard read for this many seconds, the bar moving all the while
        _shards_bar(server, max(1, min(8, weights_mib // 4096)), float(host.get("slow_weights_s") or 0))
        time.sleep(sim_weight_cache.load_seconds(weights_mib))  # host.json load_s_per_gib: a modelled disk

    if m.arch not in registered_architectures():  # no transformers here to fall back on
        scheduler_error(
            SimError(
                "ValueError",
                f"Cannot find model module. '{m.arch}' is not a registered model in the Transformers library (only "
                "relevant if the model is meant to be in Transformers) and 'AutoModel' is not present in the model "
                "config's 'auto_map' (relevant if the model is custom).",
                [
                    (f"{SITE}/srt/model_loader/utils.py", 155, "resolve_transformers_arch", "raise ValueError("),
                    (f"{SITE}/srt/model_loader/utils.py", 231, "get_model_architecture", ""),
                ],
            )
        )
    flood = host.get("flood_log")  # test hook: an engine that hangs while flooding its log (bytes a second)
    if flood:
        line = "W flood " + "x" * 4000 + "\n"
        every = len(line) / float(flood)
        while True:  # never ready: only a bound fleet keeps ends this
            sys.stdout.write(line)
            sys.stdout.flush()
            time.sleep(every)
    # test hook: a start-up that logs this many bytes, then loads for chatty_s more (a big checkpoint)
    chatty = int(host.get("chatty_log") or 0)
    for i in range(chatty // 200 + 1 if chatty else 0):
        sys.stdout.write(f"{_ts(0)} Loading safetensors checkpoint shards: {i} done " + "." * 140 + "\n")
    sys.stdout.flush()
    time.sleep(float(host.get("chatty_s") or 0))
    injected = host.get("inject_scheduler_error")  # test hook: a failure fleet has never seen
    if injected:
        exc_type, _, message = str(injected).partition(": ")
        scheduler_error(SimError(exc_type, message, [(f"{SITE}/srt/layers/moe/fused_moe.py", 1337, "fused_moe", "")]))
    # engines.md §1.7 / §5.13: NVFP4 minimum capability (100 up to 0.5.22, 80 from 0.5.23), checked at load
    if m.nvfp4:
        min_cap = 80 if version >= (0, 5, 23) else 100
        if r.sm < min_cap:
            scheduler_error(
                SimError(
                    "ValueError",
                    (
                        f"The quantization method modelopt_fp4 is not supported for the current GPU. Minimum capability: "
                        f"{min_cap}. Current capability: {r.sm}."
                    ),
                    [
                        (f"{SITE}/srt/managers/scheduler.py", 3938, "run_scheduler_process", ""),
                        (f"{SITE}/srt/model_loader/loader.py", 244, "_get_quantization_config", "raise ValueError("),
                    ],
                )
            )
    # engines.md §5.7: weights that do not fit are a CUDA OOM while loading
    if weights_mib > free_mib:
        scheduler_error(
            SimError(
                "torch.OutOfMemoryError",
                (
                    f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of {total_mib / 1024:.2f} "
                    f"GiB of which {max(free_mib - weights_mib, 0) / 1024:.2f} GiB is free."
                ),
                [(f"{SITE}/srt/model_loader/loader.py", 610, "load_weights_and_postprocess", "")],
            )
        )
    # engines.md §1.4 / §5.10: SM120 NVFP4 MoE with auto/flashinfer_trtllm has no trtllm-gen cubins
    if m.nvfp4 and m.moe and 120 <= r.sm < 130 and a.moe_runner_backend in ("auto", "flashinfer_trtllm"):
        scheduler_error(
            SimError(
                "NotImplementedError",
                (
                    "FlashInfer TRTLLM-gen FP4 MoE: no cubin for sm_120 (Unsupported architecture); none of the configured "
                    "backends are usable on sm120"
                ),
                [
                    (
                        f"{SITE}/srt/layers/quantization/modelopt_quant.py",
                        1988,
                        "create_moe_runner",
                        "self.runner = MoeRunner(MoeRunnerBackend.FLASHINFER_TRTLLM, moe_runner_config)",
                    ),
                ],
            )
        )
    if m.nvfp4 and m.moe and 120 <= r.sm < 130 and a.moe_runner_backend == "flashinfer_cutedsl":
        r.garbage = True  # engines.md §1.4: flashinfer issue #2723, invalid output rather than a crash
    left_gb, used_gb = (free_mib - weights_mib) / 1024, weights_mib / 1024
    if new_lines:
        log(
            f"Load weight end. elapsed={0.3 * scale:.2f} s, type={m.arch}, avail mem={left_gb:.2f} GB, mem usage={used_gb:.2f} GB.",
            first,
        )
    else:
        log(
            f"Load weight end. type={m.arch}, dtype=torch.bfloat16, avail mem={left_gb:.2f} GB, mem usage={used_gb:.2f} GB.",
            first,
        )
    want_mib = int(total_mib * a.mem_fraction_static)
    # engines.md §5.5 / §5.7: too high a fraction is a CUDA OOM, too low leaves no KV pool
    if want_mib > free_mib:
        scheduler_error(
            SimError(
                "torch.OutOfMemoryError",
                (
                    f"CUDA out of memory. Tried to allocate {(want_mib - weights_mib) / 1024:.2f} GiB. GPU 0 has a total "
                    f"capacity of {total_mib / 1024:.2f} GiB of which {(free_mib - weights_mib) / 1024:.2f} GiB is free."
                ),
                [(f"{SITE}/srt/mem_cache/memory_pool.py", 721, "_create_buffers", "")],
            )
        )
    kv_mib = want_mib - weights_mib
    if kv_mib < 1024:
        scheduler_error(
            SimError(
                "RuntimeError",
                (
                    "Not enough memory. Please try to increase --mem-fraction-static. Current value: "
                    f"mem_fraction_static={a.mem_fraction_static}"
                ),
                [(f"{SITE}/srt/model_executor/pool_configurator.py", 41, "configure", "raise RuntimeError(")],
            )
        )
    _register_pool(server, [g["index"] for g in gpus[:local]], want_mib - preloaded)  # the KV pool, on every rank's GPU
    tokens = kv_mib * 1024 // 64
    avail_gb = (free_mib - want_mib) / 1024
    if not new_lines:
        log(
            f"KV Cache is allocated. #tokens: {tokens}, K size: {kv_mib / 2048:.2f} GB, V size: {kv_mib / 2048:.2f} GB",
            first,
        )
    log(f"Memory pool end. avail mem={avail_gb:.2f} GB", first)
    if not a.disable_cuda_graph:
        bs = (a.cuda_graph_max_bs if version < RENAMED else a.cuda_graph_max_bs_decode) or 512
        sizes = sorted({1, 2, 4, 8, *range(16, bs + 1, 16)} & set(range(1, bs + 1)), reverse=True)[:8]
        kind = "verify" if a.speculative_algorithm else "decode"
        if new_lines:
            log(
                f"Capture target {kind} CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem={avail_gb:.2f} GB",
                first,
            )
        else:
            log(f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail_gb:.2f} GB", first)
        # test hook: a capture that hangs part way, its bar standing still
        _capture_bar(server, sizes, avail_gb, len(sizes) // 2 if host.get("hang_graph_capture") else None)
        # host.json graph_mib_per_bs: what capturing takes per request of the largest batch, out of what the
        # pool left; more is the capture's OOM (engines.md §5.6; 0.5.23 decode_cuda_graph_runner.py L603)
        graph_mib = bs * int(host.get("graph_mib_per_bs") or 0)
        if graph_mib > free_mib - want_mib:
            hint = "--cuda-graph-max-bs-decode" if version >= (0, 5, 20) else "--cuda-graph-max-bs"
            scheduler_error(
                SimError(
                    "Exception",
                    (
                        f"Capture cuda graph failed: CUDA out of memory. Tried to allocate {graph_mib / 1024:.2f} "
                        f"GiB. GPU 0 has a total capacity of {total_mib / 1024:.2f} GiB of which "
                        f"{(free_mib - want_mib) / 1024:.2f} GiB is free.\nPossible solutions:\n1. set "
                        f"--mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n2. set {hint} to a smaller "
                        "value (e.g., 16)"
                    ),
                    [(f"{SITE}/srt/model_executor/runner/decode_cuda_graph_runner.py", 603, "__init__", "")],
                )
            )
        if new_lines:
            log(
                f"Capture target {kind} CUDA graph end. bs={sorted(sizes)}, elapsed={0.2 * scale:.2f} s, mem usage=0.50 GB, avail mem={avail_gb:.2f} GB.",
                first,
            )
        else:
            log(
                f"Capture cuda graph end. Time elapsed: {0.2 * scale:.2f} s. mem usage=0.50 GB. avail mem={avail_gb:.2f} GB. max_bs={bs}",
                first,
            )
    log(
        f"max_total_num_tokens={tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests="
        f"{a.max_running_requests or 2048}, context_len=262144, available_gpu_mem={(free_mib - want_mib) / 1024:.2f} GB",
        first,
    )
    if a.node_rank > 0:  # SGLang's other ranks serve only /health (launch_dummy_health_check_server), quietly
        signal.signal(signal.SIGTERM, on_sigterm)  # 0.5.23 engine.py L1264-1273: waits for rank 0's shutdown
        _serve_follower(server, sigterm)
        return
    # uvicorn binds last: a held port is only discovered after the model loaded (engines.md §5.8)
    try:
        httpd = http_server(a.host, a.port)
    except OSError as exc:
        uvicorn(f"Started server process [{os.getpid()}]")
        sys.stdout.write(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
            f"('{a.host}', {a.port}): address already in use\n"
        )
        sys.stdout.flush()
        server.kill_tree()
        return
    uvicorn(f"Started server process [{os.getpid()}]")
    uvicorn("Waiting for application startup.")
    uvicorn("Application startup complete.")
    uvicorn(f"Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)")
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    threading.Thread(target=_watch_children, args=(server,), daemon=True).start()
    if not a.skip_server_warmup:  # engines.md §3.1: the ready line comes after a warmup generate
        signal.signal(signal.SIGTERM, on_sigterm)  # with the first request: the warmup's
        _sleep(server, 0.1)
        server.answer("warmup")
        uvicorn(f'127.0.0.1:{40000 + os.getpid() % 20000} - "POST /generate HTTP/1.1" 200 OK')
    server.status = "Up"
    log(READY_LINE)
    if a.skip_server_warmup:  # with a client's first request
        while server.requests_served == 0:
            time.sleep(0.05)
        signal.signal(signal.SIGTERM, on_sigterm)
    while not sigterm.wait(0.5):
        pass
    _sigterm_watchdog(server)
    for child in server.children:
        child.kill()
        child.wait()
    httpd.shutdown()
    sys.exit(0)


def _meet_the_group(server: Server, first: int) -> None:
    """torch.distributed's rendezvous at rank 0's --dist-init-addr, then Gloo's interface lookup; sets
    server.nccl to the meeting (or the SimError it ended in), and arms the NCCL watchdog."""
    from fleet_testbed import sim_rendezvous

    a = server.r.args
    shown = int(a.dist_timeout or 600)
    meeting = sim_rendezvous.meet(a.dist_init_addr, a.nnodes, a.node_rank, shown * server.scale, shown)
    if isinstance(meeting, sim_rendezvous.Meeting):
        ifname = server.r.env.get("GLOO_SOCKET_IFNAME")
        wrong = sim_rendezvous.gloo_interface_error(ifname) if ifname else None
        if wrong is not None:
            server.nccl = wrong
            return

        def on_lost() -> None:
            time.sleep(shown * server.scale)  # the collective waits its whole timeout first
            for line in sim_rendezvous.watchdog_lines(first, shown):
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
            for child in server.children:
                with contextlib.suppress(OSError):
                    child.kill()
            os.abort()  # std::terminate: SIGABRT

        meeting.watch(on_lost)
        once = gpustate.load_host().get("rank_dies_once")  # test hook: this rank is lost once, after meeting
        if once and os.path.exists(once):
            os.remove(once)
            for child in server.children:
                child.kill()
            os.kill(os.getpid(), signal.SIGKILL)
    server.nccl = meeting


def http_server(host: str, port: int) -> ThreadingHTTPServer:
    """The engine's HTTP server on `host`, an IPv6 address as well (uvicorn binds either)."""

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server((host, port), Handler)


def _serve_follower(server: Server, sigterm: threading.Event) -> None:
    a = server.r.args
    Handler.health_only = True
    try:
        httpd = http_server(a.host, a.port)
    except OSError as exc:
        log(f"Dummy health check server failed to start: [Errno {exc.errno}] address already in use")
        server.kill_tree()
        return
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    threading.Thread(target=_watch_children, args=(server,), daemon=True).start()
    server.status = "Up"
    while not sigterm.wait(0.5):
        pass
    for child in server.children:
        child.kill()
        child.wait()
    httpd.shutdown()
    sys.exit(0)


def _sigterm_watchdog(server: Server) -> None:
    """engines.md §3.3 (tokenizer_manager.sigterm_watchdog): a loop started with the server wakes every
    5 s; once SIGTERM has set gracefully_exit it logs the requests left and exits when there are none,
    so even an idle server takes up to 5 s to go (/health answers 503 meanwhile)."""
    period = 5.0 * server.scale
    if period > 0:
        time.sleep(period - (time.time() - server.started) % period)
    while True:
        with server.lock:
            rids = list(server.in_flight)
        log(
            f"Gracefully exiting... Remaining number of requests {len(rids)}. Remaining requests remaining_rids={rids}."
        )
        if not rids:
            return
        time.sleep(max(period, 0.05))


def _bind_nccl(address: str, port: int | None) -> socket.socket | SimError:
    """torch.distributed's TCPStore on the NCCL port (a free one when not given). The real one listens on
    every address; here on the server's own, since simulated hosts share one network namespace (and
    test runs beside each other on one machine must not meet on 0.0.0.0:40000)."""
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((address, port or 0))
        sock.listen(16)
    except OSError:
        sock.close()
        return SimError(
            "torch.distributed.DistNetworkError",
            f"The server socket has failed to listen on any local network address. port: {port}, useIpv6: false, "
            "code: -98, name: EADDRINUSE, message: address already in use",
            [
                (f"{SITE}/srt/model_executor/model_runner.py", 812, "init_torch_distributed", ""),
                ("/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", 189, "_create_c10d_store", ""),
            ],
        )
    return sock


def _register_pool(server: Server, gpus: list[int], mib: int) -> None:
    for gpu, child in zip(gpus, server.children, strict=False):
        gpustate.register(gpu, mib, pid=child.pid)


def _watch_children(server: Server) -> None:
    """A child that dies makes the main process die too (SIGQUIT to the parent in the real engine)."""
    while True:
        for child in server.children:
            if child.poll() is not None and server.status != "Draining":
                log("Received sigquit from a child process. It usually means the child failed.")
                server.kill_tree()
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    serve(sys.argv[1:] if argv is None else argv)
