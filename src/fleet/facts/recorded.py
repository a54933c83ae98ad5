"""A deployment's record (state_dir/deployments/NAME/state.json, written by fleet.host.records) as fleet
reads it: each field typed once, here. A record is the host's text, possibly edited, cut short or written
by an older fleet: a field that is missing or of another type reads as "not recorded" (None, empty),
never as an exception far from here. `raw` is the record as the host sent it, for what fleet sends back
whole (a stop's STOPPED record, a service's last good one); nothing reads a field from it by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet.host.records import record_gpus, record_ports
from fleet.protocol import StateRecord


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Recorded:
    status: str | None = None  # STARTING, READY, UNVERIFIED, FAILED or STOPPED (fleet.protocol)
    pid: int | None = None  # fleet's launcher: the process group's leader it recorded
    pgid: int | None = None
    start_ticks: int | None = None  # the leader's start time as launched: its pid alone is reused later
    port: int | None = None
    ports: tuple[int, ...] = ()  # every port it opens (records before placements: `port` alone)
    gpus: tuple[int, ...] | None = None  # the GPUs it was placed on; None: all of the host's
    playbook: str | None = None
    service: str | None = None  # the service it is a replica of ("": none; None: an older fleet's record)
    engine: str | None = None
    engine_version: str | None = None
    plan: Mapping[str, Any] = field(default_factory=dict)  # LaunchPlan.to_json(); fleet.control.ops reads it back
    group: Mapping[str, Any] | None = None  # a rank of a group: its rank, hosts and rendezvous
    container: Mapping[str, Any] | None = None
    weight_cache: Mapping[str, Any] | None = None
    reason: str | None = None
    served_name: str | None = None
    check_address: str | None = None  # where fleet's checks reach its server from the host
    run_id: str | None = None
    startup_key: str | None = None
    learned_key: str = ""
    attempts: int | None = None  # how many attempts the last deploy took (`attempt`: the one under way)
    applied_fixes: tuple[str, ...] = ()
    smoke: Mapping[str, Any] | None = None
    on_stall: str | None = None
    ready_timeout_s: float | None = None
    raw: StateRecord = field(default_factory=lambda: StateRecord(), compare=False, repr=False)

    @property
    def argv(self) -> list[str]:
        """The command line the recorded plan ran (empty: no plan)."""
        argv = self.plan.get("argv")
        return [str(a) for a in argv] if isinstance(argv, list) else []

    def other_owner(self, service: str, playbook: str) -> str | None:
        """What this record is, said for an operator, where it is not a replica of `service` (of `playbook`;
        "": where it is not a deployment of its own); None where it is, or where nothing is recorded. A
        record an older fleet wrote without saying is a replica when it ran the service's playbook."""
        if self.status is None and not self.plan:
            return None
        if service and self.service is None:
            ours = self.playbook == playbook
        else:
            ours = self.service == service or (not service and not self.service)
        if ours:
            return None
        return f"a replica of service {self.service}" if self.service else f"a deployment of {self.playbook} alone"

    @property
    def cache_group(self) -> int | None:
        """The process group of the weight cache daemon the record names (fleet.plan.weight_cache)."""
        pgid = _int((self.weight_cache or {}).get("pgid"))
        return pgid if pgid is not None and pgid > 1 else None


def parse_recorded(state: Mapping[str, object]) -> Recorded:
    """The record, typed (an empty mapping: no record)."""
    fixes = state.get("applied_fixes")
    timeout = state.get("ready_timeout_s")
    return Recorded(
        status=_str(state.get("status")),
        pid=_int(state.get("pid")),
        pgid=_int(state.get("pgid")),
        start_ticks=_int(state.get("start_ticks")),
        port=_int(state.get("port")),
        ports=tuple(record_ports(state)),
        gpus=tuple(placed) if (placed := record_gpus(state)) is not None else None,
        playbook=_str(state.get("playbook")),
        service=_str(state.get("service")),
        engine=_str(state.get("engine")),
        engine_version=_str(state.get("engine_version")),
        plan=_dict(state.get("plan")) or {},
        group=_dict(state.get("group")),
        container=_dict(state.get("container")),
        weight_cache=_dict(state.get("weight_cache")),
        reason=_str(state.get("reason")),
        served_name=_str(state.get("served_name")),
        check_address=_str(state.get("check_address")),
        run_id=_str(state.get("run_id")),
        startup_key=_str(state.get("startup_key")),
        learned_key=_str(state.get("learned_key")) or "",
        attempts=_int(state.get("attempts")) or _int(state.get("attempt")),
        applied_fixes=tuple(str(f) for f in fixes) if isinstance(fixes, list) else (),
        smoke=_dict(state.get("smoke")),
        on_stall=_str(state.get("on_stall")),
        ready_timeout_s=float(timeout) if isinstance(timeout, int | float) and not isinstance(timeout, bool) else None,
        raw=dict(state),  # type: ignore[arg-type]
    )
