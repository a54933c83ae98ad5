"""The crash classifier on real engine logs: `../shared/corpus/crash-logs` (125 excerpts from public
issues, labelled by root cause in the thread), read in place. The rules the corpus exists to test:
no crash is ever called healthy, no healthy log is called a crash, and where the decisive line is in
the excerpt the category is right (>= 0.90 overall; per category reported)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from fleet.crashes import Diagnosis, LogContext, diagnose

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "crash-logs"
NOT_A_CRASH = {"healthy", "starting"}

pytestmark = pytest.mark.skipif(not (CORPUS / "labels.yaml").is_file(), reason=f"no corpus at {CORPUS}")


def _cases() -> list[dict]:
    if not (CORPUS / "labels.yaml").is_file():
        return []
    return list(yaml.safe_load((CORPUS / "labels.yaml").read_text(encoding="utf-8")))


CASES = _cases()


def case_log(case: dict) -> str:
    return (CORPUS / "cases" / f"{case['id']}.log").read_text(encoding="utf-8", errors="replace")


def diagnose_case(case: dict) -> Diagnosis:
    text = case_log(case)
    engine = case["engine"] if case["engine"] in ("sglang", "vllm") else None
    return diagnose(text.splitlines(), LogContext(engine=engine))


def assert_not_mistaken(category: str, d: Diagnosis) -> None:
    """A crash (labelled `category`) is never called healthy, a healthy log never a crash, and an
    unexplained failure shows its evidence."""
    if category == "healthy":
        assert d.category in NOT_A_CRASH, (d.category, d.evidence)
    else:
        assert d.category != "healthy", d
    if d.category in ("unknown", "other"):
        assert d.evidence, "an unexplained failure must show its evidence lines"


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_no_crash_is_called_healthy_and_no_healthy_log_a_crash(case: dict) -> None:
    assert_not_mistaken(case["category"], diagnose_case(case))


def test_category_accuracy_where_the_decisive_line_is_present() -> None:
    decisive = [c for c in CASES if c["decisive_line_present"]]
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    wrong = []
    for case in decisive:
        d = diagnose_case(case)
        total[case["category"]] += 1
        if d.category == case["category"]:
            right[case["category"]] += 1
        else:
            wrong.append(f"{case['id']}: {case['category']} -> {d.category} ({d.signature})")
    report = "\n".join(f"{k:28} {right[k]}/{total[k]}" for k in sorted(total))
    print(f"\ncorpus accuracy {sum(right.values())}/{len(decisive)}\n{report}")
    assert sum(right.values()) / len(decisive) >= 0.90, "\n".join(wrong)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c["category"] == "healthy" and c["decisive_line_present"]], ids=lambda c: c["id"]
)
def test_a_log_that_proves_serving_is_healthy(case: dict) -> None:
    assert diagnose_case(case).category == "healthy"


def test_a_startup_cut_before_the_ready_line_is_starting_not_healthy() -> None:
    lines = ["INFO 05-06 20:59:57 [default_loader.py:384] Loading weights took 24.84 seconds"]
    assert diagnose(lines).category == "starting"


def test_health_checks_alone_do_not_prove_serving() -> None:
    """vLLM answers /health while its workers are dead (corpus 124): only generation proves serving."""
    lines = ['INFO:     172.18.0.5:43002 - "GET /health HTTP/1.1" 200 OK'] * 5
    assert diagnose(lines).category == "starting"
