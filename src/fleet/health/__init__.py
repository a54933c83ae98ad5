"""Health verdicts: the raw answer of one host's health probe → checks with Nagios-style statuses. Pure.

Also renders the Prometheus text format for node_exporter's textfile collector. The probe itself
(`fleet/control/remote_health.py`) runs on the host; the caller does I/O and healing.

The code is in checks; this package exports what the rest of fleet uses.
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
