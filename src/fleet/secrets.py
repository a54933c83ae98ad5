"""Secrets (whatever a playbook lists in secret_env, e.g. HF_TOKEN): read from the operator's environment,
sent to the host on stdin only, and redacted from everything fleet prints, logs or records."""

from __future__ import annotations

import os
from collections.abc import Iterable

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
