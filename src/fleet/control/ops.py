"""Commands built on the deploy machinery: deploy, restart, stop, status, logs."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from typing import Any, TypeGuard

from fleet import events
from fleet.control.act_request import owner
from fleet.control.adopt import adopt, ran_before, runs_this_plan
from fleet.control.answers import refuse_unless_taken
from fleet.control.deploy import DRAIN_S, Deployer
from fleet.control.gather import asked_for, read_facts
from fleet.control.host_steps import HostLink, connection_of
from fleet.control.naming import deployment_name
from fleet.control.outcomes import DeployResult
from fleet.control.placing import Placed, place_and_plan
from fleet.control.pull import HubAccess, pull_model
from fleet.crashes import Signature
from fleet.errors import ConfigError, LockedError, PreflightError
from fleet.facts import HostFacts
from fleet.facts.recorded import Recorded, parse_recorded
from fleet.hostscripts import step_python
from fleet.inventory import Host, NamedPlaybook
from fleet.inventory.playbooks import READY_TIMEOUT_MAX_S, Playbook
from fleet.inventory.runtime import Container
from fleet.model import GENERATE
from fleet.plan import Flag, LaunchPlan, Wishes, parse_version, show_version
from fleet.plan.build import PlanResult, gpu_summary, learned_fixes, spec_of
from fleet.plan.container import ContainerPlan
from fleet.protocol import READY, STOPPED, ActRequest, ActResult, SmokeSpec, StateRecord
from fleet.secrets import read_secrets
from fleet.terminal import safe_line
from fleet.transport import Transport


def startup_bounds(spec: Playbook) -> dict[str, Any]:
    """The playbook's start-up bounds, as Deployer takes them (and keeps them in the record)."""
    return {"ready_timeout_s": spec.ready_timeout_s, "on_stall": spec.on_stall}


def recorded_bounds(r: Recorded) -> dict[str, Any]:
    """A restart's or heal's start-up bounds: the playbook's, as the deployment's record kept them (a
    record from before they were kept, or edited out of shape: the defaults)."""
    bounds: dict[str, Any] = {}
    if r.ready_timeout_s is not None and 0 < r.ready_timeout_s <= READY_TIMEOUT_MAX_S:
        bounds["ready_timeout_s"] = r.ready_timeout_s
    if r.on_stall in ("fail", "wait"):
        bounds["on_stall"] = r.on_stall
    return bounds


def smoke_of(playbook: NamedPlaybook, task: str) -> SmokeSpec:
    """What proves a server of the playbook serves: its smoke prompt for a chat model; for an embedding
    model or a reranker (`task`, fleet.model) fleet's own texts on the endpoint it serves, where the
    playbook's any_answer (random weights) accepts any well-formed answer."""
    s = playbook.spec.smoke
    smoke: SmokeSpec = {"prompt": s.prompt, "expect": s.expect, "max_tokens": s.max_tokens}
    return smoke if task == GENERATE else {**smoke, "kind": task, "any_answer": s.any_answer}


