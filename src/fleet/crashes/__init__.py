"""Crash knowledge base: `diagnose(log) -> Diagnosis` and `decide(...) -> next action` (classify),
on normalised log text (logtext) with signatures as data (signatures). Pure.

This package exports what the rest of fleet uses; the modules say the rest.
"""

from fleet.crashes.classify import Diagnosis, GiveUp, LogContext, Relaunch, decide, diagnose, traceback_of
from fleet.crashes.logtext import normalize
from fleet.crashes.signatures import Signature, builtin_signatures, known_fixes, load_signatures, parse_signatures

__all__ = [
    "Diagnosis",
    "GiveUp",
    "LogContext",
    "Relaunch",
    "Signature",
    "builtin_signatures",
    "decide",
    "diagnose",
    "known_fixes",
    "load_signatures",
    "normalize",
    "parse_signatures",
    "traceback_of",
]
