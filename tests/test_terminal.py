"""Remote text reaches the operator's terminal without its control sequences."""

from __future__ import annotations

import pytest

from fleet.terminal import safe_line, safe_text

HOSTILE = [
    ("\x1b]0;owned\x07title", "title"),  # OSC 0: window title
    ("\x1b]52;c;ZWNobyBoaQ==\x07paste", "paste"),  # OSC 52: clipboard write
    ("\x1b[2Jclear", "clear"),  # erase the screen
    ("\x1b[8mhidden\x1b[28m", "hidden"),  # conceal
    ("red\x1b[31m!\x1b[0m", "red!"),
    ("\x9b2Jc1", "c1"),  # CSI as a C1 character
    ("bell\x07", "bell"),
    ("over\rwrite", "overwrite"),
    ("\x1bPdcs\x1b\\x", "x"),  # device control string
    ("half\x1b", "half"),  # a sequence cut at a chunk boundary leaves no ESC behind
    ("\x1b]0;never ended\nTraceback shown", "\nTraceback shown"),  # an open OSC ends at the line's end
    ("\x9d0;c1 title never ended\nnext", "\nnext"),  # the same as a C1 OSC
    ("\x98sos\x9cx", "x"),  # a C1 start-of-string
    ("gpj\u202eexe.doc", "gpj<U+202E>exe.doc"),  # a bidi override: shown, not obeyed
    ("sk\u200b-123", "sk<U+200B>-123"),  # a zero-width space
    ("a\u2066b\u2069", "a<U+2066>b<U+2069>"),  # bidi isolates
]


@pytest.mark.parametrize(("raw", "shown"), HOSTILE, ids=[repr(r)[:20] for r, _ in HOSTILE])
def test_control_sequences_never_reach_the_terminal(raw: str, shown: str) -> None:
    assert safe_text(raw) == shown


def test_tabs_and_newlines_survive_safe_text_but_not_safe_line() -> None:
    assert safe_text("a\tb\nc") == "a\tb\nc"
    assert safe_line("a\tb\nc") == "a b\\nc"


def test_plain_unicode_is_kept() -> None:
    assert safe_text("Loading 100%|██████████| 9/9 — ok") == "Loading 100%|██████████| 9/9 — ok"
