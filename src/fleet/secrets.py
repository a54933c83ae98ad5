"""Secrets (HF_TOKEN and whatever a playbook lists in secret_env): read from the operator's environment,
sent to the host on stdin only, and redacted from everything fleet prints, logs or records."""

from __future__ import annotations

import os
from collections.abc import Iterable

from fleet.errors import ConfigError

REDACTED = "***"
ALWAYS_SECRET = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


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


def known_secret_values(secrets: dict[str, str]) -> dict[str, str]:
    """The playbook's secrets plus well-known tokens in fleet's own environment: all redacted on output."""
    return {**{n: os.environ[n] for n in ALWAYS_SECRET if n in os.environ}, **secrets}


def redact(text: str, secrets: dict[str, str]) -> str:
    for value in secrets.values():
        if len(value) >= 4:
            text = text.replace(value, REDACTED)
    return text
