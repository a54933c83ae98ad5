"""Commands built on the deploy machinery: deploy, restart, stop, status, logs."""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as replace_field
from typing import Any, TypeGuard

from fleet import events
from fleet.control.answers import act_answer, refuse_unless_taken
from fleet.control.deploy import DRAIN_S, Deployer, DeployResult, recorded
from fleet.control.gather import model_path, read_facts
from fleet.control.pull import HubAccess, pull_model
from fleet.crashes import Signature
from fleet.errors import ConfigError, LockedError, PreflightError
from fleet.facts import DeploymentRecord, HostFacts
from fleet.health import HostHealth
from fleet.host_common import DEPLOYMENT_NAME_RE, api_key_name, base_url
from fleet.hostscripts import run_json, step_python
from fleet.inventory import Host, NamedPlaybook
from fleet.inventory.playbooks import READY_TIMEOUT_MAX_S, Playbook
from fleet.inventory.runtime import Container, chosen_runtime
from fleet.model import GENERATE
from fleet.plan import Flag, LaunchPlan, Verdict, Wishes, args_dict, parse_version, show_version
from fleet.plan.build import PlanResult, build_plan, gpu_summary, learned_fixes, model_spec, spec_of
from fleet.plan.container import ContainerPlan
from fleet.plan.fit import Fit, fit_gpus
from fleet.plan.placement import FREE, WITH_REPLACED, WITH_STALE, Placement, free_gpus, place, port_for, stopped_with
from fleet.plan.whole_box import whole_box
from fleet.protocol import DEAD, READY, STARTING, STOPPED, UNVERIFIED, ActResult
from fleet.secrets import read_secrets
from fleet.startup import phase_now
from fleet.transport import Transport


def startup_bounds(spec: Playbook) -> dict[str, Any]:
    """The playbook's start-up bounds, as Deployer takes them (and keeps them in the record)."""
    return {"ready_timeout_s": spec.ready_timeout_s, "on_stall": spec.on_stall}


def recorded_bounds(state: dict[str, Any]) -> dict[str, Any]:
    """A restart's or heal's start-up bounds: the playbook's, as the deployment's record kept them (a
    record from before they were kept, or edited out of shape: the defaults)."""
    bounds: dict[str, Any] = {}
    timeout = state.get("ready_timeout_s")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 < timeout <= READY_TIMEOUT_MAX_S:
        bounds["ready_timeout_s"] = float(timeout)
    if state.get("on_stall") in ("fail", "wait"):
        bounds["on_stall"] = state["on_stall"]
    return bounds


def smoke_of(playbook: NamedPlaybook, task: str) -> dict[str, Any]:
    """What proves a server of the playbook serves: its smoke prompt for a chat model; for an embedding
    model or a reranker (`task`, fleet.model) fleet's own texts on the endpoint it serves, where the
    playbook's any_answer (random weights) accepts any well-formed answer."""
    s = playbook.spec.smoke
    smoke = {"prompt": s.prompt, "expect": s.expect, "max_tokens": s.max_tokens}
    return smoke if task == GENERATE else {**smoke, "kind": task, "any_answer": s.any_answer}


def deployment_name(name: str | None, playbook: NamedPlaybook) -> str:
    """A deployment's name: `--name`, else its playbook's. It names a directory on the host."""
    chosen = name if name is not None else playbook.name
    if not DEPLOYMENT_NAME_RE.match(chosen):
        said = "--name" if name is not None else f"the playbook's name (from {playbook.path})"
        raise ConfigError(
            f"{said}: {chosen!r} is not a deployment name (letters, digits and ._-, at most 63, starting "
            "with a letter or digit).",
            "Give one with --name NAME.",
        )
    return chosen


