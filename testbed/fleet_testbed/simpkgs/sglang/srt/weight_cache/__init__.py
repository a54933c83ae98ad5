"""Stand-in for `sglang.srt.weight_cache` (SGLang 0.5.23): fleet_testbed.sim_weight_cache."""
