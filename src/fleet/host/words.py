"""The words fleet and its host steps share at run time: the status words, the state record's version,
the secret's placeholder, the note for a cut line, what a deployment's name may be and where a log's lines
end. Shipped first with every host step (standard library only, Python 3.8); fleet.protocol, the typed
shapes of every request, answer and record, is for type checking only and never leaves this machine."""

import re

try:
    from typing import Final
except ImportError:  # pragma: no cover - Python 3.7 hosts: the types are documentation there
    from typing import Any as Final  # type: ignore

# The state record's version. 2 adds the deployment's name and GPUs; 1 (state_dir/state.json, one server
# per host) is read as the deployment its playbook names, on all GPUs. Every field is read with a default.
STATE_SCHEMA = 2
# An argv word the launcher on the host replaces with a secret's value (SECRET_WORD + NAME: the variable
# NAME fleet sent on stdin): plans, records and outputs hold the word, only the engine gets the value.
SECRET_WORD = "fleet-secret:"
# What a host step writes in place of the rest of a log line it cut (LINE_LIMIT, fleet.host.follow):
# fleet's redaction looks for it too, since a secret may have been cut in two there (fleet.secrets).
CUT_NOTE = " [fleet: %d more bytes of this line not shown]"
# A deployment's name: a directory on the host (state_dir/deployments/NAME). \Z: "$" also matches before "\n".
DEPLOYMENT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


# A deployment's status (StateRecord.status; its transitions: fleet.host.records), spelled here only. The act
# step writes STARTING as it launches; the watcher READY once the server answered its smoke check; a run
# gone between the two UNVERIFIED; a stop STOPPED; a failed start FAILED. DEAD, never written: a live one, gone.
STARTING: Final = "starting"
READY: Final = "ready"
UNVERIFIED: Final = "unverified"
FAILED: Final = "failed"
STOPPED: Final = "stopped"
DEAD: Final = "dead"
LIVE = (STARTING, READY, UNVERIFIED)  # a server is expected behind the record
# How an attempt ended (a start-up's history, the timeline): READY, or the engine exited (CRASHED), or ...
CRASHED: Final = "crashed"


def log_lines(text: str) -> "list[str]":
    """A log's lines as fleet's watch reads them: split at a newline alone (a bare CR, a progress bar's
    redraw, counts as one). str.splitlines also splits at VT, FF, FS, GS, RS, NEL and U+2028/U+2029, which
    a client's text echoed into the log may hold: the piece after one would read as a line the engine
    wrote (a crash, and its fix)."""
    parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return parts[:-1] if parts[-1] == "" else parts
