"""The engine's own check of a planned command line, asked of the host and changing nothing there (`fleet
plan --check`, an upgrade's preview): the act step in its check-only mode, run in that engine version's
installed environment, as a deploy runs it first."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from fleet.control.act_request import check_args
from fleet.control.answers import engine_resolved
from fleet.host.check import picks_differ
from fleet.hostscripts import run_step
from fleet.plan.picks import told_picks
from fleet.step_answers import ACT
from fleet.terminal import safe_line

if TYPE_CHECKING:
    from fleet.plan import LaunchPlan
    from fleet.protocol import ActRequest, Premises
    from fleet.transport import Transport


def engine_verdict(t: Transport, plan: LaunchPlan, premises: Premises | None = None) -> dict[str, Any]:
    """The verdict, the lines that say why, what the engine resolved and, given `premises`
    (fleet.plan.keyed_premises), what it picks itself and where the plan did not stand on it."""
    name = f"{plan.container.name if plan.container else ''}-check-{uuid.uuid4().hex[:12]}"
    check = check_args(plan, name, ["--pull=never"], premises=premises)  # a preview pulls nothing
    request: ActRequest = {"op": "check", "check": check}
    out = run_step(t, plan.python, ACT, request, stdin=b"{}\n", timeout_s=300)
    said = [safe_line(line) for line in str(out["check"].get("output") or "").splitlines() if line.strip()]
    errors = [line for line in said if "error" in line.lower()]  # the parser's verdict, not its usage text
    expect = (premises or {}).get("expect") or {}
    picks = {k: v for k, v in told_picks(out["check"].get("picks")).items() if k in expect}  # plain words only
    accepted = str(out["check"]["verdict"]) == "accepted"
    return {
        "verdict": str(out["check"]["verdict"]),
        "output": "\n".join(errors[-6:] or said[-12:]),
        "resolved": engine_resolved(out["check"]),
        "picks": picks,
        "differ": picks_differ(picks, expect) if accepted else {},
    }
