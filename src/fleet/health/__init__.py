"""Health verdicts from one host's health probe, and the Prometheus text (checks). Pure.

This package exports what the rest of fleet uses; the modules say the rest.
"""

from fleet.health.checks import (
    CRITICAL,
    EXIT_CODE,
    OK,
    SEVERITY,
    UNKNOWN,
    WARNING,
    Check,
    HostHealth,
    after_heal,
    check_failed,
    evaluate,
    prometheus_text,
    step_failed,
    unreachable,
    worst,
)

__all__ = [
    "CRITICAL",
    "Check",
    "EXIT_CODE",
    "HostHealth",
    "OK",
    "SEVERITY",
    "UNKNOWN",
    "WARNING",
    "after_heal",
    "check_failed",
    "evaluate",
    "prometheus_text",
    "step_failed",
    "unreachable",
    "worst",
]
