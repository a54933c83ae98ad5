"""Runs ON the host (sent as `python -c`): may `fleet health --heal` restart a deployment now? Prints
{"allowed": bool, "recent": n} and records the heal only when allowed.

Decided and recorded here, by the host's clock and with the engine's Python: a limit computed from host
stamps and the client's clock (2 h apart, say), or a record written by a `python3` the host lacks, was
never applied. When the record cannot be written, the step fails and nothing is healed.
"""

from __future__ import annotations

import json
import os
import sys
import time

try:  # the shared host code is prepended when this script is sent to a host
    write_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.records import HEALS_FILE, deployment_dir, host_guard, migrate_legacy, read_record, write_record
    from fleet.protocol import HealDecision


def main() -> HealDecision:
    a = json.loads(sys.argv[1])
    root = os.path.expanduser(a["state_dir"])
    os.makedirs(root, mode=0o700, exist_ok=True)
    # under the host's guard, as the act step takes it: two heals at the same instant count each other
    with host_guard(root):
        migrate_legacy(root)  # an older fleet's record first, so its deployment's heals go beside it
        state_dir = deployment_dir(a["state_dir"], a["deployment"])  # each deployment has its own limit
        path = os.path.join(state_dir, HEALS_FILE)
        existed = os.path.lexists(path)
        record = read_record(path)
        kept = (record or {}).get("times")
        heals = [x for x in kept if isinstance(x, (int, float))] if isinstance(kept, list) else []
        now = time.time()
        if existed and record is None:  # unreadable (set aside): the count is unknown, so it counts as full
            heals = [now] * int(a["limit"])
            os.makedirs(state_dir, exist_ok=True)
            write_record(path, {"times": heals})
        # A stamp after now means the clock was stepped back since: it is counted as a heal just made (it
        # was dropped, and 6 heals ran in 30 s against a limit of 3 an hour), and written back as now.
        heals = [min(x, now) for x in heals if x > now - 86400]
        recent = len([x for x in heals if x > now - 3600])
        allowed = recent < a["limit"]
        if allowed:
            os.makedirs(state_dir, exist_ok=True)
            write_record(path, {"times": heals + [now]})
    return {"allowed": allowed, "recent": recent}


if __name__ == "__main__":
    try:
        sys.stdout.write(json.dumps(main()))
    except Exception as exc:  # said in one line (a full disk, a record of a newer fleet's): nothing is healed
        sys.stdout.write(json.dumps({"error": ("%s: %s" % (type(exc).__name__, exc))[:200]}))
