"""SGLang's command-line surface, per version, as the simulator's argparse builds it.

Each row cites the fact in ../shared/reference/engines.md it reproduces. The parser is a real
`argparse.ArgumentParser(prog="sglang serve")` with argparse's default `allow_abbrev=True`, exactly as
SGLang's `prepare_server_args` builds it (engines.md §1.1, §7.1): that is what makes
`--cuda-graph-max-bs` *ambiguous* (not unknown) once only `-decode`/`-prefill` exist (>= 0.5.20).
Only the flags fleet and its users touch are modelled; an unmodelled real flag is rejected here, which
the simulator-vs-real-parser test (tests/test_real_parser.py) would expose.
"""

from __future__ import annotations

import argparse

Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    parts = [int(p) for p in text.split(".")[:3]]
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


# engines.md §1.4 (0.5.11 L179; 0.5.23 choices.py)
MOE_RUNNER_0511 = [
    "auto",
    "deep_gemm",
    "triton",
    "triton_kernel",
    "flashinfer_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutlass",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "cutlass",
    "aiter",
]
MOE_RUNNER_0523 = [
    "auto",
    "deep_gemm",
    "triton",
    "triton_kernel",
    "flashinfer_trtllm",
    "experimental_sgl_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutlass",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "flashinfer_megamoe",
    "cutlass",
    "aiter",
    "marlin",
    "humming",
    "experimental_sgl_marlin",
    "lora_cutedsl",
    "lora_triton",
    "lora_marlin",
    "hpc_ops",
    "megamoe",
    "intel_xpu",
]
# engines.md §1.5
FP4_GEMM_0511 = ["auto", "cutlass", "flashinfer_cudnn", "flashinfer_cutlass", "flashinfer_trtllm"]
FP4_GEMM_0523 = ["auto", "flashinfer_cudnn", "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_trtllm", "marlin"]
# engines.md §1.6
ATTENTION_0511 = [
    "triton",
    "torch_native",
    "flex_attention",
    "nsa",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
]
ATTENTION_0523 = [
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "qsa",
    "dsv4",
    "compressed",
    "fa3",
    "fa4",
    "flashinfer",
    "llada2_cfg_flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "hpc_ops",
    "minicpm_flashattn",
    "minicpm_flashinfer",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
]
# engines.md §1.7
QUANT_0511 = [
    "awq",
    "fp8",
    "mxfp8",
    "gptq",
    "marlin",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "modelopt_mixed",
    "petit_nvfp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "qoq",
    "w4afp8",
    "mxfp4",
    "auto-round",
    "compressed-tensors",
    "modelslim",
    "quark_int4fp8_moe",
    "unquant",
]
QUANT_0523 = [q for q in QUANT_0511 if q not in ("marlin", "qoq")] + [
    "nvfp4_online",
    "auto-round-int8",
    "mxfp_w4a8",
    "quark",
    "quark_mxfp4",
    "mlx_q4",
    "mlx_q8",
    "humming",
]
# engines.md §1.3: 0.5.11 has argparse choices; 0.5.23 has none (registered algorithms)
SPEC_ALGORITHMS_0511 = ["DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
MAMBA_STRATEGY = ["auto", "no_buffer", "extra_buffer"]
MAMBA_STRATEGY_0520 = [*MAMBA_STRATEGY, "extra_buffer_lazy"]

# Boundaries the wheels show: 0.5.14 renamed, 0.5.20 removed the old names (engines.md §1.1).
RENAMED = (0, 5, 14)
OLD_NAMES_REMOVED = (0, 5, 20)
NEW_CHOICE_LISTS = (0, 5, 20)  # choice lists between 0.5.12 and 0.5.19 were not read; 0.5.11's are used


class _DeprecatedAlias(argparse.Action):
    """0.5.14-0.5.19 `DeprecatedAliasStoreAction`: the old name stores into the new dest, with a warning."""

    def __init__(self, option_strings: list[str], dest: str, new_name: str = "", **kw: object) -> None:
        self.new_name = new_name
        super().__init__(option_strings, dest, **kw)  # type: ignore[arg-type]

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        import sys

        print(f"WARNING: {option_string} is deprecated, use {self.new_name} instead.", file=sys.stderr)
        setattr(namespace, self.dest, values)


def build_parser(version: Version) -> argparse.ArgumentParser:
    new_lists = version >= NEW_CHOICE_LISTS
    p = argparse.ArgumentParser(prog="sglang serve")
    a = p.add_argument
    a("--model-path", "--model", dest="model_path", required=True)
    a("--tokenizer-path")
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--nccl-port", type=int)  # 0.5.11 server_args L4343; 0.5.23 fields/parallel.py (default: a random free port)
    a("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    a("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    a("--ep-size", "--ep", dest="ep_size", type=int, default=1)
    a("--mem-fraction-static", type=float)
    a("--max-running-requests", type=int)
    a("--max-total-tokens", type=int)
    a("--context-length", type=int)
    a("--chunked-prefill-size", type=int)
    a("--page-size", type=int)
    a("--served-model-name")
    a("--trust-remote-code", action="store_true")
    a("--is-embedding", action="store_true")
    a("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    a("--kv-cache-dtype", default="auto")
    a("--quantization", choices=QUANT_0523 if new_lists else QUANT_0511)
    attention = ATTENTION_0523 if new_lists else ATTENTION_0511
    a("--attention-backend", choices=attention)
    a("--prefill-attention-backend", choices=attention)
    a("--decode-attention-backend", choices=attention)
    a("--moe-runner-backend", default="auto", choices=MOE_RUNNER_0523 if new_lists else MOE_RUNNER_0511)
    a(
        "--fp4-gemm-backend",
        dest="fp4_gemm_runner_backend",
        default="auto",
        choices=FP4_GEMM_0523 if new_lists else FP4_GEMM_0511,
    )
    a("--fp8-gemm-backend", dest="fp8_gemm_runner_backend", default="auto")
    if new_lists:
        a("--speculative-algorithm")
    else:
        a("--speculative-algorithm", choices=SPEC_ALGORITHMS_0511)
    a("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path")
    a("--speculative-num-steps", type=int)
    a("--speculative-eagle-topk", type=int)
    a("--speculative-num-draft-tokens", type=int)
    a("--speculative-moe-runner-backend")
    # engines.md §1.1: the mamba strategy flag's life
    if (0, 5, 9) <= version < RENAMED:
        a("--mamba-scheduler-strategy", default="auto", choices=MAMBA_STRATEGY)
    if version >= RENAMED:
        a(
            "--mamba-radix-cache-strategy",
            default="auto",
            choices=MAMBA_STRATEGY_0520 if version >= OLD_NAMES_REMOVED else MAMBA_STRATEGY,
        )
    if RENAMED <= version < OLD_NAMES_REMOVED:
        a(
            "--mamba-scheduler-strategy",
            dest="mamba_radix_cache_strategy",
            action=_DeprecatedAlias,
            new_name="--mamba-radix-cache-strategy",
            choices=MAMBA_STRATEGY,
        )
    a("--mamba-ssm-dtype", choices=["float32", "bfloat16", "float16"])
    a("--mamba-track-interval", type=int, default=256)
    if version >= NEW_CHOICE_LISTS:
        for flag in ("--linear-attn-backend", "--linear-attn-decode-backend", "--linear-attn-prefill-backend"):
            a(
                flag,
                choices=["triton", "cutedsl", "flashinfer", "flashkda", "nvidia_kda", "ptx_kda", "helion", "intel_xpu"],
            )
    elif version >= (0, 5, 11):
        a("--linear-attn-decode-backend", choices=["triton", "cutedsl", "flashinfer"])
    a("--disable-radix-cache", action="store_true")
    # engines.md §1.1: --cuda-graph-max-bs real until 0.5.13, alias 0.5.14-0.5.19, gone from 0.5.20
    if version < RENAMED:
        a("--cuda-graph-max-bs", type=int)
    else:
        a("--cuda-graph-max-bs-decode", type=int)
        a("--cuda-graph-max-bs-prefill", type=int)
    if RENAMED <= version < OLD_NAMES_REMOVED:
        a(
            "--cuda-graph-max-bs",
            dest="cuda_graph_max_bs_decode",
            type=int,
            action=_DeprecatedAlias,
            new_name="--cuda-graph-max-bs-decode",
        )
    a("--disable-cuda-graph", action="store_true")
    a("--disable-piecewise-cuda-graph", action="store_true")
    a("--disable-custom-all-reduce", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--skip-server-warmup", action="store_true")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr")
    a("--dist-timeout", type=int)
    a("--log-level", default="info")
    a("--device")
    a("--random-seed", type=int)
    a("--watchdog-timeout", type=float, default=300)
    a("--reasoning-parser")
    a("--tool-call-parser")
    a("--api-key")
    a("--enable-dp-attention", action="store_true")
    if version >= (0, 5, 23):  # arg_groups/fields/model.py: the weight cache daemon's client side
        a("--weight-cache-mode", default="off", choices=["off", "daemon", "client"])
        a("--weight-cache-socket")
        a("--weight-cache-timeout", type=int, default=1800)
    return p
