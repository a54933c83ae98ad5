"""Secrets (whatever a playbook lists in secret_env, e.g. HF_TOKEN): read from the operator's environment,
sent to the host on stdin only, and redacted from everything fleet prints, logs or records."""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fleet.errors import ConfigError
from fleet.protocol import CUT_NOTE

REDACTED = "***"


def read_secrets(names: Iterable[str], playbook: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(
                f"{playbook}: secret_env lists {name}, which is not set in your environment.",
                f"export {name}=... before running fleet (it is sent to the host on stdin, never in argv).",
            )
        out[name] = value
    remember(out)
    return out


# Every secret value this process has read (read_secrets, and the CLI's for every playbook): where fleet
# prints, logs or answers in JSON, text passes through `hide`, so a path that quoted host text without
# redacting it (an error with a step's output, a check's exception) still shows none.
_known: dict[str, str] = {}
_known_lock = threading.Lock()


def remember(secrets: Mapping[str, str]) -> None:
    global _known
    with _known_lock:  # replaced whole, never changed in place: `hide` reads it from any thread
        _known = {**_known, **{value: value for value in secrets.values()}}


def forget_all() -> None:
    """For tests: a process that read no secret."""
    global _known
    with _known_lock:
        _known = {}


# Credentials whose shape says what they are (Hugging Face, OpenAI-style `sk-`, GitHub): hidden also when
# this process never read them, as `fleet logs` from a shell without the deployment's secrets, where an
# engine or a client echoed one. Any other secret is hidden only by its value, once a run read it.
TOKEN_SHAPES = re.compile(
    r"(?<![\w-])(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9][A-Za-z0-9_-]{19,}|gh[pousr]_[A-Za-z0-9]{36,}|"
    r"github_pat_[A-Za-z0-9_]{40,})"
)


# An engine's dump of its own arguments names its API key: SGLang logs `ServerArgs(... api_key='...')`
# (before 0.5.2x) and `server_args={... 'api_key': '...'}` (0.5.23), read by any shell without the key.
NAMED_KEYS = re.compile(r"""(\b(?:admin_)?api_key(?:=|['"]:\s*))(['"])(?!None['"])[^'"\\]+\2""")
# vLLM takes several keys: its `args: Namespace(... api_key=['k1', 'k2'])` and `'api_key': [...]` list them
NAMED_KEY_LISTS = re.compile(r"""(\b(?:admin_)?api_key(?:=|['"]:\s*))\[([^\]\n]*)\]""")
_QUOTED = re.compile(r"""(['"])[^'"\\]*\1""")


def hide(text: str) -> str:
    """`text` with every secret this process has read redacted (`redact`), every credential whose shape
    names it (TOKEN_SHAPES), and an API key an engine's own dump of its arguments names (NAMED_KEYS)."""
    known = _known
    text = redact(text, known) if known else text
    if "api_key" in text:
        text = NAMED_KEYS.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}{m.group(2)}", text)
        text = NAMED_KEY_LISTS.sub(lambda m: f"{m.group(1)}[{_QUOTED.sub(_masked, m.group(2))}]", text)
    return TOKEN_SHAPES.sub(REDACTED, text) if "_" in text or "sk-" in text else text


def _masked(quoted: re.Match[str]) -> str:
    return f"{quoted.group(1)}{REDACTED}{quoted.group(1)}"


def hidden(data: Any) -> Any:
    """A value about to be written as JSON with `hide` applied to each of its strings (keys too), not to
    the JSON text: a secret that reads like a number or `true` would leave that text no JSON. Values
    JSON cannot hold become their str(), as `json.dumps(default=str)` makes them."""
    if isinstance(data, str):  # (token shapes too when no secret was read: cron's runs read none)
        return hide(data)
    if isinstance(data, dict):
        return {hidden(k) if isinstance(k, str) else k: hidden(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [hidden(v) for v in data]
    if data is None or isinstance(data, (bool, int, float)):
        return data
    return hide(str(data))


# What may sit between a secret's characters and still show it: a terminal control sequence (colour, an
# OSC title, a lone ESC or C1 control) or an invisible character. A terminal shows `hf_SE\x1b[0mCRET` as
# the secret, and fleet strips such sequences before printing, so they cannot hide it from redaction.
# Atomic and possessive: a run of ESCs has one way to match, never 2**n (it took seconds at 24).
_GAP = (
    r"(?>\x1b\[[0-9;?]*+[ -/]*+[@-~]|\x1b\][^\x07\x1b]*+(?:\x07|\x1b\\)?|\^\[\[[0-9;]*+m|"
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff])*+"
)


def _percent(ch: str) -> str:
    """`ch` percent-encoded, as a pattern: each UTF-8 byte as %XX in either case of hex."""
    return "".join("%" + "".join(f"[{h.upper()}{h.lower()}]" for h in f"{b:02x}") for b in ch.encode("utf-8"))


@functools.lru_cache(maxsize=256)
def _secret_pattern(value: str) -> re.Pattern[str]:
    """The secret in any spelling it reaches text in: as is, with controls or invisible characters between
    its characters, and percent-encoded (a URL, a form body; + for a space)."""
    pieces = []
    for ch in value:
        forms = [re.escape(ch), _percent(ch), *([r"\+"] if ch == " " else [])]
        pieces.append("(?:" + "|".join(forms) + ")")
    return re.compile(_GAP.join(pieces))


# Where the host cut a long line (fleet.host.follow): a secret may straddle the cut, its head shown.
_CUT = re.compile(re.escape(CUT_NOTE).replace("%d", r"\d+"))
_CUT_TAIL = CUT_NOTE.split("%d")[1]  # a plain substring: most lines are not cut, and skip the pattern


