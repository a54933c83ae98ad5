"""vLLM's own verdict on a command line, run by fleet's act step in the engine's Python (`python -c`, on
the host or in the server's image) before anything is stopped. Exit 0: accepted; a refusal is printed as
`ValueError: ...` and exits 1 (fleet's check reads it as vLLM's rejection).

1. vLLM's argument parser, as `vllm serve` builds it (`make_arg_parser`).
2. The reasoning and tool-call parser names against vLLM's registries: its parser takes any name and finds
   a wrong one only at start-up, after the old server was stopped.
3. The engine configuration, created as the server creates it before loading weights
   (`AsyncEngineArgs.from_cli_args(...).create_engine_config()`): the model's config and architecture
   (vLLM's model registry), tensor parallelism against the attention heads, quantisation against this
   host's GPU, context length, speculative settings. Only for a model directory on this host: a Hub id
   would be fetched, and a missing directory is fleet's own pre-flight's to refuse. What it resolved
   (context length, dtype, quantisation, batching, CUDA graphs, ...) is printed as one FLEET-RESOLVED
   line, as SGLang's check does.
"""

import importlib
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple


def parse(argv: List[str]) -> Any:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[import-not-found,unused-ignore]
    try:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # vLLM >= 0.3x moved it
        from vllm.entrypoints.launchers.cli_args import make_arg_parser  # type: ignore[import-not-found,unused-ignore]
    return make_arg_parser(FlexibleArgumentParser()).parse_args(argv)


PARSERS = (
    ("tool_call_parser", "vllm.tool_parsers", "ToolParserManager", "tool call parser"),
    ("reasoning_parser", "vllm.reasoning", "ReasoningParserManager", "reasoning parser"),
)


def unknown_parser(args: Any) -> Optional[str]:
    """vLLM's words for a parser name its registries lack (None: known, not asked, or a plugin's)."""
    if getattr(args, "tool_parser_plugin", None) or getattr(args, "reasoning_parser_plugin", None):
        return None
    for attr, module, manager, what in PARSERS:
        name = getattr(args, attr, None)
        if not name:
            continue
        try:
            known = sorted(getattr(importlib.import_module(module), manager).list_registered())
        except Exception:
            continue  # an older vLLM keeps them elsewhere: its own start-up judges the name
        if name not in known:
            return "invalid %s: %s (choose from %s)" % (what, name, ", ".join(known))
    return None


# what fleet shows of the configuration vLLM created: (shown, config section, its field)
RESOLVED = (
    ("architecture", "model_config", "architecture"),
    ("dtype", "model_config", "dtype"),
    ("quantization", "model_config", "quantization"),
    ("context length", "model_config", "max_model_len"),
    ("CUDA graphs", "model_config", "enforce_eager"),
    ("tensor parallel", "parallel_config", "tensor_parallel_size"),
    ("chunked prefill", "scheduler_config", "enable_chunked_prefill"),
    ("max batched tokens", "scheduler_config", "max_num_batched_tokens"),
    ("max running requests", "scheduler_config", "max_num_seqs"),
    ("prefix caching", "cache_config", "enable_prefix_caching"),
    ("memory fraction", "cache_config", "gpu_memory_utilization"),
    ("speculative", "speculative_config", "method"),
)
SHOWN_AS = {"CUDA graphs": {"True": "off", "False": "on"}}  # enforce_eager's negative, shown as what runs
RESOLVED_MARK = "FLEET-RESOLVED "


def resolved_settings(config: Any) -> Dict[str, str]:
    """The values of RESOLVED the created configuration has (None: left to a later stage, not shown)."""
    out = {}  # type: Dict[str, str]
    for shown, section, name in RESOLVED:
        try:
            value = getattr(getattr(config, section), name)
        except Exception:
            continue
        if value is not None:
            out[shown] = SHOWN_AS.get(shown, {}).get(str(value), str(value)[:80])
    return out


def created_config(args: Any) -> Tuple[Optional[str], Dict[str, str]]:
    """vLLM's refusal of the engine configuration (None: created, or not created here), and what the
    configuration it created resolved."""
    if not os.path.isdir(str(getattr(args, "model", "") or "")):
        return None, {}
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found,unused-ignore]

        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception:
        return None, {}  # an older vLLM: its argument check is all there is
    try:
        config = engine_args.create_engine_config()
    except ValueError as exc:  # pydantic's ValidationError is one: vLLM's own checks raise it
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = [line for line in lines if line.startswith("Value error,")] or lines[-1:]
        if not said:
            return type(exc).__name__, {}
        return re.sub(r"\s*\[type=\w+, input_value=.*$", "", said[0].replace("Value error, ", "", 1)), {}
    return None, resolved_settings(config)


def main() -> None:
    args = parse(sys.argv[1:])
    error = unknown_parser(args)
    resolved = {}  # type: Dict[str, str]
    if not error:
        error, resolved = created_config(args)
    if error:
        sys.stderr.write("ValueError: %s\n" % error.replace("\n", " "))
        sys.exit(1)
    # always, last: a line vLLM (or a model's code) printed before cannot stand for it
    sys.stdout.write("\n" + RESOLVED_MARK + json.dumps(resolved) + "\n")


if __name__ == "__main__":
    main()