def deploy(
    t: Transport,
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
) -> DeployResult:
    """`gpus` (from --gpus) overrides the playbook's gpus:; `replace` stops other deployments on them;
    `relaunch` restarts a server already running this plan instead of adopting it (a rolling restart);
    `drain_s` bounds how long the old server may finish its requests after SIGTERM; `keep_other_plan`
    refuses (exit 4) to replace a server that serves another plan (a service's replica: rolled instead);
    `hub`: a model missing on the host is pulled first when the playbook says where from (None: refused)."""
    if playbook.spec.hosts:  # one model over several hosts is never launched on one of them alone
        raise ConfigError(
            f"{playbook.where('hosts')}: {playbook.name} is spread over its hosts: ({', '.join(playbook.spec.hosts)}); "
            f"it cannot run on {host.name} alone (nor as a service's replica).",
            f"Deploy it as a group: fleet deploy {playbook.name}.",
        )
    deployment = deployment_name(name, playbook)
    path = model_path(host, playbook.spec.model)
    runtime = chosen_runtime(playbook.spec.runtime, host.settings.runtime)
    facts = read_facts(t, host, model=path, engine=playbook.spec.engine, runtime=runtime)
    if _wants_pull(runtime, facts) and pull_image(t, str(facts.container and facts.container.cli), runtime, progress):
        facts = read_facts(t, host, model=path, engine=playbook.spec.engine, runtime=runtime)
    if hub is not None and playbook.spec.hf_repo and (facts.model is None or not facts.model.exists):
        pull_model(t, host, playbook, hub=hub, progress=progress)  # refuses (nothing stopped) if it cannot
        facts = read_facts(t, host, model=path, engine=playbook.spec.engine, runtime=runtime)
    placed = place_and_plan(host, playbook, facts, deployment, gpus, replace=replace, signatures=signatures)
    placement, indices, result = placed.placement, placed.indices, placed.result
    if result.errors or result.plan is None:
        raise PreflightError(
            "; ".join(v.message for v in result.errors) or f"{host.name}: cannot plan",
            "Nothing on the host was changed.",
        )
    assert result.plan and result.model and result.gpus
    progress(
        events.Planned(
            result.model.describe(), result.plan.argv(), list(result.plan.applied_fixes), deployment, placed.how
        )
    )
    secrets = read_secrets(playbook.spec.secret_names, playbook.name)
    mine = recorded(facts, deployment)
    serving = mine.get("status") == READY and any(p.pid == mine.get("pid") for p in facts.servers)
    if keep_other_plan and serving and not _runs_this_plan(mine, facts, result.plan, playbook.name):
        raise PreflightError(
            f"{host.name}: deployment {deployment} serves another plan than {playbook.name} gives now; "
            "it was left serving.",
            "A service's replicas change plan one at a time: fleet restart SERVICE.",
        )
    if not relaunch and _runs_this_plan(mine, facts, result.plan, playbook.name) and not placement.replaces:
        adopted = _adopt(t, host, deployment, playbook.name, result.plan, mine.get("pid"), progress, secrets)
        if adopted is not None:
            return adopted
    if engine_check and _ran_before(mine, result.plan):
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
        gpus=indices,
        replace=tuple(o.name for o in placement.replaces),
        drain_s=drain_s,
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


@dataclass(frozen=True)
class Placed:
    placement: Placement
    indices: tuple[int, ...] | None  # what the launch names (CUDA_VISIBLE_DEVICES); None: all, unnamed
    result: PlanResult
    how: str


