"""Host facts: the probe (probe.py, run on the host) and the pure parser of its answer (parse).

This package exports what the rest of fleet uses; the modules say the rest.
"""

from fleet.facts.parse import DeploymentRecord, HostFacts, Listener, ModelFiles, gpu_mismatches, one_line, parse_facts

__all__ = [
    "DeploymentRecord",
    "HostFacts",
    "Listener",
    "ModelFiles",
    "gpu_mismatches",
    "one_line",
    "parse_facts",
]
