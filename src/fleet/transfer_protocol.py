"""The shapes of the steps that move files and environments (pull, push, engine): declared once for fleet
and the host code, as fleet.protocol is for the others."""

from typing import TypedDict


class ListedFile(TypedDict, total=False):
    """One file of a model directory as a listing gives it (the Hub's for a pull, the source host's for a
    push), by its name under the directory: its size, and a checksum where one is known."""

    size: int
    sha256: str | None  # an LFS file's, from the Hub
    git_sha1: str | None  # a file kept in git itself: its blob id
    mtime_ns: int  # the source host's, for a push
    mode: int


class EngineRequest(TypedDict, total=False):
    """The engine step's request: install or use (`action`) an engine version in fleet's own environment
    under `state_dir`. The pip arguments come on stdin (an index URL may carry a password)."""

    action: str  # install | use
    engine: str
    version: str
    state_dir: str
    python: str | None
    pip_args: list[str]
    _installer: str  # set on the host: what installed it (uv or pip), for its marker


class PullRequest(TypedDict, total=False):
    path: str
    repo: str
    revision: str | None
    endpoint: str | None


# The push's two steps: the source lists (op "list") and sends its files; the target receives them.
CopyRequest = TypedDict("CopyRequest", {"path": str, "op": str, "from": str}, total=False)
