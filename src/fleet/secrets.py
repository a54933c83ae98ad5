"""Secrets (whatever a playbook lists in secret_env, e.g. HF_TOKEN): read from the operator's environment,
sent to the host on stdin only, and redacted from everything fleet prints, logs or records."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from typing import Any

from fleet.errors import ConfigError

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
    return out


def redact(text: str, secrets: dict[str, str]) -> str:
    for value in secrets.values():
        if len(value) >= 4:
            text = text.replace(value, REDACTED)
    return text


# A credential on someone's command line (`--api-key sk-...`, `--hf-token=...`, `OPENAI_API_KEY=sk-...`
# before the program in `sh -c`): another process fleet stops or reports may have been started that way,
# by hand. Its value is not fleet's to repeat. A flag's every value up to the next flag is masked (vLLM
# takes several API keys after one --api-key): masking a positional argument too is the safe mistake.
_CREDENTIAL_WORD = r"[\w.-]*(?:key|token(?!izer)|secret|passw(?:or)?d|credential)[\w.-]*"
_CREDENTIAL_FLAG = re.compile(rf"(--?{_CREDENTIAL_WORD})(=\S*(?:\s+(?!-)\S+)*|(?:\s+(?!-)\S+)+)", re.I)
_CREDENTIAL_ENV = re.compile(rf"(?<![\w-])({_CREDENTIAL_WORD})=\S+", re.I)


def mask_credentials(cmdline: str) -> str:
    """The command line with the values of credential-looking flags and environment assignments masked."""

    def flag(m: re.Match[str]) -> str:
        value = m.group(2)
        return m.group(1) + ("=" + REDACTED if value.startswith("=") else " " + REDACTED)

    masked = _CREDENTIAL_FLAG.sub(flag, cmdline)
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
