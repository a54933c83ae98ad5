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


# A credential on someone's command line (`--api-key sk-...`, `--hf-token=...`): another process fleet
# stops or reports may have been started that way, by hand. Its value is not fleet's to repeat.
_CREDENTIAL_FLAG = re.compile(r"(--?[\w.-]*(?:key|token|secret|passw(?:or)?d)[\w.-]*)(=|\s+)(?!-)(\S+)", re.I)


def mask_credentials(cmdline: str) -> str:
    """The command line with the values of credential-looking flags masked."""
    return _CREDENTIAL_FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", cmdline)


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
