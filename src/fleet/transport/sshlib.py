"""paramiko and fabric, imported without the test helper of invoke's that fleet never uses.

invoke (fabric's base, also imported by paramiko's ssh_config reader for `Match exec`) imports
`unittest.mock`, and asyncio under it, only to define its MockContext: ~35 ms of every fleet command that
connects, most of what a deploy spends in Python beyond the by-hand floor. While they are imported, a
placeholder stands in for `unittest.mock`, and it is taken out after: a later `import unittest.mock`
(a test's) gets the real module. Where the real one is loaded already, it is used as it is.
"""

from __future__ import annotations

import sys
import types


class _NoMock:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("invoke's MockContext is not available in fleet (unittest.mock was not imported)")


def _import() -> None:
    if "unittest.mock" in sys.modules:
        import fabric  # noqa: F401
        import paramiko  # noqa: F401

        return
    placeholder = types.ModuleType("unittest.mock")
    placeholder.Mock = _NoMock  # type: ignore[attr-defined]  # the one name invoke takes from it
    sys.modules["unittest.mock"] = placeholder
    try:
        import fabric  # noqa: F401
        import paramiko  # noqa: F401
    finally:
        if sys.modules.get("unittest.mock") is placeholder:
            del sys.modules["unittest.mock"]


_import()

import paramiko  # noqa: E402  (loaded above; these bind the names for fleet's modules)
from fabric import Config, Connection  # noqa: E402

__all__ = ["Config", "Connection", "paramiko"]
