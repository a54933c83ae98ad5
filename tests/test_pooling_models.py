"""Embedding models and cross-encoder rerankers: told apart from chat models by their own files, planned as
what they are for each engine, and proved by the endpoint they serve (/v1/embeddings, /v1/rerank).

The configs are the published ones (tests/data/matrix):
- Qwen3-Embedding-4B: a Qwen3ForCausalLM with a sentence-transformers pipeline (modules.json); its config
  as published in huggingface.co/zenlm/zen3-embedding/blob/main/config.json, a copy of the 4B embedding
  model's (vocab 151665, 36 layers of 2560).
- bge-reranker-v2-m3: XLMRobertaForSequenceClassification with one label, float32, as published in
  huggingface.co/BAAI/bge-reranker-v2-m3/blob/3f6000f2fe7498b9d817ac6ec0ee451448a2d030/config.json (SGLang's
  rerank docs launch it with --is-embedding); 2.27 GB of weights, its model card's 568M parameters in FP32.
The real SGLang parser and resolution of 0.5.11 and 0.5.23 accept their plans in the planner matrix
(tests/test_plan_matrix.py); the real vLLM parser accepts the vLLM goldens (tests/test_vllm_real.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from factsdata import RTX_A6000, facts
from fleet.control import ops, placing
from fleet.host.smoke import SAME_MEANING, UNRELATED, pooling_verdict
from fleet.inventory import parse_inventory, parse_playbook
from fleet.model import EMBED, GENERATE, RERANK, parse_model_spec, serving_task
from fleet.plan import args_dict
from fleet.plan.build import PlanResult
from fleet.yamlfile import parse_yaml
from fleet_testbed import sim_pooling
from test_plan import golden

MATRIX = Path(__file__).resolve().parent / "data" / "matrix"
EMBEDDING, RERANKER = MATRIX / "Qwen3-Embedding-4B", MATRIX / "bge-reranker-v2-m3"
INVENTORY = "hosts:\n  box:\n    address: 10.0.0.9\n    engines: {sglang: /opt/s/bin/python, vllm: /opt/v/bin/python}\n"
PLAYBOOK = (
    "engine: {engine}\nmodel: {model}\nserved_name: m\nspeculative: {{steps: 1}}\nparsers: auto\n"
    "smoke: {{prompt: hi, expect: Paris}}\n"
)


def config(d: Path) -> dict[str, object]:
    return json.loads((d / "config.json").read_text())


def plan(model: Path, engine: str = "sglang", version: str = "0.5.23") -> PlanResult:
    inv = parse_inventory(parse_yaml(INVENTORY, Path("inventory.yaml")))
    text = PLAYBOOK.format(engine=engine, model=model.name)
    pb = parse_playbook(parse_yaml(text, Path(f"{model.name}.yaml")), model.name)
    f = facts("box", RTX_A6000, 2, engine=engine, version=version, model=model)
    return placing.place_and_plan(inv.hosts["box"], pb, f, model.name, None, replace=False).result


def test_a_sentence_transformers_pipeline_makes_a_causal_lm_an_embedding_model() -> None:
    """Qwen3-Embedding's architecture is a chat model's: only its modules.json says what it is."""
    assert parse_model_spec("/m", config(EMBEDDING), None, 1, sentence_transformers=True).task == EMBED
    assert parse_model_spec("/m", config(EMBEDDING), None, 1).task == GENERATE


@pytest.mark.parametrize(
    ("architecture", "task"),
    [
        ("XLMRobertaForSequenceClassification", RERANK),
        ("Qwen3ForSequenceClassification", RERANK),
        ("BertModel", EMBED),
        ("XLMRobertaModel", EMBED),
        ("MistralModel", EMBED),
        ("LlamaEmbeddingModel", EMBED),
        ("Qwen3ForCausalLM", GENERATE),
        ("Qwen3_5MoeForConditionalGeneration", GENERATE),
    ],
)
def test_the_architecture_says_what_a_checkpoint_serves(architecture: str, task: str) -> None:
    assert serving_task(architecture, sentence_transformers=False) == task


def test_the_reranker_is_a_cross_encoder() -> None:
    spec = parse_model_spec("/m", config(RERANKER), None, 2_271_071_852)
    assert spec.task == RERANK and "a cross-encoder reranker" in spec.describe()


def test_sglang_serves_an_embedding_model_in_embedding_mode_without_parsers_or_drafts() -> None:
    r = plan(EMBEDDING)
    assert r.plan is not None and not r.errors and r.plan.task == EMBED
    a = args_dict(r.plan.engine_args())
    assert "--is-embedding" in a
    assert not {"--reasoning-parser", "--tool-call-parser", "--speculative-algorithm"} & set(a)
    said = [v.message for v in r.verdicts if v.rule == "embedding-model"]
    assert said and "the playbook's speculative and parsers do not apply" in said[0]
    assert r.plan.flag("--is-embedding").source.startswith("sglang configs/model_config.py")  # type: ignore[union-attr]
    assert r.plan.to_json()["task"] == EMBED  # kept in the host's record: restart and health ask the same


def test_sglang_runs_a_cross_encoder_on_the_attention_backend_its_rerank_models_support() -> None:
    """And as SGLang's documented reranker launch does: each pair prefilled whole, no prefix cache. SGLang
    turns neither off itself for a sequence classifier (0.5.23 configs/embedding_model_spec.py); the real
    parser and resolution of both versions accept the plan (tests/test_plan_matrix.py)."""
    for version in ("0.5.11", "0.5.23"):
        r = plan(RERANKER, version=version)
        assert r.plan is not None and not r.errors and r.plan.task == RERANK
        a = args_dict(r.plan.engine_args())
        assert "--is-embedding" in a and a["--attention-backend"] == "triton"
        assert "--disable-radix-cache" in a and a["--chunked-prefill-size"] == "-1"
        assert r.plan.flag("--chunked-prefill-size").rule == "cross-encoder-whole-pair"  # type: ignore[union-attr]
    embedding = args_dict(plan(EMBEDDING).plan.engine_args())  # type: ignore[union-attr]
    assert "--disable-radix-cache" not in embedding and "--chunked-prefill-size" not in embedding


def test_a_sequence_classifier_of_several_labels_is_refused_not_planned_as_a_reranker(tmp_path: Path) -> None:
    """Found by review: every *ForSequenceClassification was planned as a cross-encoder, a sentiment or
    reward classifier too, whose /v1/rerank would rank by its first label alone: the smoke check would fail
    after the old server was stopped. It is refused before anything is stopped; one label plans as before."""
    three = tmp_path / "three-labels"
    shutil.copytree(RERANKER, three)
    cfg = config(three)
    cfg["id2label"] = {"0": "negative", "1": "neutral", "2": "positive"}
    (three / "config.json").write_text(json.dumps(cfg))
    r = plan(three)
    [said] = [v.message for v in r.errors if v.rule == "sequence-classifier"]
    assert said.startswith("XLMRobertaForSequenceClassification with 3 labels is a classifier, not a cross-encoder")
    assert not [v for v in plan(RERANKER).errors]


def test_an_embedding_model_or_a_reranker_runs_as_replicas_even_on_nvlink() -> None:
    """Found by review: on an 8x H100 NVLink box a reranker of 2 GiB took all eight GPUs as one TP group.
    A pooling server only prefills and keeps no KV cache between requests: replicas of the smallest TP
    that holds it serve side by side; a chat model of the same size keeps one TP group there."""
    from test_fit import H100_GPU, placed

    for model in (RERANKER, EMBEDDING):
        f = facts("box", H100_GPU, 8, model=model, nvlink=True, version="0.5.23")
        p = placed("qwen36-27b", f, model=model.name, speculative=None)
        assert p.result.plan is not None and p.placement.gpus == tuple(range(8))
        a = args_dict(p.result.plan.engine_args())
        assert (a["--tp-size"], a["--dp-size"]) == ("1", "8")
        said = next(v.message for v in p.result.verdicts if v.rule == "gpus-fit")
        assert "TP 1 x 8 data-parallel replicas (an embedding or reranker server only prefills" in said


def test_a_chat_models_plan_and_record_are_unchanged() -> None:
    r = plan(MATRIX / "Qwen3-8B")
    assert r.plan is not None and r.plan.task == GENERATE and "task" not in r.plan.to_json()
    assert "--is-embedding" not in r.plan.engine_args() and "--reasoning-parser" in r.plan.engine_args()


@pytest.mark.parametrize(("model", "name"), [(EMBEDDING, "embedding"), (RERANKER, "reranker")])
def test_golden_vllm_pooling_plans(model: Path, name: str) -> None:
    """vLLM's pooling runner converts the architecture itself (checked by the real vLLM parser)."""
    r = plan(model, engine="vllm", version="0.33.0")
    assert r.plan is not None and not r.errors
    assert args_dict(r.plan.engine_args())["--runner"] == "pooling"
    golden(f"{name}-vllm-0.33.0", r)


