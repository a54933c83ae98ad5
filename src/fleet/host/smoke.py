"""The smoke check every host step that proves a server shares (the deploy's watcher, health, a service's
router step): the playbook's prompt for a chat model, the endpoint an embedding model or a reranker serves
for the others, and the verdict on what came back.

Sent with those three steps only, after the shared host code (fleet.hostscripts), so it runs under the
host's own Python: standard library only, Python 3.8. Imported as a module by fleet's tests.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    http_request  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import bounded_search, http_request
    from fleet.protocol import SmokeSpec


# What an embedding or reranker server is asked (the smoke's kind: the model's task, fleet.model): two
# texts of one meaning and one unrelated. A working model puts the pair closer than the stranger (an
# embedding model) or scores the answering document above the unrelated one (a cross-encoder).
SAME_MEANING = ("The capital of France is Paris.", "Paris is the capital city of France.")
UNRELATED = "Bananas are a yellow fruit."
RERANK_QUERY = "What is the capital of France?"


def smoke_request(
    base_url: str, model: str, smoke: SmokeSpec, timeout: float, api_key: Optional[str] = None
) -> Dict[str, Any]:
    """Ask the server what proves it serves: {status, ok, text (the answer, or what came back instead),
    seconds}. A chat model gets the playbook's smoke prompt and its answer must match `expect`; an
    embedding model (smoke kind "embed") and a reranker ("rerank") are asked the endpoint they serve.
    The deploy's proof and health's generation check. `api_key`: the engine's key, sent as a bearer token."""
    kind = smoke.get("kind") or "generate"
    request = {}  # type: Dict[str, Any]
    if kind == "embed":
        path, request = "/v1/embeddings", {"model": model, "input": list(SAME_MEANING) + [UNRELATED]}
    elif kind == "rerank":
        path = "/v1/rerank"
        request = {"model": model, "query": RERANK_QUERY, "documents": [SAME_MEANING[1], UNRELATED]}
    else:
        path = "/v1/chat/completions"
        request = {
            "model": model,
            "messages": [{"role": "user", "content": smoke["prompt"]}],
            "max_tokens": smoke.get("max_tokens", 16),
            "temperature": 0,
        }
    headers = {"Authorization": "Bearer %s" % api_key} if api_key else None
    status, text, seconds = http_request("POST", base_url + path, request, timeout=timeout, headers=headers)
    if status == 401:
        text = "the server wants an API key%s: %s" % (
            " and refused the one fleet sent" if api_key else " (playbook api_key_env:)",
            text[:200],
        )
    if status != 200:
        return {"status": status, "ok": False, "text": text[:500], "seconds": seconds}
    if kind in ("embed", "rerank"):
        ok, said = pooling_verdict(kind, text, bool(smoke.get("any_answer")))
        return {"status": status, "ok": ok, "text": said[:500], "seconds": seconds}
    answer = None
    try:
        answer = json.loads(text)["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError):
        answer = None
    matched = bounded_search(smoke["expect"], answer) if answer is not None else False
    shown = (answer if answer is not None else text)[:500]
    if matched is None:
        shown = "the expect pattern ran too long on this answer: %s" % shown
    return {"status": status, "ok": bool(matched), "text": shown, "seconds": seconds}


def _numbers(value: Any) -> Optional[List[float]]:
    """A list of finite numbers, or None."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return None
        x = float(x)  # OverflowError for an integer no float holds: the caller says "not an answer"
        if x != x or x in (float("inf"), float("-inf")):
            return None
        out.append(x)
    return out


def _cosine(a: List[float], b: List[float]) -> float:
    na, nb = sum(x * x for x in a) ** 0.5, sum(x * x for x in b) ** 0.5
    return sum(x * y for x, y in zip(a, b)) / (na * nb) if na and nb else 0.0  # noqa: B905 (host Python 3.8)


def _by_index(rows: Any, count: int) -> Optional[List[Dict[str, Any]]]:
    """The answer's rows in order when their indices are exactly 0..count-1, each once, as integers."""
    if not isinstance(rows, list) or len(rows) != count or not all(isinstance(r, dict) for r in rows):
        return None
    indices = [r.get("index") for r in rows]
    if any(isinstance(i, bool) or not isinstance(i, int) for i in indices) or sorted(indices) != list(range(count)):
        return None
    return sorted(rows, key=lambda r: r["index"])


def pooling_verdict(kind: str, text: str, any_answer: bool) -> Tuple[bool, str]:
    """An embedding or rerank answer judged; an answer that is no such answer (too deep, numbers no float
    holds, anything else) is said to be one, never raised: a server's bytes must not end fleet's check."""
    try:
        return (_embeddings_verdict if kind == "embed" else _rerank_verdict)(text, any_answer)
    except Exception as exc:  # noqa: BLE001  (RecursionError, OverflowError, ...: all the server's doing)
        return False, "not %s answer (%s): %s" % (
            "an embeddings" if kind == "embed" else "a rerank",
            type(exc).__name__,
            text[:200],
        )


def _embeddings_verdict(text: str, any_answer: bool) -> Tuple[bool, str]:
    """/v1/embeddings' answer (OpenAI's shape, as SGLang and vLLM give it) to SAME_MEANING + UNRELATED."""
    body = json.loads(text)
    rows = _by_index(body.get("data") if isinstance(body, dict) else None, 3)
    if rows is None:
        return False, "not 3 embeddings indexed 0, 1 and 2: %s" % text[:300]
    vectors = [_numbers(r.get("embedding")) for r in rows]
    if any(v is None for v in vectors) or len({len(v or ()) for v in vectors}) != 1:
        return False, "not 3 embeddings of one size, of finite numbers: %s" % text[:300]
    a, b, c = (v or [] for v in vectors)
    if not all(any(vector) for vector in (a, b, c)):
        return False, "an embedding of zeros only: %s" % text[:300]
    near, far = _cosine(a, b), _cosine(a, c)
    said = "3 embeddings of %d numbers; cosine of two sentences of one meaning %.3f, of an unrelated one %.3f" % (
        len(a),
        near,
        far,
    )
    if any_answer or near > far:
        return True, said
    return False, said + ": the model does not tell them apart"


def _rerank_verdict(text: str, any_answer: bool) -> Tuple[bool, str]:
    """/v1/rerank's scores for [the answer, UNRELATED]: SGLang answers a list of {index, score}, vLLM
    {"results": [{index, relevance_score}]}."""
    body = json.loads(text)
    rows = _by_index(body.get("results") if isinstance(body, dict) else body, 2)
    if rows is None:
        return False, "not 2 scores indexed 0 and 1: %s" % text[:300]
    scores = [_numbers([r.get("relevance_score", r.get("score"))]) for r in rows]
    good, bad = scores
    if good is None or bad is None:
        return False, "no score for each of the 2 documents: %s" % text[:300]
    said = "the answering document scored %.3f, an unrelated one %.3f" % (good[0], bad[0])
    if any_answer or good[0] > bad[0]:
        return True, said
    return False, said + ": the model does not rank them"
