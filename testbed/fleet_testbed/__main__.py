"""`python -m fleet_testbed up|down|status [--root DIR] [--extra N]`: the local simulated fleet.

`up` brings up `blackwell` (8x RTX PRO 6000, SM120, SGLang 0.5.11) and `ct129` (2x RTX A6000, SM86)
on 127.0.0.2/127.0.0.3:2222, plus N scale-test hosts on 127.0.1.x, each behind a real sshd.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from fleet_testbed import simhost

DEFAULT_ROOT = Path(os.environ.get("FLEET_SANDBOX", "/tmp/fleet-sandbox"))


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed")
    ap.add_argument("action", choices=["up", "down", "status"])
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    ap.add_argument("--extra", type=int, default=0, help="scale-test hosts to add (127.0.1.x)")
    ap.add_argument("--port", type=int, default=2222)
    a = ap.parse_args()
    if a.action == "up":
        specs = [simhost.BLACKWELL, simhost.CT129, *(simhost.extra_host(i) for i in range(1, a.extra + 1))]
        sb = simhost.up(a.root, specs, a.port)
        print(f"simulated fleet up: {', '.join(s.name for s in specs)} (inventory {sb.inventory})")
        for k, v in sb.env().items():
            print(f"export {k}={v}")
        return 0
    if a.action == "down":
        simhost.down(a.root)
        print("simulated fleet down")
        return 0
    state = a.root / "sandbox.json"
    print(state.read_text() if state.exists() else json.dumps({"hosts": []}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
