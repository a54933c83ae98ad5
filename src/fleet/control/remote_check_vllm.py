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
   would be fetched, and a missing directory is fleet's own pre-flight's to refuse.
"""

import importlib
import os
import re
import sys
from typing import Any, List, Optional


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


def config_error(args: Any) -> Optional[str]:
    """vLLM's refusal of the engine configuration, or None (created, or not created here)."""
    if not os.path.isdir(str(getattr(args, "model", "") or "")):
        return None
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs  # type: ignore[import-not-found,unused-ignore]

        engine_args = AsyncEngineArgs.from_cli_args(args)
    except Exception:
        return None  # an older vLLM: its argument check is all there is
    try:
        engine_args.create_engine_config()
    except ValueError as exc:  # pydantic's ValidationError is one: vLLM's own checks raise it
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = [line for line in lines if line.startswith("Value error,")] or lines[-1:]
        if not said:
            return type(exc).__name__
        return re.sub(r"\s*\[type=\w+, input_value=.*$", "", said[0].replace("Value error, ", "", 1))
    return None


def main() -> None:
    args = parse(sys.argv[1:])
    error = unknown_parser(args) or config_error(args)
    if error:
        sys.stderr.write("ValueError: %s\n" % error.replace("\n", " "))
        sys.exit(1)


if __name__ == "__main__":
    main()
