"""structlog, configured once: readable lines on a terminal, JSON lines otherwise (cron, files).

Events are past-tense nouns (`server_launched`, `crash_diagnosed`) with the host bound once.
Secrets never reach a log call: values pass through `fleet.secrets.redact` before they are logged.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import structlog


def configure(*, verbose: bool = False, json_file: Path | None = None) -> None:
    # events go to the log file when there is one; on a terminal only warnings (or everything with --debug)
    level = logging.DEBUG if verbose else (logging.INFO if json_file is not None else logging.WARNING)
    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json_file is not None:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        stream: Any = json_file.open("a", encoding="utf-8")
        renderer: Any = structlog.processors.JSONRenderer()
    else:
        stream = sys.stderr
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get(**context: Any) -> Any:
    return structlog.get_logger("fleet").bind(**context)
