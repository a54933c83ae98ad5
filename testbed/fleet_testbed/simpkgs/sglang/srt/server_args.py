"""Stand-in for `sglang.srt.server_args`: `prepare_server_args` parses and resolves like the real one
(argparse errors exit 2; ValueError/AssertionError as the real version raises them)."""

import sys

from fleet_testbed.sglang_sim import SimError
from fleet_testbed.sglang_sim import prepare_server_args as _prepare


def prepare_server_args(argv):
    try:
        return _prepare(argv)
    except SimError as err:
        sys.stderr.write(err.traceback_text([]) + "\n")
        raise SystemExit(1) from None
