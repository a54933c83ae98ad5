"""Which quantised checkpoints an engine runs on which GPUs, as data: checkpoint format x dense/MoE x
compute capability x engine version -> supported, through a slower fallback (Marlin), or refused, each
row with the engine code path it comes from. Pure; pre-flight (fleet.plan.build) reads it.

Formats are named by the checkpoint, as SGLang's quantization methods name them: `fp8` (a plain FP8
checkpoint, quant_method fp8), `modelopt_fp8` and `modelopt_fp4` (NVIDIA ModelOpt FP8 and NVFP4), and
`compressed-tensors-fp8` (llm-compressor's FP8 schemes inside a compressed-tensors checkpoint;
`compressed-tensors-fp8-block` with block-wise scales, which has rows of its own first and then the plain
format's).
Compute capability is written as SM: 86 for 8.6. No row: nothing to say (the GPU runs it natively).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.plan.types import Version

ANY: tuple[Version, Version] = ((0, 0, 0), (999, 0, 0))


@dataclass(frozen=True)
class Capability:
    engine: str
    format: str
    moe: bool | None  # None: dense and MoE alike
    sm: tuple[int, int]  # inclusive
    versions: tuple[Version, Version]  # inclusive
    verdict: str  # "marlin" (runs, slower) or "refused"
    why: str
    source: str
    unless: tuple[str, str] | None = None  # a flag and value on the command line that makes it run via Marlin


TABLE: tuple[Capability, ...] = (
    # --- SGLang -------------------------------------------------------------------------------------------
    Capability(
        "sglang", "modelopt_fp4", None, (0, 99), ((0, 0, 0), (0, 5, 22)), "refused",
        "NVFP4 needs compute capability >= 10.0 before SGLang 0.5.23 (ModelOptFp4Config's minimum is 100); "
        "pick a Blackwell host, or SGLang >= 0.5.23 (Marlin, slow)",
        "0.5.11 srt/layers/quantization/modelopt_quant.py L1141; engines.md §1.7",
    ),
    Capability(
        "sglang", "modelopt_fp4", None, (0, 79), ((0, 5, 23), (999, 0, 0)), "refused",
        "NVFP4 needs compute capability >= 8.0 (ModelOptFp4Config's minimum is 80)",
        "0.5.23 modelopt_quant.py L1549; engines.md §1.7",
    ),
    Capability(
        "sglang", "modelopt_fp4", None, (80, 99), ((0, 5, 23), (999, 0, 0)), "marlin",
        "NVFP4 below Blackwell runs through the Marlin W4A16 fallback: it works but is slow",
        "0.5.23 modelopt_quant.py L1549; engines.md §1.7",
    ),
    Capability(
        "sglang", "modelopt_fp8", None, (0, 88), ANY, "refused",
        "ModelOpt FP8 needs compute capability >= 8.9 (ModelOptFp8Config's minimum is 89; no Marlin path)",
        "0.5.11 modelopt_quant.py L427",
    ),
    Capability(
        "sglang", "fp8", None, (0, 79), ANY, "refused",
        "FP8 checkpoints need compute capability >= 8.0 (Fp8Config's minimum is 80)",
        "0.5.11 srt/layers/quantization/fp8.py L188-192",
    ),
    Capability(
        "sglang", "fp8", False, (80, 88), ANY, "marlin",
        "dense FP8 on compute capability 8.0-8.8 runs through the Marlin weight-only FP8 kernel "
        "(can_auto_enable_marlin_fp8): it works, slower than native FP8",
        "0.5.11 fp8.py L294-298, fp8_utils.py L1640; 0.5.23 fp8.py L514-518",
    ),
    Capability(
        "sglang", "fp8", True, (80, 88), ((0, 0, 0), (0, 5, 22)), "refused",
        "FP8 MoE on compute capability 8.0-8.8 fails at load (fp8e4nv unsupported): SGLang's FP8 MoE method has "
        "no Marlin path before 0.5.23",
        "0.5.11 fp8.py Fp8MoEMethod (no use_marlin); sglang #12887, #38291; engines.md §1.7",
    ),
    Capability(
        "sglang", "fp8", True, (80, 88), ((0, 5, 23), (999, 0, 0)), "refused",
        "FP8 MoE on compute capability 8.0-8.8 fails at load (fp8e4nv unsupported) unless the MoE runner is "
        "Marlin: add --moe-runner-backend marlin to extra_args",
        "0.5.23 fp8.py Fp8MoEMethod (get_moe_runner_backend().is_marlin()); sglang #12887",
        unless=("--moe-runner-backend", "marlin"),
    ),
    Capability(
        "sglang", "compressed-tensors-fp8", None, (0, 79), ANY, "refused",
        "compressed-tensors FP8 needs compute capability >= 8.0 (its W8A16 FP8 fallback's minimum is 80)",
        "0.5.11 compressed_tensors.py L574-598, L798, schemes/compressed_tensors_w8a16_fp8.py L34; 0.5.23 L804-831",
    ),
    Capability(
        "sglang", "compressed-tensors-fp8-block", None, (80, 88), ANY, "refused",
        "block-wise compressed-tensors FP8 below compute capability 8.9 fails at load: SGLang's weight-only "
        "fallback (W8A16 FP8) has no block strategy (ValueError: Unsupported weight strategy=block)",
        "0.5.11/0.5.23 schemes/compressed_tensors_w8a16_fp8.py create_weights",
    ),
    Capability(
        "sglang", "compressed-tensors-fp8", False, (80, 88), ANY, "marlin",
        "compressed-tensors FP8 below compute capability 8.9 runs weight-only (W8A16 FP8 through Marlin): it "
        "works, slower than native FP8",
        "0.5.11 compressed_tensors.py L574-591 (W8A8 minimum 89, else CompressedTensorsW8A16Fp8); 0.5.23 L804-824",
    ),
    Capability(
        "sglang", "compressed-tensors-fp8", True, (80, 88), ANY, "refused",
        "compressed-tensors FP8 MoE on compute capability 8.0-8.8 fails at load: its MoE method has no Marlin "
        "path, and the Triton FP8 MoE kernel needs FP8 hardware (8.9+)",
        "0.5.11/0.5.23 schemes/compressed_tensors_w8a8_fp8_moe.py (minimum 80, Triton runner, no Marlin); "
        "sglang #12887",
    ),
    # --- vLLM (read from vLLM 0.32's quantization configs; older versions keep fleet's earlier bounds) ------
    Capability(
        "vllm", "modelopt_fp4", None, (0, 74), ((0, 32, 0), (999, 0, 0)), "refused",
        "NVFP4 needs compute capability >= 7.5 in vLLM (ModelOptNvFp4Config's minimum is 75)",
        "vllm 0.32 model_executor/layers/quantization/modelopt.py L768",
    ),
    Capability(
        "vllm", "modelopt_fp4", None, (75, 99), ((0, 32, 0), (999, 0, 0)), "marlin",
        "NVFP4 below Blackwell runs through vLLM's Marlin W4A16 kernels: it works but is slow",
        "vllm 0.32 modelopt.py L768, L1616",
    ),
    Capability(
        "vllm", "modelopt_fp4", None, (0, 79), ((0, 0, 0), (0, 31, 99)), "refused",
        "NVFP4 needs compute capability >= 8.0 in this vLLM (Marlin from 8.0; not checked before 0.32)",
        "engines.md §6",
    ),
    Capability(
        "vllm", "modelopt_fp4", None, (80, 99), ((0, 0, 0), (0, 31, 99)), "marlin",
        "NVFP4 below Blackwell runs through vLLM's Marlin W4A16 kernels: it works but is slow",
        "engines.md §6",
    ),
    Capability(
        "vllm", "modelopt_fp8", None, (0, 79), ANY, "refused",
        "ModelOpt FP8 needs compute capability >= 8.0 in vLLM (ModelOptFp8Config's minimum is 80)",
        "vllm 0.32 modelopt.py L445",
    ),
    Capability(
        "vllm", "modelopt_fp8", None, (80, 88), ANY, "marlin",
        "ModelOpt FP8 on compute capability 8.0-8.8 runs weight-only through Marlin: it works, slower",
        "vllm 0.32 modelopt.py L445 (minimum 80, below FP8 hardware)",
    ),
    Capability(
        "vllm", "fp8", None, (0, 74), ANY, "refused",
        "FP8 checkpoints need compute capability >= 7.5 in vLLM (Fp8Config's minimum is 75)",
        "vllm 0.32 fp8.py L146",
    ),
    Capability(
        "vllm", "fp8", None, (75, 88), ANY, "marlin",
        "FP8 on compute capability 7.5-8.8 runs weight-only through vLLM's MarlinFP8 kernel: it works, slower",
        "vllm 0.32 fp8.py L356 (MarlinFP8ScaledMMLinearKernel)",
    ),
    Capability(
        "vllm", "compressed-tensors-fp8", None, (0, 74), ANY, "refused",
        "compressed-tensors FP8 needs compute capability >= 7.5 in vLLM (its W8A16 FP8 fallback's minimum is 75)",
        "vllm 0.32 compressed_tensors.py L878-905, schemes/compressed_tensors_w8a16_fp8.py L53",
    ),
    Capability(
        "vllm", "compressed-tensors-fp8", None, (75, 88), ANY, "marlin",
        "compressed-tensors FP8 below compute capability 8.9 runs weight-only through vLLM's Marlin FP8 kernels "
        "(MoE too: select_fp8_moe_backend): it works, slower",
        "vllm 0.32 compressed_tensors.py L878-905; compressed_tensors_moe_w8a8_fp8.py L107",
    ),
)  # fmt: skip


def capability(
    engine: str, fmt: str | None, moe: bool, sm: int, version: Version | None, argv: tuple[str, ...] = ()
) -> Capability | None:
    """The row that applies, if any. An unknown engine version matches only rows that hold for every
    version. A row's `unless` flag on the command line turns its refusal into the Marlin fallback. A
    `-block` format's own rows come first, then the plain format's."""
    formats = [fmt, fmt.removesuffix("-block")] if fmt and fmt.endswith("-block") else [fmt]
    rows = [row for f in formats for row in TABLE if row.format == f]
    for row in rows:
        if row.engine != engine or (row.moe is not None and row.moe != moe):
            continue
        if not row.sm[0] <= sm <= row.sm[1]:
            continue
        lo, hi = row.versions
        if (version is None and (lo, hi) != ANY) or (version is not None and not lo <= version <= hi):
            continue
        if row.unless and _has(argv, *row.unless):
            return Capability(**{**row.__dict__, "verdict": "marlin"})
        return row
    return None


def _has(argv: tuple[str, ...], flag: str, value: str) -> bool:
    return any(a == flag and i + 1 < len(argv) and argv[i + 1] == value for i, a in enumerate(argv)) or (
        f"{flag}={value}" in argv
    )
