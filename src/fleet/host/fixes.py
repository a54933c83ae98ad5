"""Runs ON the host (sent as `python -c`): forget learned fixes (`fleet fixes forget`). Prints
{"forgotten": [{key, signature, learned_at}, ...]}.

The host's learned fixes are one record shared by its deployments, merged by each deploy that learns one;
forgetting is a read-modify-write of it under the host's guard, as that merge is, so neither loses the
other's change. A match is exact: a signature id, and optionally the model path the key names.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, cast

try:  # the shared host code is prepended when this script is sent to a host
    write_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.records import LEARNED_FILE, host_guard, read_record, write_record
    from fleet.protocol import FixesRequest


def matches(key: str, entry: Any, a: FixesRequest) -> bool:
    if not isinstance(entry, dict) or entry.get("signature") == "engine-picks":  # not a fix: kept
        return False
    if a.get("signature") and entry.get("signature") != a["signature"]:
        return False
    parts = key.split("|")
    return not a.get("model") or (len(parts) > 1 and parts[1] == a["model"])


def main() -> Dict[str, Any]:
    a = cast("FixesRequest", json.loads(sys.argv[1]))
    root = os.path.expanduser(a["state_dir"])
    forgotten: List[Dict[str, Any]] = []
    if not os.path.isdir(root):
        return {"forgotten": forgotten}
    with host_guard(root):
        path = os.path.join(root, LEARNED_FILE)
        kept = (read_record(path) or {}).get("fixes")
        learned: Dict[str, Any] = kept if isinstance(kept, dict) else {}
        for key in sorted(learned):
            entries = learned[key] if isinstance(learned[key], list) else []
            gone = [e for e in entries if matches(key, e, a)]
            forgotten += [
                {"key": key, "signature": e.get("signature"), "learned_at": e.get("learned_at")} for e in gone
            ]
            if gone:
                learned[key] = [e for e in entries if e not in gone]
                if not learned[key]:
                    del learned[key]
        if forgotten:
            write_record(path, {"fixes": learned})
    return {"forgotten": forgotten}


if __name__ == "__main__":
    try:
        result = main()
    except Exception as exc:
        result = {"error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(result))