@functools.lru_cache(maxsize=256)
def _spellings(value: str) -> tuple[str, ...]:
    """The secret as it is, and as JSON and Python's repr quote it (a quote, a backslash or a control
    character escaped): an error that quotes a request, a header or a bytes value shows it so."""
    quoted = (json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1])
    return tuple(dict.fromkeys((value, *quoted)))


def redact(text: str, secrets: Mapping[str, str]) -> str:
    for value in secrets.values():
        if len(value) >= 4:
            for spelling in _spellings(value):
                text = text.replace(spelling, REDACTED)
            if any(c in text for c in "\x1b%+^\u200b\u200c\u200d\u2060\ufeff") or not text.isascii():
                text = _secret_pattern(value).sub(REDACTED, text)
    return _redact_cut_heads(text, secrets) if secrets and _CUT_TAIL in text else text


def _redact_cut_heads(text: str, secrets: Mapping[str, str]) -> str:
    """The head of a secret (4 characters or more) just before a line's cut mark goes too."""
    for cut in reversed(list(_CUT.finditer(text))):
        head = text[: cut.start()]
        for value in secrets.values():
            shown = next((k for k in range(len(value) - 1, 3, -1) if head.endswith(value[:k])), 0)
            if shown:
                head = head[:-shown] + REDACTED
        text = head + text[cut.start() :]
    return text


# A credential on someone's command line (`--api-key sk-...`, `--hf-token=...`, `OPENAI_API_KEY=sk-...`
# before the program in `sh -c`): another process fleet stops or reports may have been started that way,
# by hand. Its value is not fleet's to repeat. A flag's every value up to the next flag is masked (vLLM
# takes several API keys after one --api-key): masking a positional argument too is the safe mistake.
# The families, not the spellings: key, token, secret, password/passwd/passphrase/pass/pw, credential,
# auth/authorization/basic-auth (a word or a part of one: --hf-token, --auth, --basic-auth, --pw).
_CREDENTIAL_KEYWORD = (
    r"(?:key|token(?!izer|s)|secret|passw(?:or)?d|passphrase|credential|auth(?!or(?!i))|"
    r"(?<![a-z])pass(?![a-z])|(?<![a-z])pw(?![a-z]))"
)
# A name that holds one, tried from a word's start only and never given back (possessive): a long
# hostile word on a process's command line (a.a.a…) costs its length to read, not its square.
_CREDENTIAL_NAME = rf"(?=[\w.-]*?{_CREDENTIAL_KEYWORD})[\w.-]++"
_WORD_START = r"(?<![\w.-])"
_CREDENTIAL_FLAG = re.compile(rf"{_WORD_START}(--?{_CREDENTIAL_NAME})(=\S*(?:\s+(?!-)\S+)*|(?:\s+(?!-)\S+)+)", re.I)
_CREDENTIAL_ENV = re.compile(rf"{_WORD_START}({_CREDENTIAL_NAME})=\S+", re.I)
# An HTTP header given on a command line whose name is of the same families (curl -H 'Authorization:
# Bearer sk-...', -H 'X-Api-Key: ...'), and a URL's user information: a password, or a token given as
# the user (https://TOKEN@github.com/...).
_CREDENTIAL_HEADER = re.compile(
    rf"({_WORD_START}(?:{_CREDENTIAL_NAME}|cookie):\s*(?:(?:bearer|basic|token)\s+)?)[^\s']+", re.I
)
_URL_USERINFO = re.compile(r"((?<!\w)\w+://)(?:([^/\s:@]+):)?[^@\s/]+@")


def mask_credentials(cmdline: str) -> str:
    """The command line with the values of credential-looking flags and environment assignments masked."""

    def flag(m: re.Match[str]) -> str:
        value = m.group(2)
        return m.group(1) + ("=" + REDACTED if value.startswith("=") else " " + REDACTED)

    masked = _CREDENTIAL_HEADER.sub(lambda m: m.group(1) + REDACTED, cmdline)
    masked = _URL_USERINFO.sub(lambda m: m.group(1) + (m.group(2) + ":" if m.group(2) else "") + REDACTED + "@", masked)
    masked = _CREDENTIAL_FLAG.sub(flag, masked)
    return _CREDENTIAL_ENV.sub(lambda m: m.group(1) + "=" + REDACTED, masked)


def shown_processes(processes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Process records from a host step as fleet shows them: credentials on command lines masked."""
    out = []
    for p in processes:
        p = dict(p)
        if isinstance(p.get("cmdline"), str):
            p["cmdline"] = mask_credentials(p["cmdline"])
        p.pop("argv", None)  # the masked command line says it; argv would repeat it unmasked
        out.append(p)
    return out


class LineFilter:
    """Streamed bytes → whole lines, each passed through `show` (redaction, terminal safety) before it is
    printed. Lines are kept whole so a secret split across two chunks is still found."""

    def __init__(self, show: Callable[[str], str]) -> None:
        self.show = show
        self.pending = b""

    def feed(self, chunk: bytes) -> str:
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        self.pending = data[cut:]
        if len(self.pending) > 1 << 20:  # a line without an end: shown in pieces rather than held forever
            cut, self.pending = len(data), b""
        return self.show(data[:cut].decode("utf-8", "replace")) if cut else ""

    def close(self) -> str:
        rest, self.pending = self.pending, b""
        return self.show(rest.decode("utf-8", "replace")) if rest else ""
