"""The simulated SGLang's embedding and rerank side (/v1/embeddings, /v1/rerank), held to the real one:
which architectures are not generation models (configs/model_config.py is_generation_model, 0.5.23), the
error a generation server gives an embedding request (managers/tokenizer_manager.py), and the answers'
shapes (entrypoints/openai/protocol.py EmbeddingResponse; serving_rerank.py: a list of {score, document,
index, meta_info}, best first).

The vectors are hashed bags of words, so that texts sharing words are near and unrelated ones are not,
as a working model's are: fleet's smoke check tells a model that works from one that does not."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

# SGLang 0.5.23 is_generation_model: these are never generation models, whatever the flags
NOT_GENERATION = {
    "LlamaEmbeddingModel",
    "MistralModel",
    "LlamaForSequenceClassification",
    "Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification",
    "Qwen3Model",
    "BertModel",
    "Contriever",
    "BertForSequenceClassification",
    "XLMRobertaModel",
    "XLMRobertaForSequenceClassification",
    "Gemma2ForSequenceClassification",
}
NOT_EMBEDDING = (
    "This model does not appear to be an embedding model by default. "
    "Please add `--is-embedding` when launching the server or try another model."
)
MAX_DIMENSIONS = 4096


def is_generation(arch: str, is_embedding: bool) -> bool:
    return arch not in NOT_GENERATION and not is_embedding


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def embedding(text: str, dimensions: int) -> list[float]:
    """A unit vector: each word adds one to a coordinate its hash picks."""
    v = [0.0] * max(1, min(dimensions, MAX_DIMENSIONS))
    for w in _words(text):
        v[int(hashlib.sha256(w.encode()).hexdigest(), 16) % len(v)] += 1.0
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def embeddings_answer(body: dict[str, Any], served: str, dimensions: int) -> dict[str, Any]:
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else list(texts or [])
    return {
        "object": "list",
        "model": served,
        "data": [
            {"object": "embedding", "index": i, "embedding": embedding(str(t), dimensions)} for i, t in enumerate(texts)
        ],
        "usage": {"prompt_tokens": sum(len(_words(str(t))) for t in texts), "total_tokens": 0},
    }


def rerank_answer(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A cross-encoder's scores: the share of the query's words each document holds."""
    query = set(_words(str(body.get("query") or "")))
    rows = []
    for i, doc in enumerate(body.get("documents") or []):
        words = set(_words(str(doc)))
        score = len(query & words) / len(query) if query else 0.0
        rows.append(
            {
                "score": score,
                "document": doc if body.get("return_documents", True) else None,
                "index": i,
                "meta_info": {},
            }
        )
    return sorted(rows, key=lambda r: r["score"], reverse=True)
