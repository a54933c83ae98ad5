"""What a deploy does after each attempt, decided in one place for a single server, a group's ranks and a
service's replicas (each replica is a single deployment's loop): the loops run attempts and say how each
ended; `next_action` says what comes next. Pure: no host, no clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleet.crashes import Diagnosis, GiveUp, Relaunch, decide
from fleet.plan.group import group_decision


@dataclass(frozen=True)
class Proven:
    """The attempt's server (every rank of a group) answered as the playbook asks."""


@dataclass(frozen=True)
class PicksDiffer:
    """The engine's own check says it picks otherwise than the plan stood on; nothing was stopped yet.
    `picks`: what it picks for each setting fleet asked about; `differ`: those the plan did not stand on."""

    picks: Mapping[str, str]
    differ: Mapping[str, str]


@dataclass(frozen=True)
class Failed:
    """The engine refused the command line, exited, or never answered: its log, read."""

    diagnosis: Diagnosis
    lines: Sequence[str] = field(default=())  # a group's failed rank's log: a lost rank is told apart by it
    host_lost: str = ""  # why fleet lost a group rank's host while watching it (its log then says nothing)


Ended = Proven | PicksDiffer | Failed


@dataclass(frozen=True)
class Ready:
    """Done: the deployment serves."""


@dataclass(frozen=True)
class Replan:
    """Plan again on the engine's own picks and make the same attempt on that plan (it costs no attempt);
    `differ`: what changes, said and remembered with the learned fixes."""

    picks: Mapping[str, str]
    differ: Mapping[str, str]


Action = Ready | Replan | Relaunch | GiveUp


def next_action(ended: Ended, applied: Sequence[str], attempt: int, max_attempts: int, *, group: bool) -> Action:
    """`applied`: the signatures whose fixes this deploy applied so far; `attempt`: the one that ended
    (from 1); `group`: the attempt was a whole group's, which may also be relaunched as it was once when
    a rank was lost (fleet.plan.group.group_decision)."""
    if isinstance(ended, Proven):
        return Ready()
    if isinstance(ended, PicksDiffer):
        return Replan(ended.picks, ended.differ)
    if group:
        return group_decision(ended.diagnosis, applied, attempt, max_attempts, ended.lines, ended.host_lost)
    return decide(ended.diagnosis, applied, attempt, max_attempts)
