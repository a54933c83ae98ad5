"""Side effects on hosts, built from the pure core: read facts, stop, free GPUs, launch, watch, check.

Every function here takes a `Transport`; each operation is one script, so one round trip.
"""
