"""`python -m sglang.srt.weight_cache.daemon ...` on a simulated host: fleet_testbed.sim_weight_cache, from
SGLang 0.5.23 on (before, Python finds no such module)."""

import sys

from fleet_testbed import gpustate
from fleet_testbed.sglang_flags import parse_version

if __name__ == "__main__":
    if parse_version(gpustate.sglang_version()) < (0, 5, 23):
        sys.stderr.write(f"{sys.executable}: No module named sglang.srt.weight_cache.daemon\n")
        sys.exit(1)
    from fleet_testbed.sim_weight_cache import daemon_main

    daemon_main(sys.argv[1:])