def place_and_plan(
    host: Host,
    playbook: NamedPlaybook,
    facts: HostFacts,
    deployment: str,
    gpus: int | tuple[int, ...] | None,
    *,
    replace: bool,
    signatures: Sequence[Signature] | None = None,
    show_refusal: bool = False,
    nodes: int = 1,
    told: Mapping[str, str] | None = None,
) -> Placed:
    """The deployment's GPUs and port on this host, then its plan (`fleet plan` shows, `deploy` runs it).
    `gpus` (--gpus) overrides the playbook's gpus:. A placement that cannot be made is a PreflightError;
    `show_refusal` (`fleet plan`): an overlap with another deployment is an error verdict of the plan
    instead, shown with the rest of what pre-flight says."""
    path = model_path(host, playbook.spec.model)
    asked, fitted, dp = (
        (gpus, None, 1) if gpus is not None else _asked(playbook, facts, path, nodes, deployment, replace)
    )
    key = "tp" if playbook.spec.gpus is None and playbook.spec.tp else "gpus"
    where = f"{'--gpus' if gpus is not None else playbook.where(key)} ({host.name})"
    refused = None
    try:
        placement = place(deployment, asked, facts, replace=replace, where=where, take_stale=fitted is not None)
    except PreflightError as exc:
        if not show_refusal:
            if fitted is not None:  # the count was fit's, not the operator's: say why it was that many
                raise PreflightError(f"{fitted.message}. {exc.message}", exc.hint) from None
            raise
        placement = place(deployment, asked, facts, replace=True, where=where)  # GPUs it lacks still raise
        refused = Verdict("error", "placement", f"{exc.message} {exc.hint}")  # the fit's own verdict says why
    indices = placement.gpus if asked is not None else None
    stopping = stopped_with(facts, deployment, indices)
    replacing = [o.name for o in placement.replaces] if replace else []  # `fleet plan`'s refusal: not stopped
    port, moved = port_for(deployment, playbook.spec.port, facts, host.settings.bind_address, stopping, replacing)
    result = build_plan(host, playbook, facts, path, signatures, indices, port, deployment, nodes, told, dp)
    if refused is not None:
        result = replace_field(result, verdicts=(refused, *result.verdicts))
    if fitted is not None:
        result = replace_field(result, verdicts=(fitted, *result.verdicts))
    # `fleet plan` (show_refusal) lists the fit's verdict with the others: its line does not say it again
    how = "; ".join(x for x in (fitted.message if fitted and not show_refusal else "", placement.how, moved) if x)
    return Placed(placement, indices, result, how)


def _wants_pull(runtime: Container | None, facts: HostFacts) -> TypeGuard[Container]:
    """The runtime's pull: says to pull its image now (missing: only when the host lacks it)."""
    c = facts.container
    if runtime is None or c is None or not c.cli or runtime.pull == "never":
        return False
    return runtime.pull == "always" or not c.image_present


def pull_image(t: Transport, cli: str, runtime: Container, progress: events.Sink) -> bool:
    """Pull an image the host lacks (the runtime's pull: missing/always), its output streamed as it comes;
    whether it worked. Nothing is stopped before: a failed pull leaves the image missing, which pre-flight
    then refuses with its reason."""
    buf = b""

    def on_chunk(chunk: bytes) -> bool:
        nonlocal buf
        buf += chunk
        *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
        for line in lines:
            if line.strip():
                progress(events.Pulling(runtime.image, line.decode("utf-8", "replace")))
        return True

    code = t.stream(f"{shlex.quote(cli)} pull {shlex.quote(runtime.image)} 2>&1", on_chunk, timeout_s=3600)
    return code == 0


# The playbook lays its GPUs out in its own flags (a hand-written command line): placement leaves it every GPU.
PARALLEL_FLAGS = (
    "--tp-size",
    "--tensor-parallel-size",
    "--dp-size",
    "--data-parallel-size",
    "--pp-size",
    "--pipeline-parallel-size",
)


def takes_free_gpus(playbook: NamedPlaybook) -> bool:
    """Whether the playbook leaves its GPUs to the host's free ones (fleet.plan.whole_box): gpus: and tp:
    left out, and a command line that does not lay them out itself (TP, DP or PP in extra_args; literal:)."""
    spec = playbook.spec
    named = args_dict(list(spec.extra_args))
    return spec.gpus is None and not spec.tp and not spec.literal and not any(f in named for f in PARALLEL_FLAGS)


