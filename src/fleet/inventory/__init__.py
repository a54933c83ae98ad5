"""Load and validate `inventory/*.yaml` and `playbooks/*.yaml` before any connection is made.

Every error names `file:line`, the field, what is wrong and what to do. Unknown keys are errors.
Values that end up on a remote command line are restricted to characters that cannot be read as
shell syntax, even though fleet also quotes everything it sends.

strict: the validation every value goes through; hosts: the inventory; playbooks: the playbooks.
"""

from fleet.inventory.hosts import (
    ExpectedGpus,
    Host,
    HostSettings,
    Inventory,
    load_inventory,
    parse_inventory,
    settings_from,
)
from fleet.inventory.playbooks import (
    FLEET_OWNED_FLAGS,
    RUNTIME_ENV,
    NamedPlaybook,
    Parsers,
    Playbook,
    Smoke,
    Speculative,
    changes_what_runs,
    check_playbook_host,
    load_playbook,
    parse_playbook,
)
from fleet.inventory.strict import Engine

__all__ = [
    "FLEET_OWNED_FLAGS",
    "RUNTIME_ENV",
    "Engine",
    "ExpectedGpus",
    "Host",
    "HostSettings",
    "Inventory",
    "NamedPlaybook",
    "Parsers",
    "Playbook",
    "Smoke",
    "Speculative",
    "changes_what_runs",
    "check_playbook_host",
    "load_inventory",
    "load_playbook",
    "parse_inventory",
    "parse_playbook",
    "settings_from",
]
