"""Stand-in `sglang` package of a simulated host (version: the host's host.json)."""

from fleet_testbed import gpustate as _g

__version__ = _g.load_host()["sglang_version"]
