"""Host facts: the probe script's text and the pure parser of its JSON answer into `HostFacts`.

Pure: builds strings and parses data; never touches the network (pyinfra's "fact = command + parser").

The code is in parse; this package exports what the rest of fleet uses.
"""

from fleet.facts.parse import HostFacts, gpu_mismatches, one_line, parse_facts, probe_source

__all__ = ["HostFacts", "gpu_mismatches", "one_line", "parse_facts", "probe_source"]
