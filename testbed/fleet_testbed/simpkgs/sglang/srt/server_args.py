"""Stand-in for `sglang.srt.server_args`. `prepare_server_args` parses like the real one (argparse errors
exit 2); up to 0.5.19 it also resolves, as 0.5.11's dataclass `__post_init__` does, while from the
arg_groups restructure (0.5.23) it only parses and `ServerArgs.resolve_once()` resolves (engines.md
§7.2-7.3). Resolution errors are ValueError/AssertionError as the real version raises them."""

import sys

from fleet_testbed import sglang_sim
from fleet_testbed.sglang_flags import NEW_CHOICE_LISTS


def _or_exit(call, argv):
    try:
        return call(argv)
    except sglang_sim.SimError as err:
        sys.stderr.write(err.traceback_text([]) + "\n")
        raise SystemExit(1) from None


class ServerArgs:
    """0.5.23's record: parsed; resolved only by `resolve_once()`."""

    def __init__(self, argv, parsed):
        self._argv = list(argv)
        self._parsed = parsed
        self._resolved = None

    def __getattr__(self, name):  # the record's fields: as resolved, once they are
        return getattr(self.__dict__["_resolved"] or self.__dict__["_parsed"], name)

    def resolve_once(self):
        if self._resolved is None:
            self._resolved = _or_exit(sglang_sim.resolve_server_args, self._argv)


def prepare_server_args(argv):
    if sglang_sim.current_version() >= NEW_CHOICE_LISTS:
        return ServerArgs(argv, _or_exit(sglang_sim.parse_server_args, argv))
    return _or_exit(sglang_sim.prepare_server_args, argv)
