"""Run by the sglang-oracle's Python (tests/test_plan_matrix.py): SGLang's own capability gate for a
checkpoint's quantisation, as its model loader applies it at load (0.5.11 srt/model_loader/loader.py
L244-249: the quantisation config is built from the checkpoint's, and a GPU whose capability is below
its `get_min_capability()` is a ValueError). Prints one JSON line, {model_dir: {"min_capability": N} or
{"error": why}}.

Usage: python sglang_min_capability.py ORACLE_DIR VERSION METHOD=MODEL_DIR...
"""

import json
import os
import sys


def checkpoint_quant_config(model_dir: str) -> dict:
    """The quantisation config the loader builds from: ModelOpt's hf_quant_config.json when there is one,
    else config.json's quantization_config (at the top, or in text_config for the VL wrappers)."""
    hf_quant = os.path.join(model_dir, "hf_quant_config.json")
    if os.path.exists(hf_quant):
        with open(hf_quant) as f:
            return json.load(f)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    return cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config") or {}


def main() -> None:
    oracle_dir, version, *pairs = sys.argv[1:]
    sys.path.insert(0, oracle_dir)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr  # whatever SGLang prints while importing
    import oracle  # the oracle's own set-up: the version's layer first on sys.path, stand-ins for torchvision

    for rel in reversed(oracle.LAYERED.get(version, [])):
        sys.path.insert(0, os.path.join(oracle.VENV, rel))
    oracle.install_stubs()
    from sglang.srt.layers.quantization import QUANTIZATION_METHODS

    out = {}
    for pair in pairs:
        method, model_dir = pair.split("=", 1)
        try:
            config = QUANTIZATION_METHODS[method].from_config(checkpoint_quant_config(model_dir))
            out[model_dir] = {"min_capability": int(config.get_min_capability())}
        except Exception as exc:  # reported, and the test fails on it
            out[model_dir] = {"error": f"{type(exc).__name__}: {exc}"}
    real_stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
