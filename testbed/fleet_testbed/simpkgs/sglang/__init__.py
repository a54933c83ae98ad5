"""Stand-in `sglang` package of a simulated host (version: its installed metadata, else host.json's)."""

from fleet_testbed import gpustate as _g

__version__ = _g.sglang_version()