def deploy(
    t: HostLink,
    host: Host,
    playbook: NamedPlaybook,
    *,
    force: bool,
    engine_check: bool,
    progress: events.Sink,
    signatures: Sequence[Signature] | None = None,
    name: str | None = None,
    gpus: int | tuple[int, ...] | None = None,
    replace: bool = False,
    relaunch: bool = False,
    drain_s: float = DRAIN_S,
    keep_other_plan: bool = False,
    hub: HubAccess | None = None,
    service: str = "",
) -> DeployResult:
    """`gpus` (from --gpus) overrides the playbook's gpus:; `replace` stops other deployments on them;
    `relaunch` restarts a server already running this plan instead of adopting it (a rolling restart);
    `drain_s` bounds how long the old server may finish its requests after SIGTERM; `keep_other_plan`
    refuses (exit 4) to replace a server that serves another plan (a service's replica: rolled instead);
    `hub`: a model missing on the host is pulled first when the playbook says where from (None: refused);
    `service`: the service this deployment is a replica of ("": none)."""
    _refuse_a_group(playbook, host)
    deployment = deployment_name(name, playbook)
    facts = _facts_with_what_is_missing(t, host, playbook, progress, hub)
    placed = place_and_plan(host, playbook, facts, deployment, gpus, replace=replace, signatures=signatures)
    result = _announced(host, placed, deployment, progress)
    assert result.plan and result.model and result.gpus
    secrets = read_secrets(playbook.spec.secret_names, playbook.name)
    mine = facts.remote.deployment(deployment).recorded
    _refuse_another_owner(host, deployment, mine, service, playbook.name)
    if keep_other_plan:
        _refuse_another_plan(host, deployment, mine, facts, result.plan, playbook.name)
    if not relaunch and runs_this_plan(mine, facts, result.plan, playbook.name) and not placed.placement.replaces:
        adopted = adopt(t, host, deployment, playbook.name, result.plan, mine.pid, progress, secrets)
        if adopted is not None:
            return adopted
    if engine_check and ran_before(mine, result.plan):
        engine_check = False
        progress(events.EngineCheckSkipped(show_version(result.plan.engine_version)))
    deployer = Deployer(
        t,
        host,
        playbook_name=playbook.name,
        smoke=smoke_of(playbook, result.plan.task),
        kill_policy=_kill_policy(host, force),
        secrets=secrets,
        progress=progress,
        engine_check=engine_check,
        max_attempts=playbook.spec.max_attempts,
        **startup_bounds(playbook.spec),
        signatures=signatures,
        deployment=deployment,
        gpus=placed.indices,
        replace=tuple(o.name for o in placed.placement.replaces),
        drain_s=drain_s,
        service=service,
    )
    existing = _learned_as_json(facts, result.learned_key, signatures)
    planned = result.plan

    def replan(told: dict[str, str]) -> LaunchPlan:
        """The same plan made again, on the same facts, standing on what the engine said it picks itself."""
        again = place_and_plan(
            host, playbook, facts, deployment, gpus, replace=replace, signatures=signatures, told=told
        ).result
        return again.plan if again.plan is not None and not again.errors else planned

    return deployer.run(
        result.plan,
        result.model,
        result.gpus,
        result.wishes,
        learned_key=result.learned_key,
        learned_existing=existing,
        replan=replan,
    )


def _refuse_another_owner(host: Host, deployment: str, mine: Recorded, service: str, playbook: str) -> None:
    """A service's replica and a deployment of its own never take each other's place under one name:
    each is refused, the other left as it is."""
    other = mine.other_owner(service, playbook)
    if other is None:
        return
    unlike = f", not a replica of service {service}" if service else ""
    said = safe_line(f"{host.name}: deployment {deployment} is {other}{unlike}")
    if service:
        hint = f"Stop it first (fleet stop --host {host.name} --name {deployment}), or name the service otherwise."
    else:
        hint = "A service's replicas change through it (fleet restart SERVICE); deploy this under another --name."
    raise PreflightError(f"{said}; it was left as it is.", hint)


def _refuse_another_plan(
    host: Host, deployment: str, mine: Recorded, facts: HostFacts, plan: LaunchPlan, playbook: str
) -> None:
    serving = mine.status == READY and any(p.pid == mine.pid for p in facts.servers)
    if serving and not runs_this_plan(mine, facts, plan, playbook):
        raise PreflightError(
            f"{host.name}: deployment {deployment} serves another plan than {playbook} gives now; it was left serving.",
            "A service's replicas change plan one at a time: fleet restart SERVICE.",
        )


def _refuse_a_group(playbook: NamedPlaybook, host: Host) -> None:
    if playbook.spec.hosts:  # one model over several hosts is never launched on one of them alone
        raise ConfigError(
            f"{playbook.where('hosts')}: {playbook.name} is spread over its hosts: ({', '.join(playbook.spec.hosts)}); "
            f"it cannot run on {host.name} alone (nor as a service's replica).",
            f"Deploy it as a group: fleet deploy {playbook.name}.",
        )


def _facts_with_what_is_missing(
    t: HostLink, host: Host, playbook: NamedPlaybook, progress: events.Sink, hub: HubAccess | None
) -> HostFacts:
    """The host's facts for this playbook, read again after pulling a container image it lacks and, with
    `hub`, a model it lacks (refused, nothing stopped, when that cannot be done)."""
    asked = asked_for(host, playbook)
    facts = read_facts(t, host, **asked)
    runtime = asked["runtime"]
    cli = str(facts.container and facts.container.cli)
    if _wants_pull(runtime, facts) and pull_image(connection_of(t, "pull an image"), cli, runtime, progress):
        facts = read_facts(t, host, **asked)
    if hub is not None and playbook.spec.hf_repo and (facts.model is None or not facts.model.exists):
        pull_model(connection_of(t, "pull a model"), host, playbook, hub=hub, progress=progress)
        facts = read_facts(t, host, **asked)
    return facts


