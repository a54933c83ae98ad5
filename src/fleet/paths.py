"""Where fleet keeps its own files on the machine it runs on (never on the GPU hosts).

Strings first, `Path` on request: the warm launcher (`fleet.launch`) reads these before anything else
of fleet, and pathlib alone is ~10 ms of its start-up.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # not typing's: see fleet.frames
if TYPE_CHECKING:
    from pathlib import Path


def cache_root() -> str:
    """`$XDG_CACHE_HOME/fleet` (default ~/.cache/fleet): locks, the connection pool's sockets and log."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fleet")


def cache_dir() -> Path:
    from pathlib import Path

    return Path(cache_root())


def pool_socket() -> Path:
    return cache_dir() / "pool.sock"


def warm_socket_path() -> str:
    """Where the pool's pre-imported fleet process takes commands (`fleet.launch`)."""
    return os.path.join(cache_root(), "pool-run.sock")


def warm_socket() -> Path:
    from pathlib import Path

    return Path(warm_socket_path())
