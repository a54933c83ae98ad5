"""Runs under the SGLang oracle's own Python (../shared/tools/sglang-oracle): which draft class the real
SGLang of one version loads for NEXTN on each architecture its `ModelConfig._config_draft_model` names, and
which architectures its `is_hybrid_swa_model` gives a sliding-window KV pool of their own.

    sglang_drafts.py ORACLE_DIR VERSION > {"version": ..., "drafts": {target: draft or "error: ..."},
                                           "swa": [architecture, ...]}

The method is run on a stand-in for the config (every attribute it does not set reads as None): an
architecture it leaves as it was has no draft class. A branch that needs more of a real config than the
stand-in has answers "error: ..." (fleet's table takes those from the source). Standard library only,
besides the oracle itself.
"""

import inspect
import json
import os
import re
import sys
from typing import Any


class StandIn:
    """A config with only `architectures`; any other attribute is None until the method sets it."""

    def __init__(self, architecture: str) -> None:
        self.__dict__["architectures"] = [architecture]

    def __getattr__(self, name: str) -> Any:
        return None


def main() -> None:
    oracle_dir, version = sys.argv[1], sys.argv[2]
    sys.path.insert(0, oracle_dir)
    import oracle  # noqa: PLC0415 - found only once its directory is on the path

    for rel in reversed(oracle.LAYERED.get(version, [])):
        sys.path.insert(0, os.path.join(oracle.VENV, rel))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    oracle.install_stubs()

    from sglang.srt.configs import model_config  # noqa: PLC0415

    method = model_config.ModelConfig._config_draft_model
    source = inspect.getsource(method)
    names = set(re.findall(r'"([A-Z][A-Za-z0-9_]*)"', source))
    for listed in re.findall(r"\bin ([A-Z][A-Z0-9_]+)\b", source):
        names |= set(getattr(model_config, listed, ()) or ())
    drafts = {}
    for architecture in sorted(names):
        config = StandIn(architecture)
        target = type("Target", (), {})()
        target.__dict__.update(
            is_draft_model=True, hf_config=config, hf_text_config=config, speculative_algorithm="NEXTN",
            is_draft_quantization_explicit=False, quantization=None, sliding_window_size=None,
        )  # fmt: skip
        try:
            method(target)
            drafted = target.hf_config.architectures[0]
        except Exception as exc:  # noqa: BLE001 - a branch the stand-in cannot satisfy: said, not fatal
            drafted = f"error: {type(exc).__name__}"
        if drafted != architecture:
            drafts[architecture] = drafted
    print(json.dumps({"version": version, "drafts": drafts, "swa": sorted(hybrid_swa(model_config))}))


def hybrid_swa(model_config: Any) -> set[str]:
    """The architectures `is_hybrid_swa_model` gives a sliding-window pool of their own: every name its
    source lists (a set of names, and the module's tuples it unpacks), each asked of the function itself."""
    source = inspect.getsource(model_config.is_hybrid_swa_model)
    names = set(re.findall(r'"([A-Z][A-Za-z0-9_]*)"', source))
    for listed in re.findall(r"\*([A-Z][A-Z0-9_]+)\b", source):
        names |= set(getattr(model_config, listed, ()) or ())
    return {arch for arch in names if model_config.is_hybrid_swa_model([arch])}


if __name__ == "__main__":
    main()