def _announced(host: Host, placed: Placed, deployment: str, progress: events.Sink) -> PlanResult:
    """The plan pre-flight accepted, said to `progress`; a refusal is raised with nothing on the host changed."""
    result = placed.result
    if result.errors or result.plan is None or result.model is None:
        raise PreflightError(
            "; ".join(v.message for v in result.errors) or f"{host.name}: cannot plan",
            "Nothing on the host was changed.",
        )
    plan = result.plan
    progress(events.Planned(result.model.describe(), plan.argv(), list(plan.applied_fixes), deployment, placed.how))
    return result


def _wants_pull(runtime: Container | None, facts: HostFacts) -> TypeGuard[Container]:
    """The runtime's pull: says to pull its image now (missing: only when the host lacks it)."""
    c = facts.container
    if runtime is None or c is None or not c.cli or runtime.pull == "never":
        return False
    return runtime.pull == "always" or not c.image_present


PULL_LINE_BYTES = 4096


def pull_image(t: Transport, cli: str, runtime: Container, progress: events.Sink) -> bool:
    """Pull an image the host lacks (the runtime's pull: missing/always), its output streamed as it comes;
    whether it worked. Nothing is stopped before: a failed pull leaves the image missing, which pre-flight
    then refuses with its reason."""
    buf = b""

    def on_chunk(chunk: bytes) -> bool:
        nonlocal buf
        *lines, buf = (buf + chunk).replace(b"\r", b"\n").split(b"\n")
        buf = buf[-PULL_LINE_BYTES:]  # a line never ended keeps its end only: a pull's lines are ~100 B
        for line in lines:
            if line.strip():
                progress(events.Pulling(runtime.image, line[-PULL_LINE_BYTES:].decode("utf-8", "replace")))
        return True

    code = t.stream(f"{shlex.quote(cli)} pull {shlex.quote(runtime.image)} 2>&1", on_chunk, timeout_s=3600)
    return code == 0


def _learned_as_json(facts: HostFacts, key: str, signatures: Sequence[Signature] | None = None) -> list[dict[str, Any]]:
    """The host's learned fixes for `key` that the knowledge base still backs, as the watcher writes them."""
    return [
        {"signature": lf.signature, "fix": lf.fix.to_json(), "learned_at": lf.learned_at}
        for lf in learned_fixes(facts, key, signatures)
    ]


def _kill_policy(host: Host, force: bool) -> str:
    return "force" if force else host.settings.kill_policy


def plan_from_record(r: Recorded) -> LaunchPlan:
    """The plan a host recorded when it was last deployed (what `restart` runs again), whole: the record
    a restart writes keeps its reasons and the engine's picks it stood on."""
    p = r.plan
    flags = tuple(
        Flag(f["flag"], f["value"], f["rule"], f["reason"], f.get("source", ""), f.get("replaces", ""))
        for f in p["flags"]
    )
    from fleet.plan import EnvVar, Verdict
    from fleet.plan.picks import Pick

    picks = tuple(
        Pick(q["setting"], q["resolved"], q["source"], q["value"] if q["value"] != q["resolved"] else "")
        for q in p.get("left_to_engine", [])
    )
    return LaunchPlan(
        engine=p["engine"],
        engine_version=parse_version(p.get("engine_version")),
        python=p["argv"][0],
        model_path=str(next((f.value for f in flags if f.name in ("--model-path", "--model")), "")),
        served_name=p["served_name"],
        port=int(p["port"]),
        check_address=r.check_address or "127.0.0.1",
        flags=flags,
        env=tuple(EnvVar(e["name"], e["value"], e["rule"], e["reason"]) for e in p["env"]),
        secret_env=tuple(p.get("secret_env", [])),
        verdicts=tuple(Verdict(v["level"], v["rule"], v["message"]) for v in p.get("verdicts", [])),
        applied_fixes=tuple(p.get("applied_fixes", [])),
        left_to_engine=picks,
        told=tuple((str(k), str(v)) for k, v in (p.get("told") or {}).items()),
        container=ContainerPlan.from_json(p["container"]) if p.get("container") else None,
        task=str(p.get("task") or GENERATE),
    )