def test_vllm_before_the_runner_flag_is_told_the_task() -> None:
    embed = plan(EMBEDDING, engine="vllm", version="0.10.0")
    rerank = plan(RERANKER, engine="vllm", version="0.10.0")
    assert embed.plan is not None and rerank.plan is not None
    assert args_dict(embed.plan.engine_args())["--task"] == "embed"
    assert args_dict(rerank.plan.engine_args())["--task"] == "score"


def test_the_smoke_of_an_embedding_model_asks_its_endpoint_and_keeps_any_answer() -> None:
    pb = parse_playbook(
        parse_yaml(
            PLAYBOOK.format(engine="sglang", model="m").replace("expect: Paris", "expect: '.*', any_answer: true"),
            Path("p.yaml"),
        ),
        "p",
    )
    assert ops.smoke_of(pb, EMBED) == {
        "prompt": "hi",
        "expect": ".*",
        "max_tokens": 16,
        "kind": EMBED,
        "any_answer": True,
    }
    assert "kind" not in ops.smoke_of(pb, GENERATE)


# --- the smoke's verdicts on what the servers answer ------------------------------------------------------


def embeddings(vectors: list[list[float]]) -> str:
    return json.dumps({"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]})


def test_a_working_embedding_model_puts_one_meaning_nearer_than_a_stranger() -> None:
    answer = sim_pooling.embeddings_answer({"input": [*SAME_MEANING, UNRELATED]}, "m", 2560)
    ok, said = pooling_verdict("embed", json.dumps(answer), any_answer=False)
    assert ok and said.startswith("3 embeddings of 2560 numbers; cosine of two sentences of one meaning")


def indexed(*rows: tuple[object, str]) -> str:
    """An embeddings answer of (index, embedding as JSON text) rows, written as a server might."""
    return '{"data": [' + ", ".join(f'{{"index": {i}, "embedding": {e}}}' for i, e in rows) + "]}"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (embeddings([[1.0, 0.0]] * 3), "does not tell them apart"),  # a model that maps everything alike
        (embeddings([[1.0, 0.0], [1.0, 0.0]]), "not 3 embeddings"),
        (embeddings([[1.0, 0.0], [1.0], [0.0, 1.0]]), "not 3 embeddings of one size"),
        (embeddings([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), "zeros only"),
        (indexed((0, "[NaN, 1]"), (1, "[1, 1]"), (2, "[1, 0]")), "finite numbers"),
        (indexed((0, "[1e999]"), (1, "[1]"), (2, "[2]")), "finite numbers"),
        (indexed((0, "[1]"), (0, "[1]"), (0, "[1]")), "indexed 0, 1 and 2"),  # every row claims the first
        (indexed((7, "[1]"), (-3, "[1]"), (99, "[1]")), "indexed 0, 1 and 2"),
        (indexed(("true", "[1]"), (1, "[1]"), (2, "[1]")), "indexed 0, 1 and 2"),
        (indexed((0, "[" + "9" * 400 + "]"), (1, "[1]"), (2, "[2]")), "OverflowError"),  # no float holds it
        ('{"data": ' + "[" * 100_000 + "]" * 100_000 + "}", "RecursionError"),
        ('{"choices": []}', "not 3 embeddings"),
        ("<html>", "not an embeddings answer"),
    ],
)
def test_an_embedding_answer_that_proves_nothing_fails_the_smoke(answer: str, why: str) -> None:
    """Found by review: three rows all claiming index 0 passed, and a number no float holds, or JSON nested
    too deep, raised out of the check, ending the deploy with no reason and health's whole host check."""
    ok, said = pooling_verdict("embed", answer, any_answer=False)
    assert not ok and why in said


def test_random_weights_prove_only_the_shape() -> None:
    assert pooling_verdict("embed", embeddings([[1.0, 0.0]] * 3), any_answer=True)[0]
    assert not pooling_verdict("embed", embeddings([[1.0, 0.0]] * 2), any_answer=True)[0]


def test_a_reranker_must_score_the_answer_above_the_stranger_in_either_engines_shape() -> None:
    sglang = sim_pooling.rerank_answer(
        {"query": "What is the capital of France?", "documents": [SAME_MEANING[1], UNRELATED]}
    )
    assert pooling_verdict("rerank", json.dumps(sglang), any_answer=False)[0]
    vllm = {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}]}
    ok, said = pooling_verdict("rerank", json.dumps(vllm), any_answer=False)
    assert not ok and said.endswith("the model does not rank them")
    assert pooling_verdict("rerank", json.dumps(vllm), any_answer=True)[0]
    assert not pooling_verdict("rerank", '[{"index": 0, "score": 1}]', any_answer=True)[
        0
    ]  # one score for two documents
    for rows in (
        '[{"index": 0, "score": 1}, {"index": 0, "score": 0}]',  # one document scored twice
        '[{"index": true, "score": 1}, {"index": 1, "score": 0}]',
        '[{"index": 0, "score": 1}, {"index": 1, "score": 0}, {"index": -1, "score": 9}]',
        '[{"index": 0, "score": ' + "9" * 400 + '}, {"index": 1, "score": 0}]',
        '{"results": [{"index": 1e999, "relevance_score": 1}]}',
    ):
        assert not pooling_verdict("rerank", rows, any_answer=True)[0], rows


def test_the_simulated_engine_serves_embeddings_only_in_embedding_mode() -> None:
    """As SGLang's is_generation_model: an encoder architecture is never a generation model; a decoder
    checkpoint is one unless --is-embedding says otherwise."""
    assert not sim_pooling.is_generation("XLMRobertaForSequenceClassification", is_embedding=False)
    assert sim_pooling.is_generation("Qwen3ForCausalLM", is_embedding=False)
    assert not sim_pooling.is_generation("Qwen3ForCausalLM", is_embedding=True)


def test_a_model_directory_with_modules_json_is_read_as_an_embedding_model(tmp_path: Path) -> None:
    from fleet.host.probe import _model

    shutil.copytree(EMBEDDING, tmp_path / "e")
    assert _model(str(tmp_path / "e"))["sentence_transformers"] is True  # type: ignore[index]
    (tmp_path / "e" / "modules.json").unlink()
    assert _model(str(tmp_path / "e"))["sentence_transformers"] is False  # type: ignore[index]
