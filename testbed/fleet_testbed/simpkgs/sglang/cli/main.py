"""`sglang serve ...` console script of a simulated host."""

import sys

from fleet_testbed.sglang_sim import main as _serve


def main():
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        print("usage: sglang serve [options]", file=sys.stderr)
        sys.exit(2)
    _serve(sys.argv[2:])
