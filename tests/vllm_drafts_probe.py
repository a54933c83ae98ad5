"""Run under the real vLLM's Python (tests/test_vllm_real.py): what its SpeculativeConfig.hf_config_override
makes of each (model_type, architecture) given as JSON in argv[1], and every name the method compares a
model_type or an architecture with, read from its source. Prints one JSON object."""

from __future__ import annotations

import ast
import inspect
import json
import sys
import textwrap
import typing

from transformers import PretrainedConfig
from vllm.config.speculative import MTPModelTypes, SpeculativeConfig

DRAFT_TYPES = set(typing.get_args(MTPModelTypes))


def draft(model_type: str, architecture: str) -> str | None:
    """The MTP draft type the target becomes, None when it becomes none (an error is said as such)."""
    common = {"num_nextn_predict_layers": 1, "mtp_num_hidden_layers": 1, "hc_count": 1, "layer_types": []}
    text = PretrainedConfig(**common, num_attention_heads=8, hidden_size=64)
    text.model_type = model_type
    config = PretrainedConfig(**common, architectures=[architecture], text_config=text)
    config.model_type = model_type
    try:
        out = SpeculativeConfig.hf_config_override(config)
    except Exception as exc:  # noqa: BLE001  (the test shows it)
        return f"error: {exc}"
    return out.model_type if out.model_type in DRAFT_TYPES else None


def names_compared() -> list[str]:
    source = textwrap.dedent(inspect.getsource(SpeculativeConfig.hf_config_override))
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if not any(k in ast.unparse(s) for s in sides for k in ("model_type", "architecture", "arch")):
            continue
        for side in sides:
            elts = side.elts if isinstance(side, (ast.Tuple, ast.Set, ast.List)) else [side]
            found |= {e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return sorted(n for n in found if not n.endswith(("_mtp", "MTP")))


asked = json.loads(sys.argv[1])
print(json.dumps({"drafts": {f"{t}|{a}": draft(t, a) for t, a in asked}, "names": names_compared()}))
