"""The engine's own verdict on a command line, beyond its argument parser: SGLang's model loader resolving
the checkpoint's architecture (fleet/host/check_sglang.py, run in the engine's Python on the host
before anything is stopped). The registry it reads is checked against the real SGLang 0.5.11 and 0.5.23
packages, and the simulated engine's against both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import ROOT
from fleet.host.check_sglang import (
    Settings,
    architecture_error,
    disabled_modules,
    registered_architectures,
    resolved_settings,
)

ORACLE = Path(os.environ.get("FLEET_ORACLE", ROOT / ".cache" / "sglang-oracle"))
REAL = {
    "0.5.11": ORACLE / ".venv" / "layers" / "sglang-0.5.11" / "sglang" / "srt" / "models",
    "0.5.23": ORACLE / ".venv" / "lib" / "python3.11" / "site-packages" / "sglang" / "srt" / "models",
}
SIMULATED = ROOT / "testbed" / "fleet_testbed" / "simpkgs" / "sglang" / "srt" / "models"
REGISTERED = {"Qwen3_5ForConditionalGeneration", "LlamaForCausalLM", "TransformersForCausalLM"}


def model(tmp_path: Path, impl: str = "auto", override: str = "", **config: object) -> Settings:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return Settings(str(tmp_path), impl, override)


def test_a_registered_architecture_passes(tmp_path: Path) -> None:
    assert architecture_error(model(tmp_path, architectures=["LlamaForCausalLM"]), REGISTERED, {}) is None


def test_an_unknown_architecture_gets_sglangs_own_error(tmp_path: Path) -> None:
    error = architecture_error(model(tmp_path, architectures=["MadeUpForCausalLM"]), REGISTERED, {})
    assert error and error.startswith("Cannot find model module. 'MadeUpForCausalLM' is not a registered model")


def test_the_models_own_code_is_what_sglang_loads_for_an_unknown_architecture(tmp_path: Path) -> None:
    """auto_map.AutoModel: SGLang's loader takes the model's own module (whether the config may run code
    at all is decided earlier, when resolution reads it with or without --trust-remote-code)."""
    custom = model(tmp_path, architectures=["CustomForCausalLM"], auto_map={"AutoModel": "m.CustomModel"})
    assert architecture_error(custom, REGISTERED, {}) is None
    no_model = model(tmp_path, architectures=["CustomForCausalLM"], auto_map={"AutoConfig": "m.C"})
    assert "Cannot find model module" in (architecture_error(no_model, REGISTERED, {}) or "")


def test_the_transformers_backend_when_asked_for(tmp_path: Path) -> None:
    """--model-impl transformers: SGLang skips its compatibility gate for a class it cannot find (a warning),
    and mindspore is not judged here."""
    assert architecture_error(model(tmp_path, "transformers", architectures=["MyLlamaX"]), REGISTERED, {}) is None
    assert architecture_error(model(tmp_path, "mindspore", architectures=["MyLlamaX"]), set(), {}) is None


def test_the_override_sglang_applies_is_what_is_looked_up(tmp_path: Path) -> None:
    override = json.dumps({"architectures": ["LlamaForCausalLM"]})
    renamed = model(tmp_path, override=override, architectures=["MyRenamedLlama"])
    assert architecture_error(renamed, REGISTERED, {}) is None


def test_what_cannot_be_known_here_is_left_to_the_engine(tmp_path: Path) -> None:
    assert architecture_error(Settings("Qwen/Qwen3-8B"), REGISTERED, {}) is None  # a Hub id
    assert architecture_error(Settings(None), REGISTERED, {}) is None
    (tmp_path / "config.json").write_text("[1, 2")
    assert architecture_error(Settings(str(tmp_path)), REGISTERED, {}) is None  # the engine says why
    for odd in (5, True, "LlamaForCausalLM"):  # not a list: the engine fails on it in its own words
        assert architecture_error(model(tmp_path, architectures=odd), REGISTERED, {}) is None
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    assert architecture_error(Settings(str(tmp_path)), REGISTERED, {}) is None
    unknown = model(tmp_path, architectures=["MadeUpForCausalLM"])
    assert architecture_error(unknown, REGISTERED, {"SGLANG_EXTERNAL_MODEL_PACKAGE": "my_models"}) is None


def test_the_settings_are_read_from_sglangs_own_record() -> None:
    class Impl:
        value = "transformers"

    class Record:  # what prepare_server_args returns: abbreviations and --config files already applied
        model_path = "/models/x"
        model_impl = Impl()
        json_model_override_args = '{"architectures": ["A"]}'

    s = Settings.of(Record())
    assert (s.model_path, s.model_impl, s.override_args) == ("/models/x", "transformers", '{"architectures": ["A"]}')
    assert Settings.of(object()).model_impl == "auto"


def test_the_registry_is_each_modules_entry_classes(tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text("class A: pass\nclass B: pass\nEntryClass = [A, B]\n")
    (tmp_path / "two.py").write_text("import m\nEntryClass = m.C\n")
    (tmp_path / "three.py").write_text("class D: pass\nEntryClass = D\n")
    (tmp_path / "broken.py").write_text("EntryClass = [\n")
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfclass E: pass\nEntryClass = [E]\n")  # 0.5.11 has one
    assert registered_architectures(str(tmp_path), set()) == {"A", "B", "C", "D", "E"}
    assert registered_architectures(str(tmp_path), disabled_modules(" three, one ,bom")) == {"C"}


@pytest.mark.realparser
@pytest.mark.parametrize("version", sorted(REAL))
def test_the_registry_read_from_the_real_package(version: str) -> None:
    if not REAL[version].is_dir():
        pytest.fail(f"the real SGLang {version} is not built at {ORACLE}: run `make oracle` (make test does)")
    real = registered_architectures(str(REAL[version]), set())
    assert len(real) > 150
    assert {"Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM", "TransformersForCausalLM"} <= real
    assert ("DeepseekV4ForCausalLM" in real) == (version == "0.5.23")  # added after 0.5.11
    assert "Qwen2ForSequenceClassification" in real  # 0.5.11's module for it starts with a BOM
    # the simulated engine registers only what both real versions do
    assert registered_architectures(str(SIMULATED), set()) <= real


def test_what_the_engine_resolved_is_reported_by_its_record() -> None:
    class Backend:
        value = "flashinfer"

    class Record:  # 0.5.23 names first; an enum; a value left to a later stage (None) is not shown
        attention_backend = Backend()
        mamba_radix_cache_strategy = "extra_buffer"
        mamba_scheduler_strategy = "no_buffer"
        chunked_prefill_size = 8192
        moe_runner_backend = None
        speculative_algorithm = "EAGLE" + "x" * 200
        disable_overlap_schedule = False

    said = resolved_settings(Record())
    assert said["attention"] == "flashinfer" and said["mamba strategy"] == "extra_buffer"
    assert said["overlap scheduler"] == "on"  # what runs, not disable_overlap_schedule's False
    assert said["chunked prefill"] == "8192" and "MoE runner" not in said and len(said["speculative"]) == 80


def test_found_by_review_the_resolved_line_is_read_defensively() -> None:
    """The engine check prints it, last; the engine's own output before it (or a model's code) cannot
    stand for it, and an odd line is dropped, never a crash of the act step."""
    from fleet.cli.report import describe_resolved
    from fleet.host.check import resolved_of

    forged = 'FLEET-RESOLVED {"attention": "forged"}\nlog line\nFLEET-RESOLVED {"attention": "fa3"}\n'
    assert resolved_of("sglang", forged) == {"attention": "fa3"}
    assert resolved_of("vllm", forged) == {"attention": "fa3"}  # both checks print one
    assert resolved_of("tgi", forged) == {}  # an engine fleet has no check for says nothing
    assert resolved_of("sglang", "FLEET-RESOLVED {" + '"a":' + "[" * 1500 + "]" * 1500 + "}\n") == {}
    assert resolved_of("sglang", 'FLEET-RESOLVED {"a": {"b": 1}, "c": 5, "d": "' + "x" * 300 + '"}\n') == {
        "c": "5",
        "d": "x" * 80,
    }
    assert resolved_of("sglang", "FLEET-RESOLVED [1]\n") == {} and resolved_of("sglang", "no mark") == {}
    assert describe_resolved("abc") == "" and describe_resolved({"k\x1b]0;x\x07": "v\x1b[31m"}).count("\x1b") == 0
