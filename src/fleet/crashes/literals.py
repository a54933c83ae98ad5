"""The words a pattern cannot match without, so that a long log is scanned only by the patterns whose
words are in it, and each line only by those whose words are in the line: a substring search (C speed)
rather than a regex pass. Python's `re` tries every alternative of an alternation at every position of
the text; over a log of 2,000 NCCL lines that was ~0.1 s a signature and seconds a diagnosis, and a
crash's relaunch waited for it.

`needs(pattern)` reads the pattern's syntax tree: one of the strings it returns is in every text the
pattern matches. Where the tree says nothing certain (a lookahead, a back-reference, an optional part)
the answer is None, and the pattern is always run."""

from __future__ import annotations

import importlib
import re
from functools import lru_cache
from typing import Any

# the parser `re` compiles with (no stubs: it is CPython's own, stable across 3.11-3.13)
parser: Any = importlib.import_module("re._parser")
c: Any = importlib.import_module("re._constants")

# Below this much text every pattern's regex pass together costs less than reading the patterns' syntax
# trees for their words, once per process (~25 ms): a short log is scanned as it is.
PREFILTER_FROM_CHARS = 32 << 10

# (text, case-insensitive): any one of them is in every match
Need = frozenset[tuple[str, bool]]

_REPEATS = (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT)


@lru_cache(maxsize=1024)
def needs(pattern: re.Pattern[str]) -> Need | None:
    """Strings one of which every match of `pattern` contains; None when no such string is known."""
    try:
        tree = parser.parse(pattern.pattern, pattern.flags)
    except (re.error, RecursionError):
        return None
    return _sequence(list(tree), bool(pattern.flags & re.IGNORECASE))


def fold(text: str) -> str:
    """The text as case-insensitive words are looked for in it: casefolded, after the two letters `re`
    takes for an i under IGNORECASE that casefold does not make one (İ becomes i and a combining dot,
    ı stays ı) are made an i. (The K of kelvins and the long ſ, the other two, casefold to k and s.)"""
    return text.replace("\u0130", "i").replace("\u0131", "i").casefold()


class Text:
    """A long text words are looked for in: each word once (patterns share words), its folded form made
    once, when a caseless word is looked for."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._folded: str | None = None
        self._held: dict[tuple[str, bool], bool] = {}

    def holds(self, word: str, caseless: bool) -> bool:
        held = self._held.get((word, caseless))
        if held is None:
            held = self._held[word, caseless] = word in (self.folded() if caseless else self.text)
        return held

    def folded(self) -> str:
        if self._folded is None:
            self._folded = fold(self.text)
        return self._folded


def _sequence(items: list[tuple[Any, Any]], caseless: bool) -> Need | None:
    """Every item of a sequence is in every match: the best word any one of them gives."""
    best: Need | None = None
    run: list[str] = []
    for op, av in items:
        if op is c.LITERAL:
            run.append(chr(av))
            continue
        best = _better(best, _word("".join(run), caseless))
        run = []
        best = _better(best, _item(op, av, caseless))
    return _better(best, _word("".join(run), caseless))


def _item(op: Any, av: Any, caseless: bool) -> Need | None:
    if op is c.SUBPATTERN:
        _, add, remove, sub = av
        inner = (caseless or bool(add & re.IGNORECASE)) and not remove & re.IGNORECASE
        return _sequence(list(sub), inner)
    if op is c.ATOMIC_GROUP:
        return _sequence(list(av), caseless)
    if op is c.BRANCH:
        either: set[tuple[str, bool]] = set()
        for branch in av[1]:
            need = _sequence(list(branch), caseless)
            if need is None:  # a branch without a certain word: the alternation has none
                return None
            either |= need
        return frozenset(either)
    if op in _REPEATS:
        low, _, sub = av
        return _sequence(list(sub), caseless) if low >= 1 else None
    return None  # a class, any character, an anchor, a lookaround, a back-reference: no word


def _word(text: str, caseless: bool) -> Need | None:
    if not text:
        return None
    if caseless:
        if not text.isascii():  # non-ASCII case equivalences are not all casefold's: not relied on
            return None
        return frozenset({(fold(text), True)})
    return frozenset({(text, False)})


def _better(a: Need | None, b: Need | None) -> Need | None:
    """The more selective of two needs: the one whose shortest word is longer (fewer alternatives on a tie)."""
    if a is None or b is None:
        return a if b is None else b
    key_a = (min(len(w) for w, _ in a), -len(a))
    key_b = (min(len(w) for w, _ in b), -len(b))
    return a if key_a >= key_b else b


class Prefiltered:
    """`pattern` over the lines of one text (`whole`: all of them, joined), run only on a line that holds
    one of the words it needs and that the text holds at all: over a log where none of them is, no line
    is searched. Without `whole` (a short text), every line is searched."""

    def __init__(self, pattern: re.Pattern[str], whole: Text | None) -> None:
        self.pattern = pattern
        need = needs(pattern) if whole is not None else None
        # the needed words the text holds (None: every line is searched)
        self.words = None if need is None or whole is None else [(w, ci) for w, ci in need if whole.holds(w, ci)]
        self._caseless = any(caseless for _, caseless in self.words or ())  # a line is folded only then

    @property
    def may_match(self) -> bool:
        """Whether the pattern can match anywhere in the text."""
        return self.words is None or bool(self.words)

    def _may(self, line: str) -> bool:
        if self.words is None:
            return True
        folded = fold(line) if self._caseless else ""
        return any(w in (folded if caseless else line) for w, caseless in self.words)

    def search(self, line: str) -> re.Match[str] | None:
        return self.pattern.search(line) if self._may(line) else None

    def match(self, line: str) -> re.Match[str] | None:
        return self.pattern.match(line) if self._may(line) else None