def chosen_deployment(facts: HostFacts, name: str | None, *, verb: str) -> str:
    """The deployment a one-deployment command acts on: `name`, or the host's only one."""
    names = sorted(n for n, d in facts.remote.deployments.items() if d.recorded.plan)
    if name is not None:
        return name
    if len(names) == 1:
        return names[0]
    if not names:
        raise ConfigError(
            f"{facts.host}: nothing recorded to {verb} (no fleet deployment on this host).",
            "Run `fleet deploy PLAYBOOK --host HOST` first.",
        )
    raise ConfigError(
        f"{facts.host}: {len(names)} deployments ({', '.join(names)}); say which to {verb}.",
        f"Pass --name NAME (or HOST/NAME): fleet {verb} {facts.host}/{names[0]}.",
    )


def restartable(facts: HostFacts) -> list[str]:
    """What `fleet restart --host H` restarts: every deployment with a plan, but those an operator
    stopped (or another deployment replaced) when there are several."""
    planned = sorted(n for n, d in facts.remote.deployments.items() if d.recorded.plan)
    running = [n for n in planned if facts.remote.deployments[n].recorded.status != STOPPED]
    return running if len(planned) > 1 else planned


def recorded_names(facts: HostFacts) -> list[str]:
    """Every deployment the host has a record of (a plan, a lock, an error), by name."""
    return sorted(facts.remote.deployments)


def restart(
    t: HostLink,
    host: Host,
    *,
    force: bool,
    progress: events.Sink,
    signatures: Sequence[Signature] | None = None,
    name: str | None = None,
    state: StateRecord | None = None,
    drain_s: float = DRAIN_S,
    heal: bool = False,
) -> DeployResult:
    """Redeploy a deployment's recorded plan on the GPUs it was placed on (`name`: the host's only one);
    `state`: another record of it to redeploy instead (a service's last good one, for --rollback).
    `heal`: `fleet health --heal` asks; a deployment an operator stopped is not restarted, also when the
    stop lands after the check (the host decides that under its lock)."""
    state_facts = read_facts(t, host)
    deployment = chosen_deployment(state_facts, name, verb="restart")
    r = parse_recorded(state) if state is not None else state_facts.remote.deployment(deployment).recorded
    if r.group is not None:  # one rank alone cannot rejoin the others: the group restarts as a whole
        raise ConfigError(
            f"{host.name}: deployment {deployment} is rank {r.group.get('rank')} of a group over "
            f"{', '.join(map(str, r.group.get('hosts') or []))}; a rank is never restarted alone.",
            f"Relaunch the whole group: fleet deploy {r.playbook or 'PLAYBOOK'}.",
        )
    if not r.plan:
        raise ConfigError(
            f"{host.name}: nothing recorded to restart for deployment {deployment}.",
            "Run `fleet deploy PLAYBOOK --host HOST` first (fleet status lists the deployments).",
        )
    try:
        plan = plan_from_record(r)
        if r.smoke is None:  # nothing to prove the server with: never recorded ready on /health alone
            raise KeyError("smoke")
        smoke = SmokeSpec(**r.smoke)  # type: ignore[typeddict-item]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:  # a record edited or cut short
        raise ConfigError(
            f"{host.name}: the recorded deployment is damaged ({type(exc).__name__}: {exc}); nothing was changed.",
            f"Deploy again: fleet deploy PLAYBOOK --host {host.name}.",
        ) from exc
    placed = r.gpus  # where that record's server ran
    on_host = plan.container.model_host_path if plan.container else plan.model_path  # mounted in a container
    facts = read_facts(t, host, model=on_host, engine=plan.engine)
    if facts.model is None or not facts.model.exists or not facts.gpus:
        raise ConfigError(f"{host.name}: the recorded model {on_host} or the GPUs are gone.", "Redeploy.")
    m = facts.model
    model = spec_of(plan.model_path, m)
    gpus = gpu_summary(facts, placed)
    if gpus is None:
        raise ConfigError(
            f"{host.name}: the GPUs {placed} deployment {deployment} was placed on are gone.", "Redeploy."
        )
    secrets = read_secrets(plan.secret_env, str(r.playbook))
    deployer = Deployer(
        t,
        host,
        playbook_name=r.playbook or "recorded",
        smoke=smoke,
        kill_policy=_kill_policy(host, force),
        secrets=secrets,
        progress=progress,
        signatures=signatures,
        deployment=deployment,
        gpus=placed,
        drain_s=drain_s,
        command="heal" if heal else "deploy",
        service=r.service,
        **recorded_bounds(r),
    )
    key = r.learned_key
    existing = _learned_as_json(facts, key, signatures)
    wishes = Wishes(engine=plan.engine, served_name=plan.served_name, port=plan.port)
    return deployer.run(plan, model, gpus, wishes, learned_key=key, learned_existing=existing)


