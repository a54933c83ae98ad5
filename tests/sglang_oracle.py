"""The real SGLang parsers and resolution (../shared/tools/sglang-oracle, built by `make oracle`), many
command lines of one version at a time: tests/oracle_pool.py imports SGLang once and runs each of
`check`'s checks in a fork of that process (the same answers, about four times faster)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

ORACLE = Path(os.environ.get("FLEET_ORACLE", ROOT / ".cache" / "sglang-oracle"))


def require_oracle() -> None:
    if not (ORACLE / ".venv" / ".ok-build").exists():
        pytest.fail(f"the real SGLang parsers are not built at {ORACLE}: run `make oracle` (make test does)")


def answers(version: str, checks: list[list[str]], jobs: int = 2) -> list[dict]:
    """`check`'s JSON answer for each of `checks` (its own arguments after `--version`), in order."""
    require_oracle()
    p = subprocess.run(
        [str(ORACLE / ".venv" / "bin" / "python"), str(ROOT / "tests" / "oracle_pool.py"), str(ORACLE), version,
         str(jobs)],
        input=json.dumps([["--version", version, *c] for c in checks]),
        capture_output=True, text=True, timeout=120 + 60 * len(checks), cwd=ORACLE,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    said = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(said) == len(checks)
    return list(said)
