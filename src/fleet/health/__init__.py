"""Health verdicts from one host's health probe (checks), and their Prometheus text (prometheus). Pure.

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
    step_failed,
    unreachable,
    worst,
)
from fleet.health.prometheus import prometheus_text

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
