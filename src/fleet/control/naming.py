"""A deployment's name, checked before anything reaches its host (the CLI checks it before it connects)."""

from __future__ import annotations

from fleet.errors import ConfigError
from fleet.inventory import NamedPlaybook
from fleet.protocol import DEPLOYMENT_NAME_RE


def deployment_name(name: str | None, playbook: NamedPlaybook) -> str:
    """A deployment's name: `--name`, else its playbook's. It names a directory on the host."""
    chosen = name if name is not None else playbook.name
    if not DEPLOYMENT_NAME_RE.match(chosen):
        said = "--name" if name is not None else f"the playbook's name (from {playbook.path})"
        raise ConfigError(
            f"{said}: {chosen!r} is not a deployment name (letters, digits and ._-, at most 63, starting "
            "with a letter or digit).",
            "Give one with --name NAME.",
        )
    return chosen
