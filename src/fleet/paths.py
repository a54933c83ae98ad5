"""Where fleet keeps its own files on the machine it runs on (never on the GPU hosts)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/fleet` (default ~/.cache/fleet): locks, the connection pool's socket and log."""
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "fleet"


def pool_socket() -> Path:
    return cache_dir() / "pool.sock"


def warm_socket() -> Path:
    """Where the pool's pre-imported fleet process takes commands (`fleet.launch`)."""
    return cache_dir() / "pool-run.sock"
