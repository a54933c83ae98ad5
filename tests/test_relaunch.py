"""What follows an attempt (fleet.plan.relaunch.next_action): one decision for a single deployment, a
service's replicas (each a single deployment's loop) and a group's ranks. Pure: read as a table."""

from __future__ import annotations

import pytest

from fleet.crashes import GiveUp, LogContext, Relaunch, diagnose
from fleet.plan.group import GROUP_RELAUNCH
from fleet.plan.relaunch import Failed, PicksDiffer, Proven, Ready, Replan, next_action

SM120 = LogContext(engine="sglang", version=(0, 5, 11), hybrid=True, nvfp4=True, moe=True, sm=120)
FIXABLE = diagnose(
    [
        "ValueError: Speculative decoding for M is not compatible with radix cache when using "
        "--mamba-scheduler-strategy no_buffer."
    ],
    SM120,
)
LOST = diagnose(["[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE)"], SM120)
UNKNOWN = diagnose(["RuntimeError: something nobody has seen before"], SM120)


@pytest.mark.parametrize("group", [False, True])
def test_a_proven_attempt_is_done_and_picks_that_differ_are_planned_again(group: bool) -> None:
    assert next_action(Proven(), [], 1, 3, group=group) == Ready()
    picks, differ = {"attention": "fa3", "MoE runner": "triton"}, {"attention": "fa3"}
    assert next_action(PicksDiffer(picks, differ), [], 1, 3, group=group) == Replan(picks, differ)


@pytest.mark.parametrize("group", [False, True])
def test_a_known_crash_is_relaunched_with_its_fix_once(group: bool) -> None:
    first = next_action(Failed(FIXABLE), [], 1, 3, group=group)
    assert isinstance(first, Relaunch) and first.signature == FIXABLE.signature
    again = next_action(Failed(FIXABLE), [first.signature], 2, 3, group=group)
    assert isinstance(again, GiveUp) and "came back after its fix" in again.reason
    assert isinstance(next_action(Failed(FIXABLE), [], 3, 3, group=group), GiveUp)  # no attempts left


@pytest.mark.parametrize("group", [False, True])
def test_what_fleet_cannot_explain_is_never_relaunched(group: bool) -> None:
    decision = next_action(Failed(UNKNOWN), [], 1, 3, group=group)
    assert isinstance(decision, GiveUp) and "unknown failure" in decision.reason


def test_only_a_group_relaunches_a_lost_rank_as_it_was_and_only_once() -> None:
    single = next_action(Failed(LOST), [], 1, 3, group=False)
    assert isinstance(single, GiveUp)
    whole = next_action(Failed(LOST), [], 1, 3, group=True)
    assert isinstance(whole, Relaunch) and whole.signature == GROUP_RELAUNCH and whole.fix.describe() == "(no change)"
    assert isinstance(next_action(Failed(LOST), [GROUP_RELAUNCH], 2, 3, group=True), GiveUp)


def test_a_rank_killed_from_outside_is_lost_by_its_log_alone() -> None:
    killed = diagnose(["[fleet] engine killed by signal 9 (SIGKILL)"], SM120)
    lines = ["[fleet] engine killed by signal 9 (SIGKILL)"]
    decision = next_action(Failed(killed, lines), [], 1, 3, group=True)
    assert isinstance(decision, Relaunch) and decision.signature == GROUP_RELAUNCH
