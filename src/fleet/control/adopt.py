"""Keeping a server that already runs the plan: a deploy of what already runs proves it (health, its
models, the smoke prompt) instead of restarting it, since a big model takes minutes to load again."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleet import events
from fleet.control.host_steps import HostLink, steps_of
from fleet.control.outcomes import DeployResult
from fleet.facts import HostFacts
from fleet.facts.recorded import Recorded
from fleet.host.common import api_key_name, base_url
from fleet.inventory import Host
from fleet.plan import LaunchPlan, show_version
from fleet.protocol import READY, STOPPED

if TYPE_CHECKING:
    from fleet.health import HostHealth


# Checks that say whether the recorded server itself is up and answering; the rest (load, disks, GPU
# faults) is not something a restart of this server would change.
SERVER_CHECKS = frozenset({"server", "container", "drift", "port", "http_health", "models", "generation", "crash_log"})
# What must have run and passed before a running server is kept instead of restarted.
ADOPTION_PROOF = frozenset({"server", "http_health", "generation"})


def runs_this_plan(r: Recorded, facts: HostFacts, plan: LaunchPlan, playbook_name: str) -> bool:
    """The deployment's recorded server (`r`) was started from exactly this plan (argv, environment,
    secret names), was last seen ready, and its process is still there."""
    old, new = r.plan, plan.to_json()

    def env(p: Mapping[str, Any]) -> list[tuple[Any, Any]]:
        return sorted((e.get("name"), e.get("value")) for e in p.get("env", []))

    return (
        r.status == READY
        and r.playbook == playbook_name
        and old.get("argv") == new["argv"]
        and old.get("engine_version") == new.get("engine_version")  # the same argv may run another version
        and env(old) == env(new)
        and old.get("secret_env", []) == new["secret_env"]
        and old.get("container") == new.get("container")  # the same image (by id), options and run
        and r.pid is not None
        and any(p.pid == r.pid for p in facts.servers)
    )


def ran_before(r: Recorded, plan: LaunchPlan) -> bool:
    """This exact command line already ran to readiness on this host with this engine version: the
    engine's own argument check (a cold import of the engine, seconds on a real box) cannot say anything new."""
    return (
        r.status in (READY, STOPPED)
        and r.plan.get("argv") == plan.argv()  # as recorded: a hand-edited 30000 is not "30000"
        and r.engine_version == show_version(plan.engine_version)
        and r.plan.get("container") == (plan.to_json().get("container"))  # not another image of that version
    )


def adoption_problems(health: HostHealth, deployment: str) -> list[str]:
    """Why a deployment's running server may not be kept as it is; empty when it proved itself. A check
    that did not run proves nothing: a probe that failed on the host returns no server checks at all,
    and must not read as a server that passed them."""
    from fleet.health import OK

    mine = [c for c in health.checks if c.deployment == deployment]
    failing = [c for c in mine if c.name in SERVER_CHECKS and c.status != OK]
    passed = {c.name for c in mine if c.status == OK}
    problems = [f"{c.name}: {c.detail}" for c in failing]
    problems += [f"{name}: not checked" for name in sorted(ADOPTION_PROOF - passed - {c.name for c in failing})]
    if problems:
        problems += [f"{c.label}: {c.detail}" for c in health.checks if c.name not in SERVER_CHECKS and c.status != OK]
    return problems


def adopt(
    link: HostLink,
    host: Host,
    deployment: str,
    playbook_name: str,
    plan: LaunchPlan,
    pid: int | None,
    progress: events.Sink,
    secrets: dict[str, str],
) -> DeployResult | None:
    """Prove the running server (health, /v1/models, the smoke prompt) instead of restarting it: a big
    model takes minutes to load. None when it does not pass; the caller then deploys as usual."""
    from fleet.control.sweep import HealthOptions

    started = time.monotonic()
    steps = steps_of(link)
    key = api_key_name(plan.argv())
    health = steps.health(host, HealthOptions(secrets=secrets, api_keys={playbook_name: key} if key else {}))
    problems = adoption_problems(health, deployment)
    if problems:
        progress(events.NotAdopted(list(problems)))
        return None
    shown = [f"{c.name}: {c.detail}" for c in health.checks if c.deployment == deployment and c.name in SERVER_CHECKS]
    progress(events.Adopted(pid, shown))
    return DeployResult(
        host=host.name,
        playbook=playbook_name,
        ok=True,
        attempts=[],
        plan=plan,
        reason="already running this plan and answering correctly; nothing was restarted",
        endpoint=base_url(plan.check_address, plan.port),
        ready_s=time.monotonic() - started,
        learned_applied=plan.applied_fixes,
        round_trips=steps.commands_run,
        adopted=True,
        deployment=deployment,
    )
