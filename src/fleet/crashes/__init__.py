"""Crash knowledge base: signatures (data) + `diagnose(log) -> Diagnosis` + `decide(...) -> next action`.

Pure: no clocks, no I/O beyond reading the packaged YAML once. `healthy` needs positive evidence (a
ready line or answered generation requests) and no failure; a log with neither is `starting`; a log
with a failure that no signature explains is `unknown`, with its evidence lines. Signatures are tried
in order (the root cause before its symptoms), on normalised lines (`logtext`). The relaunch policy
decides first and the deploy loop acts (tenacity-style): a fix is applied at most once, the same
signature after its fix gives up, an unknown failure gives up at once, and attempts are bounded.

The code is in classify, logtext, signatures; this package exports what the rest of fleet uses.
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
