"""The engine's own verdict on a command line, beyond its argument parser: SGLang's model loader resolving
the checkpoint's architecture (fleet/control/remote_check_sglang.py, run in the engine's Python on the host
before anything is stopped). The registry it reads is checked against the real SGLang 0.5.11 and 0.5.23
packages, and the simulated engine's against both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import ROOT
from fleet.control.remote_check_sglang import architecture_error, disabled_modules, registered_architectures

ORACLE = Path(os.environ.get("FLEET_ORACLE", ROOT / ".cache" / "sglang-oracle"))
REAL = {
    "0.5.11": ORACLE / ".venv" / "layers" / "sglang-0.5.11" / "sglang" / "srt" / "models",
    "0.5.23": ORACLE / ".venv" / "lib" / "python3.11" / "site-packages" / "sglang" / "srt" / "models",
}
SIMULATED = ROOT / "testbed" / "fleet_testbed" / "simpkgs" / "sglang" / "srt" / "models"
REGISTERED = {"Qwen3_5ForConditionalGeneration", "LlamaForCausalLM", "TransformersForCausalLM"}


def model(tmp_path: Path, **config: object) -> list[str]:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ["--model-path", str(tmp_path), "--tp", "2"]


def test_a_registered_architecture_passes(tmp_path: Path) -> None:
    assert architecture_error(model(tmp_path, architectures=["LlamaForCausalLM"]), REGISTERED, {}) is None


def test_an_unknown_architecture_gets_sglangs_own_error(tmp_path: Path) -> None:
    error = architecture_error(model(tmp_path, architectures=["MadeUpForCausalLM"]), REGISTERED, {})
    assert error and error.startswith("Cannot find model module. 'MadeUpForCausalLM' is not a registered model")


def test_custom_code_needs_trust_remote_code(tmp_path: Path) -> None:
    argv = model(tmp_path, architectures=["CustomForCausalLM"], auto_map={"AutoModel": "m.CustomModel"})
    error = architecture_error(argv, REGISTERED, {})
    assert error and "requires you to execute the configuration file" in error and str(tmp_path) in error
    assert architecture_error([*argv, "--trust-remote-code"], REGISTERED, {}) is None
    # an auto_map without AutoModel is no custom model for SGLang's loader
    argv = model(tmp_path, architectures=["CustomForCausalLM"], auto_map={"AutoConfig": "m.C"})
    assert "Cannot find model module" in (architecture_error([*argv, "--trust-remote-code"], REGISTERED, {}) or "")


def test_the_transformers_backend_is_asked_for_even_for_a_registered_architecture(tmp_path: Path) -> None:
    argv = model(tmp_path, architectures=["LlamaForCausalLM"])
    # no transformers in fleet's test environment: nothing to fall back on
    assert architecture_error([*argv, "--model-impl", "transformers"], REGISTERED, {}) is not None
    assert architecture_error([*argv, "--model-impl=mindspore"], set(), {}) is None


def test_what_cannot_be_known_here_is_left_to_the_engine(tmp_path: Path) -> None:
    unknown = ["MadeUpForCausalLM"]
    assert architecture_error(["--model-path", "Qwen/Qwen3-8B"], REGISTERED, {}) is None  # a Hub id
    assert architecture_error(["--tp", "2"], REGISTERED, {}) is None
    (tmp_path / "config.json").write_text("[1, 2")
    assert architecture_error(["--model-path", str(tmp_path)], REGISTERED, {}) is None  # the engine says why
    argv = model(tmp_path, architectures=unknown)
    assert architecture_error(argv, REGISTERED, {"SGLANG_EXTERNAL_MODEL_PACKAGE": "my_models"}) is None
    # argparse keeps the last of a repeated flag
    assert architecture_error(["--model-path", "Qwen/X", f"--model-path={tmp_path}"], REGISTERED, {}) is not None


def test_the_registry_is_each_modules_entry_classes(tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text("class A: pass\nclass B: pass\nEntryClass = [A, B]\n")
    (tmp_path / "two.py").write_text("import m\nEntryClass = m.C\n")
    (tmp_path / "three.py").write_text("class D: pass\nEntryClass = D\n")
    (tmp_path / "broken.py").write_text("EntryClass = [\n")
    (tmp_path / "helper.py").write_text("X = 1\n")
    assert registered_architectures(str(tmp_path), set()) == {"A", "B", "C", "D"}
    assert registered_architectures(str(tmp_path), disabled_modules(" three, one ")) == {"C"}


@pytest.mark.realparser
@pytest.mark.parametrize("version", sorted(REAL))
def test_the_registry_read_from_the_real_package(version: str) -> None:
    if not REAL[version].is_dir():
        pytest.fail(f"the real SGLang {version} is not built at {ORACLE}: run `make oracle` (make test does)")
    real = registered_architectures(str(REAL[version]), set())
    assert len(real) > 150
    assert {"Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM", "TransformersForCausalLM"} <= real
    assert ("DeepseekV4ForCausalLM" in real) == (version == "0.5.23")  # added after 0.5.11
    # the simulated engine registers only what both real versions do
    assert registered_architectures(str(SIMULATED), set()) <= real