def _asked(
    playbook: NamedPlaybook, facts: HostFacts, path: str, nodes: int, deployment: str, replace: bool
) -> tuple[int | tuple[int, ...] | None, Verdict | None, int]:
    """The playbook's gpus: as a placement, why (a warning when nothing the host has holds the model), and
    the data-parallel replicas to run on it. Left out, gpus: is tp:'s count when tp: is set, every GPU when
    the command line names its TP itself (extra_args, literal:) or the ranks of a group run here (all of
    each host's), else the host's free GPUs used as fleet.plan.whole_box says; `gpus: fit` is the count
    the model needs (fleet.plan.fit). None: every GPU, CUDA_VISIBLE_DEVICES unset."""
    spec = playbook.spec
    value = spec.gpus
    if value == "all" or nodes > 1:
        return None, None, 1
    if isinstance(value, list):
        return tuple(value), None, 1
    if isinstance(value, int):
        return value, None, 1
    if value is None:
        if spec.tp:
            return spec.tp, Verdict("info", "gpus", f"gpus: left out: {spec.tp} GPUs for tp: {spec.tp}"), 1
        if not takes_free_gpus(playbook):
            return None, None, 1
    gpus = gpu_summary(facts)
    model = model_spec(facts, path)
    said = "gpus: fit" if value == "fit" else "gpus: left out, so the host's free GPUs"
    if gpus is None or model is None:  # pre-flight says what is missing; the plan takes every GPU meanwhile
        return None, Verdict("info", "gpus-fit", f"{said}: no GPUs or model to fit; all GPUs"), 1
    speculative = bool(spec.speculative and spec.speculative.enabled)
    install = facts.engines.get(spec.engine)
    version = parse_version(install.version) if install else None

    def fit_on(available: int) -> Fit:
        return fit_gpus(
            model, gpus.memory_mib, available, spec.context_length, spec.mem_fraction, speculative, spec.engine, version
        )

    fit = fit_on(gpus.count)
    if value is None:
        reaches = (FREE, WITH_STALE, WITH_REPLACED) if replace else (FREE, WITH_STALE)
        counts = {reach: len(free_gpus(facts, deployment, reach)) for reach in reaches}
        # the narrowest set that holds the model: nothing is stopped that it makes needless; none: the free
        fits = {r: fit_on(n) for r, n in counts.items() if n}
        reach = next((r for r in reaches if r in fits and fits[r].fits), FREE)
        free, fits_free = counts[reach], fits.get(reach)
        if fits_free is None or (not fits_free.fits and free < fit.gpus):
            # they do not hold it: ask for what it needs of the host, and placement says who holds the rest
            why = f"{said}: {free} free, and it needs more: {fit.why}"
            return fit.gpus, Verdict("info" if fit.fits else "warning", "gpus-fit", why), 1
        shape = whole_box(model, free, gpus.nvlink, fits_free)
        held = "" if reach == FREE else f" ({reach}: the free ones alone do not hold it)"
        why = f"{said}{held}: {shape.why} (gpus: fit takes as few as the model needs)"
        return shape.gpus, Verdict("info" if shape.fits else "warning", "gpus-fit", why), shape.dp
    level = "info" if fit.fits else "warning"
    rest = gpus.count - fit.gpus
    left = f"; the host's other {rest} are left for other deployments or replicas (gpus: all takes every GPU)"
    return fit.gpus, Verdict(level, "gpus-fit", f"{said}: {fit.why}{left if rest else ''}"), 1


# Checks that say whether the recorded server itself is up and answering; the rest (load, disks, GPU
# faults) is not something a restart of this server would change.
SERVER_CHECKS = frozenset({"server", "container", "drift", "port", "http_health", "models", "generation", "crash_log"})
# What must have run and passed before a running server is kept instead of restarted.
ADOPTION_PROOF = frozenset({"server", "http_health", "generation"})