def stop(t: HostLink, host: Host, *, force: bool, name: str | None = None) -> ActResult:
    """Stop one deployment (`name`), or every deployment on the host and any stale engine (None)."""
    facts = read_facts(t, host)
    if name is not None and name not in facts.remote.deployments:
        known = ", ".join(recorded_names(facts)) or "none"
        raise ConfigError(
            f"{host.name}: no deployment named {name} (deployments there: {known}); nothing was stopped.",
            f"`fleet status --host {host.name}` lists them; `fleet stop --host {host.name}` stops every one.",
        )
    names = [name] if name is not None else recorded_names(facts)
    merged: ActResult = {"ended": [], "left": [], "refused": [], "memory_held": []}
    busy: list[LockedError] = []
    for deployment in names or ["default"]:  # no record at all: stale engines are still stopped
        try:
            out = _stop_one(t, host, facts, deployment, force=force, everything=name is None)
        except LockedError as exc:  # another run is busy with this one: the others are still stopped
            if name is not None:
                raise
            busy.append(exc)
            continue
        merged["ended"] += out.get("ended", [])
        merged["left"] += [p for p in out.get("left", []) if p not in merged["left"]]
        merged["refused"] += [p for p in out.get("refused", []) if p not in merged["refused"]]
        # no record: what was stopped was no deployment's, and "default" is not one the operator knows
        merged["memory_held"] += [
            {**m, "deployment": m["deployment"] if names else None} for m in out.get("memory_held", [])
        ]
    if busy:
        stopped = ", ".join(str(p.get("pid")) for p in merged["ended"]) or "nothing"
        raise LockedError(
            "; ".join(exc.message for exc in busy) + f" Stopped the rest (pids {stopped}).",
            busy[0].hint,
        )
    return merged


def _stop_one(
    t: HostLink, host: Host, facts: HostFacts, deployment: str, *, force: bool, everything: bool
) -> ActResult:
    r = facts.remote.deployment(deployment).recorded
    placed = r.gpus
    deployer = Deployer(
        t,
        host,
        playbook_name=r.playbook or "-",
        smoke={},
        kill_policy=_kill_policy(host, force),
        secrets={},
        deployment=deployment,
        gpus=None if everything else placed,
    )
    args: ActRequest = {
        "op": "stop",
        "lock": deployer.lock_args("stop"),
        "free": deployer.free_args(r.port),
        # stopped_by: an operator's stop, kept by whatever the record says later, so no heal undoes it
        "state_update": {**r.raw, "status": STOPPED, "updated": time.time(), "stopped_by": owner()} if r.raw else None,
        "release_lock": True,
    }
    out = deployer.steps.act(step_python(host), args, timeout_s=300)
    refuse_unless_taken(host.name, deployment, out)
    out["memory_held"] = memory_held(deployment, out, args["free"]["idle_mib"])
    return out  # holders that are not fleet's are in out["refused"]: reported, left running


def memory_held(deployment: str, out: ActResult, idle_mib: int) -> list[dict[str, Any]]:
    """The GPUs still in use when a stop's wait for the memory of what it stopped ran out (a stop is
    also there to free them): said, so that a wait is never silent and the operator can look. An answer
    not of the step's shape says nothing here (its stop is reported as it is)."""
    memory = out.get("memory")
    if not out.get("ended") or not isinstance(memory, dict):
        return []
    after, gpus, waited = memory.get("after_mib"), memory.get("gpus"), memory.get("waited_s")
    indices = list(range(len(after))) if gpus is None and isinstance(after, list) else gpus
    if not (_ints(after) and _ints(indices)) or not isinstance(waited, int | float):
        return []
    busy = [(i, mib) for i, mib in zip(indices, after, strict=False) if mib > idle_mib]
    if not busy:
        return []
    return [
        {"deployment": deployment, "gpus": [i for i, _ in busy], "mib": sum(m for _, m in busy), "waited_s": waited}
    ]


def _ints(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(type(v) is int for v in value)
