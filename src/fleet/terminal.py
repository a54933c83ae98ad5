"""Text from a host made safe for the operator's terminal. Engine logs, process command lines and file
names are written by whoever runs on the host: an escape sequence in them could retitle the window
(OSC 0), write the clipboard (OSC 52), clear the screen or hide text. Pure."""

from __future__ import annotations

import re

# Whole sequences first (CSI, OSC, DCS/PM/APC strings, two-byte ESC sequences), so no remnant is shown;
# then any control character left, C1 included (U+009B is a CSI on some terminals). Tab and newline stay.
_SEQUENCES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI … final byte
    # OSC / DCS / SOS / PM / APC … BEL or ST; one left open ends at the line's end, never eats later lines
    r"|\x1b[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"  # two-byte and nF escape sequences
    r"|\x9b[0-?]*[ -/]*[@-~]|[\x90\x98\x9d-\x9f][^\x07\x9c\n]*(?:\x07|\x9c)?"  # the same, as C1 characters
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Invisible format characters: bidi overrides, embeddings and isolates (U+202E shows "gpj.exe" as
# "exe.jpg"), zero-width spaces and joiners, word joiners, a BOM. Shown as <U+XXXX>: visible, not obeyed.
_INVISIBLE = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]")


def safe_text(text: str) -> str:
    """`text` with every terminal control sequence and control character removed (tab and newline kept),
    and invisible format characters made visible."""
    text = _CONTROLS.sub("", _SEQUENCES.sub("", text))
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group()):04X}>", text)


def safe_line(text: str) -> str:
    """One line: also no newline, so a value cannot start a line that looks like fleet's own output."""
    return safe_text(text).replace("\n", "\\n").replace("\t", " ")


def duration(seconds: float) -> str:
    """Seconds as an operator reads them: 41s, 2m11s."""
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes}m{s:02d}s" if minutes else f"{s}s"


def size(n: float) -> str:
    """Bytes as a person reads them: 512 B, 1.5 KiB ... 3.2 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