def _runs_this_plan(st: dict[str, Any], facts: HostFacts, plan: LaunchPlan, playbook_name: str) -> bool:
    """The deployment's recorded server (`st`) was started from exactly this plan (argv, environment,
    secret names), was last seen ready, and its process is still there."""
    old, new = st.get("plan") or {}, plan.to_json()

    def env(p: dict[str, Any]) -> list[tuple[Any, Any]]:
        return sorted((e.get("name"), e.get("value")) for e in p.get("env", []))

    return (
        st.get("status") == READY
        and st.get("playbook") == playbook_name
        and old.get("argv") == new["argv"]
        and old.get("engine_version") == new.get("engine_version")  # the same argv may run another version
        and env(old) == env(new)
        and old.get("secret_env", []) == new["secret_env"]
        and old.get("container") == new.get("container")  # the same image (by id), options and run
        and any(p.pid == st.get("pid") for p in facts.servers)
    )


def _ran_before(st: dict[str, Any], plan: LaunchPlan) -> bool:
    """This exact command line already ran to readiness on this host with this engine version: the
    engine's own argument check (a cold import of the engine, seconds on a real box) cannot say anything new."""
    recorded = st.get("plan") or {}
    return (
        st.get("status") in (READY, STOPPED)
        and recorded.get("argv") == plan.argv()
        and st.get("engine_version") == show_version(plan.engine_version)
        and recorded.get("container") == (plan.to_json().get("container"))  # not another image of that version
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


def _adopt(
    t: Transport,
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
    from fleet.control.sweep import HealthOptions, check_host

    started = time.monotonic()
    key = api_key_name(plan.argv())
    health = check_host(t, host, HealthOptions(secrets=secrets, api_keys={playbook_name: key} if key else {}))
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
        round_trips=t.commands_run,
        adopted=True,
        deployment=deployment,
    )


def _learned_as_json(facts: HostFacts, key: str, signatures: Sequence[Signature] | None = None) -> list[dict[str, Any]]:
    """The host's learned fixes for `key` that the knowledge base still backs, as the watcher writes them."""
    return [
        {"signature": lf.signature, "fix": lf.fix.to_json(), "learned_at": lf.learned_at}
        for lf in learned_fixes(facts, key, signatures)
    ]


def _kill_policy(host: Host, force: bool) -> str:
    return "force" if force else host.settings.kill_policy


def recorded_pgid(st: dict[str, Any]) -> int | None:
    pgid = st.get("pgid")
    return int(pgid) if isinstance(pgid, int) else None


def plan_from_state(state: dict[str, Any]) -> LaunchPlan:
    """The plan a host recorded when it was last deployed (what `restart` runs again)."""
    p = state["plan"]
    flags = tuple(
        Flag(f["flag"], f["value"], f["rule"], f["reason"], f.get("source", ""), f.get("replaces", ""))
        for f in p["flags"]
    )
    from fleet.plan import EnvVar

    return LaunchPlan(
        engine=p["engine"],
        engine_version=parse_version(p.get("engine_version")),
        python=p["argv"][0],
        model_path=str(next((f.value for f in flags if f.name in ("--model-path", "--model")), "")),
        served_name=p["served_name"],
        port=int(p["port"]),
        check_address=state.get("check_address", "127.0.0.1"),
        flags=flags,
        env=tuple(EnvVar(e["name"], e["value"], e["rule"], e["reason"]) for e in p["env"]),
        secret_env=tuple(p.get("secret_env", [])),
        verdicts=(),
        applied_fixes=tuple(p.get("applied_fixes", [])),
        container=ContainerPlan.from_json(p["container"]) if p.get("container") else None,
        task=str(p.get("task") or GENERATE),
    )


def chosen_deployment(facts: HostFacts, name: str | None, *, verb: str) -> str:
    """The deployment a one-deployment command acts on: `name`, or the host's only one."""
    names = sorted(n for n, d in facts.remote.deployments.items() if d.state.get("plan"))
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
    planned = sorted(n for n, d in facts.remote.deployments.items() if d.state.get("plan"))
    running = [n for n in planned if facts.remote.deployments[n].state.get("status") != STOPPED]
    return running if len(planned) > 1 else planned


def recorded_names(facts: HostFacts) -> list[str]:
    """Every deployment the host has a record of (a plan, a lock, an error), by name."""
    return sorted(facts.remote.deployments)


def restart(
    t: Transport,
    host: Host,
    *,
    force: bool,
    progress: events.Sink,
    signatures: Sequence[Signature] | None = None,
    name: str | None = None,
    state: dict[str, Any] | None = None,
    drain_s: float = DRAIN_S,
    heal: bool = False,
) -> DeployResult:
    """Redeploy a deployment's recorded plan on the GPUs it was placed on (`name`: the host's only one);
    `state`: another record of it to redeploy instead (a service's last good one, for --rollback).
    `heal`: `fleet health --heal` asks; a deployment an operator stopped is not restarted, also when the
    stop lands after the check (the host decides that under its lock)."""
    state_facts = read_facts(t, host)
    deployment = chosen_deployment(state_facts, name, verb="restart")
    state = state if state is not None else recorded(state_facts, deployment)
    group = state.get("group")
    if isinstance(group, dict):  # one rank alone cannot rejoin the others: the group restarts as a whole
        raise ConfigError(
            f"{host.name}: deployment {deployment} is rank {group.get('rank')} of a group over "
            f"{', '.join(map(str, group.get('hosts') or []))}; a rank is never restarted alone.",
            f"Relaunch the whole group: fleet deploy {state.get('playbook') or 'PLAYBOOK'}.",
        )
    if not state.get("plan"):
        raise ConfigError(
            f"{host.name}: nothing recorded to restart for deployment {deployment}.",
            "Run `fleet deploy PLAYBOOK --host HOST` first (fleet status lists the deployments).",
        )
    try:
        plan = plan_from_state(state)
        smoke = dict(state["smoke"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:  # a record edited or cut short
        raise ConfigError(
            f"{host.name}: the recorded deployment is damaged ({type(exc).__name__}: {exc}); nothing was changed.",
            f"Deploy again: fleet deploy PLAYBOOK --host {host.name}.",
        ) from exc
    placed = DeploymentRecord(deployment, state).gpus  # where that record's server ran
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
    secrets = read_secrets(plan.secret_env, str(state.get("playbook")))
    deployer = Deployer(
        t,
        host,
        playbook_name=str(state.get("playbook", "recorded")),
        smoke=smoke,
        kill_policy=_kill_policy(host, force),
        secrets=secrets,
        progress=progress,
        signatures=signatures,
        deployment=deployment,
        gpus=placed,
        drain_s=drain_s,
        command="heal" if heal else "deploy",
        **recorded_bounds(state),
    )
    key = str(state.get("learned_key", ""))
    existing = _learned_as_json(facts, key, signatures)
    wishes = Wishes(engine=plan.engine, served_name=plan.served_name, port=plan.port)
    return deployer.run(plan, model, gpus, wishes, learned_key=key, learned_existing=existing)


def stop(t: Transport, host: Host, *, force: bool, name: str | None = None) -> ActResult:
    """Stop one deployment (`name`), or every deployment on the host and any stale engine (None)."""
    facts = read_facts(t, host)
    if name is not None and name not in facts.remote.deployments:
        known = ", ".join(recorded_names(facts)) or "none"
        raise ConfigError(
            f"{host.name}: no deployment named {name} (deployments there: {known}); nothing was stopped.",
            f"`fleet status --host {host.name}` lists them; `fleet stop --host {host.name}` stops every one.",
        )
    names = [name] if name is not None else recorded_names(facts)
    merged: ActResult = {"ended": [], "left": [], "refused": []}
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
    if busy:
        stopped = ", ".join(str(p.get("pid")) for p in merged["ended"]) or "nothing"
        raise LockedError(
            "; ".join(exc.message for exc in busy) + f" Stopped the rest (pids {stopped}).",
            busy[0].hint,
        )
    return merged


def _stop_one(
    t: Transport, host: Host, facts: HostFacts, deployment: str, *, force: bool, everything: bool
) -> ActResult:
    state = recorded(facts, deployment)
    placed = facts.remote.deployment(deployment).gpus
    deployer = Deployer(
        t,
        host,
        playbook_name=str(state.get("playbook", "-")),
        smoke={},
        kill_policy=_kill_policy(host, force),
        secrets={},
        deployment=deployment,
        gpus=None if everything else placed,
    )
    args = {
        "lock": deployer._lock_args("stop"),
        "free": deployer._free_args(state.get("port")),
        "state_update": {**state, "status": STOPPED, "updated": time.time()} if state else None,
        "release_lock": True,
    }
    out = act_answer(run_json(t, step_python(host), "act", args))
    refuse_unless_taken(host.name, deployment, out["lock"])
    return out  # holders that are not fleet's are in out["refused"]: reported, left running


def status_rows(host: Host, facts: HostFacts) -> list[dict[str, Any]]:
    """One row per deployment on the host (one saying "none" when it has none)."""
    names = recorded_names(facts)
    return [status_row(host, facts, n) for n in names] if names else [status_row(host, facts, None)]


def status_row(host: Host, facts: HostFacts, deployment: str | None) -> dict[str, Any]:
    record = facts.remote.deployment(deployment) if deployment else None
    st = dict(record.state) if record else {}
    pid = st.get("pid")
    alive = any(p.pid == pid for p in facts.servers) if isinstance(pid, int) else False
    main = next((p for p in facts.servers if p.pid == pid), None)
    uptime = facts.uptime_s(main) if main else None
    status = st.get("status", "unreadable" if record and record.state_error else "none")
    if (status == READY or (status in (STARTING, UNVERIFIED) and isinstance(pid, int))) and not alive:
        status = DEAD  # also "starting" with its engine gone: it crashed, or the run launching it died
    gpus = record.gpus if record else None
    return {
        "host": host.name,
        "deployment": deployment,
        "gpus": list(gpus) if gpus is not None else ("all" if st else None),
        "playbook": st.get("playbook"),
        "engine": st.get("engine"),
        "engine_version": st.get("engine_version"),
        "pid": pid if alive else None,  # fleet's launcher: the process group it records and stops
        "engine_pid": engine_pid(facts, pid) if alive and isinstance(pid, int) else None,
        "port": st.get("port"),
        "uptime_s": round(uptime) if uptime is not None else None,
        "status": status,
        "attempts": st.get("attempts") or st.get("attempt"),
        "last_outcome": st.get("reason") or status,
        "applied_fixes": st.get("applied_fixes", []),
        "container": (st.get("container") or {}).get("name") if isinstance(st.get("container"), dict) else None,
        "other_servers": len([p for p in facts.servers if p.pgid not in _recorded_groups(facts)]),
        "group": _group_said(st),
        # while it starts: its phase and ETA, as its watcher on the host last said them
        "startup": phase_now(record.phase, st.get("run_id"), facts.time) if record and status == STARTING else None,
    }


def engine_pid(facts: HostFacts, launcher: int) -> int:
    """The engine's own process under fleet's launcher (the pid `nvidia-smi` and `fleet stop` show), or
    the launcher's when it has none (yet)."""
    child = next((p for p in facts.servers if p.ppid == launcher and p.engine), None)
    return child.pid if child else launcher


def _group_said(st: dict[str, Any]) -> str | None:
    """`rank 1 of 2 (node-a, node-b)` for a rank of a group (one model over several hosts)."""
    g = st.get("group")
    if not isinstance(g, dict) or not isinstance(g.get("hosts"), list):
        return None
    return f"rank {g.get('rank')} of {len(g['hosts'])} ({', '.join(map(str, g['hosts']))})"


def _recorded_groups(facts: HostFacts) -> set[int]:
    return {d.state["pgid"] for d in facts.remote.deployments.values() if isinstance(d.state.get("pgid"), int)}
