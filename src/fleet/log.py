"""structlog, configured once: readable lines on a terminal, JSON lines otherwise (cron, files).

Events are past-tense nouns (`server_launched`, `crash_diagnosed`) with the host bound once.
Secrets never reach a log call: values pass through `fleet.secrets.redact` before they are logged.

structlog (and the rich tracebacks it pulls in) is imported on the first event that passes the level:
most runs on a terminal log nothing, and that import is ~0.1 s of every command's start-up (cron runs
`fleet health` every minute).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_settings: dict[str, Any] = {"level": logging.WARNING, "json_file": None, "configured": False}


def configure(*, verbose: bool = False, json_file: Path | None = None) -> None:
    # events go to the log file when there is one; on a terminal only warnings (or everything with --debug)
    level = logging.DEBUG if verbose else (logging.INFO if json_file is not None else logging.WARNING)
    opened = _settings.pop("opened", None)
    if opened is not None:  # the file of the configuration this one replaces
        opened.close()
    _settings.update(level=level, json_file=json_file, configured=False)
    # paramiko logs a failed handshake (a frozen host's missing banner) with a traceback; with no handler
    # Python would print it raw to stderr beside fleet's own message. fleet says what went wrong itself.
    paramiko_log = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in paramiko_log.handlers):
        paramiko_log.addHandler(logging.NullHandler())
    paramiko_log.propagate = verbose


def _configure_structlog() -> Any:
    import structlog

    if not _settings["configured"]:
        json_file: Path | None = _settings["json_file"]
        processors: list[Any] = [
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
        ]
        if json_file is not None:
            json_file.parent.mkdir(parents=True, exist_ok=True)
            stream: Any = json_file.open("a", encoding="utf-8")
            _settings["opened"] = stream
            renderer: Any = structlog.processors.JSONRenderer()
        else:
            stream = sys.stderr
            renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        structlog.configure(
            processors=[*processors, _hiding, renderer],
            wrapper_class=structlog.make_filtering_bound_logger(_settings["level"]),
            logger_factory=structlog.PrintLoggerFactory(stream),
            cache_logger_on_first_use=False,
        )
        _settings["configured"] = True
    return structlog


def _hiding(logger: Any, method: str, event: Any) -> Any:
    """An event with every secret this run read hidden from its values (it may quote a host's text)."""
    from fleet.secrets import hidden

    return hidden(event)


def _dropped(*args: Any, **kwargs: Any) -> None:
    return None


class _Logger:
    """A structlog bound logger, made on the first event at or above the configured level."""

    def __init__(self, context: Mapping[str, object]) -> None:
        self._context = context
        self._real: Any = None

    def __getattr__(self, method: str) -> Any:
        if _LEVELS.get(method, logging.CRITICAL) < _settings["level"]:
            return _dropped
        if self._real is None:
            self._real = _configure_structlog().get_logger("fleet").bind(**self._context)
        return getattr(self._real, method)


def get(**context: Any) -> Any:
    return _Logger(context)
