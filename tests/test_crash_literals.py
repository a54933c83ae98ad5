"""The words a signature's pattern cannot match without (fleet.crashes.literals): a long log is scanned
only by the signatures whose words are in it. The words must be certain -- a word a match could lack
would hide a crash -- so they are held to every builtin pattern over the corpus and the tests' texts, and
the diagnosis of every corpus log is the same with and without them."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest

from fleet.crashes import LogContext, classify, diagnose, literals as literals_module, logtext
from fleet.crashes.classify import _one_pass, _Searchable
from fleet.crashes.literals import Text, needs
from fleet.crashes.logtext import normalize_log
from fleet.crashes.signatures import builtin_signatures
from test_corpus import CASES, CORPUS, case_log, diagnose_case


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        (r"CUDA out of memory", {("CUDA out of memory", False)}),
        (r"^Segmentation fault\b", {("Segmentation fault", False)}),
        (
            r"(?:no kernel image|cudaErrorNoKernelImage)",
            {("no kernel image", False), ("cudaErrorNoKernelImage", False)},
        ),
        (r"port \d+ is (?:in use|taken)", {("port ", False)}),  # as long as the alternation's, and one word
        (r"Address already in use|EADDRINUSE", {("Address already in use", False), ("EADDRINUSE", False)}),
        (r"(?i:timed out waiting for) \w+", {("timed out waiting for", True)}),
        (r"(?i)NCCL error", {("nccl error", True)}),
        (r"(?:ab)+cdefg", {("cdefg", False)}),
        (r"\d+(?:abcdef)?\s", None),  # the only word is optional
        (r"(?:abc|)def", {("def", False)}),  # an empty alternative: the alternation is no word
        (r"(?:abc|\d+)", None),
        (r"(?=abc)\w+", None),  # a lookahead is not relied on
        (r"(?i:café) crash", {(" crash", False)}),  # a non-ASCII word without its case: not relied on
        (r"Killed\s*$", {("Killed", False)}),
        (r"\[Errno 98\]", {("[Errno 98]", False)}),
    ],
)
def test_the_words_a_pattern_needs_are_read_from_its_syntax(pattern: str, words: set | None) -> None:
    need = needs(re.compile(pattern))
    assert (set(need) if need is not None else None) == words


def test_a_case_insensitive_word_is_found_in_any_case() -> None:
    need = needs(re.compile(r"(?i)nccl error|timed out waiting"))
    assert need is not None
    for text in ("NCCL ERROR: x", "Timed Out Waiting for", "TIMED OUT WA\u0130TING", "timed out wa\u0131ting"):
        assert re.search(r"(?i)nccl error|timed out waiting", text)
        assert any(Text(text).holds(w, caseless) for w, caseless in need), text


def test_every_letter_re_takes_for_an_ascii_one_is_folded_to_it() -> None:
    """Under IGNORECASE `re` takes a few other letters for ASCII ones (the dotted and dotless i, the
    kelvin sign, the long s): the folded text must hold the ASCII letter there, or a word would be missed
    where its pattern matched."""
    for letter in string.ascii_lowercase:
        same = re.compile(f"(?i){letter}")
        for other in map(chr, range(0x10000)):
            if same.fullmatch(other):
                assert Text(other).holds(letter, True), (letter, hex(ord(other)))


def _texts() -> list[str]:
    """Every window of every corpus log, and every string the classifier's tests give it."""
    texts: list[str] = []
    for case in CASES:
        texts += list(normalize_log(case_log(case).splitlines()).windows)
    source = (Path(__file__).parent / "test_crashes.py").read_text(encoding="utf-8")
    texts += [m.group(1) for m in re.finditer(r'"((?:[^"\\\n]|\\.){12,})"', source)]
    return texts


# what each line is searched for before any signature: a failure, a retry, a ready or serving line
LINE_PATTERNS = {
    "BENIGN": logtext.BENIGN,
    "FATAL": logtext.FATAL,
    "TRACEBACK_HEAD": logtext.TRACEBACK_HEAD,
    "TRANSIENT": logtext.TRANSIENT,
    "RETRY_TAIL": logtext._RETRY_TAIL,
    "ACCEPTING": classify.ACCEPTING,
    "SERVING": logtext.SERVING,
    **{f"READY_PATTERNS[{i}]": p for i, p in enumerate(classify.READY_PATTERNS)},
}


def test_every_text_a_builtin_pattern_matches_holds_one_of_its_words() -> None:
    texts = _texts()
    assert len(texts) > 1500
    patterns = [(sig.id, p) for sig in builtin_signatures() for p in _one_pass(tuple(sig.patterns))]
    matched = 0
    for name, pattern in [*patterns, *LINE_PATTERNS.items()]:
        need = needs(pattern)
        assert need is not None, f"{name}: no word its pattern needs: every log is scanned by it"
        for text in texts:
            if pattern.search(text):
                matched += 1
                assert any(Text(text).holds(w, caseless) for w, caseless in need), (name, sorted(need), text[:200])
    assert matched > 400  # the corpus exercises the patterns, not only their absence


@pytest.mark.skipif(not CASES, reason=f"no corpus at {CORPUS}")
def test_the_words_change_no_diagnosis_of_the_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(literals_module, "PREFILTER_FROM_CHARS", 0)  # every log, however short
    with_words = [diagnose_case(case) for case in CASES]
    monkeypatch.setattr(literals_module, "PREFILTER_FROM_CHARS", 1 << 62)  # no log: every pattern on every line
    without = [diagnose_case(case) for case in CASES]
    assert with_words == without


def test_a_long_log_is_scanned_only_by_the_signatures_whose_words_are_in_it() -> None:
    """2,000 lines of NCCL's set-up and an out-of-memory line: the architecture, driver and port
    signatures' words are not there, so their patterns never scan it (that scan was ~0.1 s each)."""
    lines = [f"[2026-12-06 10:00:00 TP{i % 8}] node1:12:{i}:56 [{i % 8}] NCCL INFO Channel {i % 32:02d}/0 : via P2P"
             for i in range(2000)]  # fmt: skip
    lines.append("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    search = _Searchable(normalize_log(lines))
    by_id = {sig.id: sig for sig in builtin_signatures()}
    assert len(search.text) >= literals_module.PREFILTER_FROM_CHARS
    for quiet in ("gpu-arch-unsupported", "driver-mismatch", "port-in-use-family"):
        assert not any(search.may_match(p) for p in _one_pass(tuple(by_id[quiet].patterns))), quiet
    assert diagnose(lines, LogContext(engine="sglang")).signature == "cuda-oom-startup"
