"""Commands built on the deploy machinery: deploy, restart, stop, status, logs."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from typing import Any

from fleet import events
from fleet.control.answers import act_answer, locked, unwritable_state_dir
from fleet.control.deploy import Deployer, DeployResult, plan_or_refuse, recorded
from fleet.control.gather import model_path, read_facts
from fleet.crashes import Signature
from fleet.errors import ConfigError, FleetError
from fleet.facts import HostFacts
from fleet.health import HostHealth
from fleet.hostscripts import run_json
from fleet.inventory import Host, NamedPlaybook
from fleet.model import parse_model_spec
from fleet.plan import Flag, LaunchPlan, Wishes, parse_version, show_version
from fleet.plan.build import gpu_summary, learned_fixes
from fleet.protocol import ActResult
from fleet.secrets import read_secrets
from fleet.transport import Transport


def _smoke(playbook: NamedPlaybook) -> dict[str, Any]:
    s = playbook.spec.smoke
    return {"prompt": s.prompt, "expect": s.expect, "max_tokens": s.max_tokens}


def deploy(
    t: Transport,
    host: Host,
    playbook: NamedPlaybook,
    *,
    force: bool,
    engine_check: bool,
    progress: events.Sink,
    signatures: Sequence[Signature] | None = None,
) -> DeployResult:
    path = model_path(host, playbook.spec.model)
    facts = read_facts(t, host, model=path, engine=playbook.spec.engine)
    result = plan_or_refuse(host, playbook, facts, path, signatures)
    assert result.plan and result.model and result.gpus
    progress(events.Planned(result.model.describe(), result.plan.argv(), list(result.plan.applied_fixes)))
    secrets = read_secrets(playbook.spec.secret_env, playbook.name)
    if _runs_this_plan(facts, result.plan, playbook.name):
        adopted = _adopt(t, host, playbook.name, result.plan, recorded(facts).get("pid"), progress, secrets)
        if adopted is not None:
            return adopted
    if engine_check and _ran_before(facts, result.plan):
        engine_check = False
        progress(events.EngineCheckSkipped(show_version(result.plan.engine_version)))
    deployer = Deployer(
        t,
        host,
        playbook_name=playbook.name,
        smoke=_smoke(playbook),
        kill_policy=_kill_policy(host, force),
        secrets=secrets,
        progress=progress,
        engine_check=engine_check,
        max_attempts=playbook.spec.max_attempts,
        ready_timeout_s=playbook.spec.ready_timeout_s,
        signatures=signatures,
    )
    existing = _learned_as_json(facts, result.learned_key, signatures)
    return deployer.run(
        result.plan,
        result.model,
        result.gpus,
        result.wishes,
        learned_key=result.learned_key,
        learned_existing=existing,
        recorded_pgid=_recorded_pgid(facts),
    )


# Checks that say whether the recorded server itself is up and answering; the rest (load, disks, GPU
# faults) is not something a restart of this server would change.
SERVER_CHECKS = frozenset({"server", "drift", "port", "http_health", "models", "generation", "crash_log"})
# What must have run and passed before a running server is kept instead of restarted.
ADOPTION_PROOF = frozenset({"server", "http_health", "generation"})


def _runs_this_plan(facts: HostFacts, plan: LaunchPlan, playbook_name: str) -> bool:
    """The host's recorded server was started from exactly this plan (argv, environment, secret names),
    was last seen ready, and its process is still there."""
    st = recorded(facts)
    old, new = st.get("plan") or {}, plan.to_json()

    def env(p: dict[str, Any]) -> list[tuple[Any, Any]]:
        return sorted((e.get("name"), e.get("value")) for e in p.get("env", []))

    return (
        st.get("status") == "ready"
        and st.get("playbook") == playbook_name
        and old.get("argv") == new["argv"]
        and env(old) == env(new)
        and old.get("secret_env", []) == new["secret_env"]
        and any(p.pid == st.get("pid") for p in facts.servers)
    )


def _ran_before(facts: HostFacts, plan: LaunchPlan) -> bool:
    """This exact command line already ran to readiness on this host with this engine version: the
    engine's own argument check (a cold import of the engine, seconds on a real box) cannot say anything new."""
    st = recorded(facts)
    return (
        st.get("status") in ("ready", "stopped")
        and (st.get("plan") or {}).get("argv") == plan.argv()
        and st.get("engine_version") == show_version(plan.engine_version)
    )


def adoption_problems(health: HostHealth) -> list[str]:
    """Why a running server may not be kept as it is; empty when it proved itself. A check that did not
    run proves nothing: a probe that failed on the host returns no server checks at all, and must not
    read as a server that passed them."""
    from fleet.health import OK

    failing = [c for c in health.checks if c.name in SERVER_CHECKS and c.status != OK]
    passed = {c.name for c in health.checks if c.status == OK}
    problems = [f"{c.name}: {c.detail}" for c in failing]
    problems += [f"{name}: not checked" for name in sorted(ADOPTION_PROOF - passed - {c.name for c in failing})]
    if problems:
        problems += [f"{c.name}: {c.detail}" for c in health.checks if c.name not in SERVER_CHECKS and c.status != OK]
    return problems


def _adopt(
    t: Transport,
    host: Host,
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
    health = check_host(t, host, HealthOptions(secrets=secrets))
    problems = adoption_problems(health)
    if problems:
        progress(events.NotAdopted(list(problems)))
        return None
    progress(events.Adopted(pid, [f"{c.name}: {c.detail}" for c in health.checks if c.name in SERVER_CHECKS]))
    return DeployResult(
        host=host.name,
        playbook=playbook_name,
        ok=True,
        attempts=[],
        plan=plan,
        reason="already running this plan and answering correctly; nothing was restarted",
        endpoint=f"http://{plan.check_address}:{plan.port}",
        ready_s=time.monotonic() - started,
        learned_applied=plan.applied_fixes,
        round_trips=t.commands_run,
        adopted=True,
    )


def _learned_as_json(facts: HostFacts, key: str, signatures: Sequence[Signature] | None = None) -> list[dict[str, Any]]:
    """The host's learned fixes for `key` that the knowledge base still backs, as the watcher writes them."""
    return [
        {"signature": lf.signature, "fix": lf.fix.to_json(), "learned_at": lf.learned_at}
        for lf in learned_fixes(facts, key, signatures)
    ]


def _kill_policy(host: Host, force: bool) -> str:
    return "force" if force else host.settings.kill_policy


def _recorded_pgid(facts: HostFacts) -> int | None:
    pgid = recorded(facts).get("pgid")
    return int(pgid) if isinstance(pgid, int) else None


def plan_from_state(state: dict[str, Any]) -> LaunchPlan:
    """The plan a host recorded when it was last deployed (what `restart` runs again)."""
    p = state["plan"]
    flags = tuple(Flag(f["flag"], f["value"], f["rule"], f["reason"], f.get("source", "")) for f in p["flags"])
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
    )


def restart(
    t: Transport, host: Host, *, force: bool, progress: events.Sink, signatures: Sequence[Signature] | None = None
) -> DeployResult:
    state_facts = read_facts(t, host)
    state = recorded(state_facts)
    if not state.get("plan"):
        raise ConfigError(
            f"{host.name}: nothing recorded to restart (no fleet deployment on this host).",
            "Run `fleet deploy PLAYBOOK --host HOST` first.",
        )
    try:
        plan = plan_from_state(state)
        smoke = dict(state["smoke"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:  # a record edited or cut short
        raise ConfigError(
            f"{host.name}: the recorded deployment is damaged ({type(exc).__name__}: {exc}); nothing was changed.",
            f"Deploy again: fleet deploy PLAYBOOK --host {host.name}.",
        ) from exc
    facts = read_facts(t, host, model=plan.model_path, engine=plan.engine)
    if facts.model is None or not facts.model.exists or not facts.gpus:
        raise ConfigError(f"{host.name}: the recorded model {plan.model_path} or the GPUs are gone.", "Redeploy.")
    model = parse_model_spec(plan.model_path, facts.model.config, facts.model.quant_config, facts.model.weights_bytes)
    gpus = gpu_summary(facts)
    assert gpus is not None
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
    )
    key = str(state.get("learned_key", ""))
    existing = _learned_as_json(facts, key, signatures)
    wishes = Wishes(engine=plan.engine, served_name=plan.served_name, port=plan.port)
    return deployer.run(
        plan, model, gpus, wishes, learned_key=key, learned_existing=existing, recorded_pgid=_recorded_pgid(facts)
    )


def stop(t: Transport, host: Host, *, force: bool) -> ActResult:
    facts = read_facts(t, host)
    state = recorded(facts)
    port = state.get("port")
    deployer = Deployer(
        t,
        host,
        playbook_name=str(state.get("playbook", "-")),
        smoke={},
        kill_policy=_kill_policy(host, force),
        secrets={},
    )
    args = {
        "lock": deployer._lock_args("stop"),
        "free": deployer._free_args(port, _recorded_pgid(facts)),
        "state_update": {**state, "status": "stopped", "updated": time.time()} if state else None,
        "release_lock": True,
    }
    python = next(iter(host.settings.engines.values()), "python3")
    out = act_answer(run_json(t, python, "act", args))
    if out["lock"]["status"] == "unwritable":
        raise unwritable_state_dir(host.name, out["lock"])
    if out["lock"]["status"] == "held":
        lock = out["lock"]
        raise locked(host.name, lock)
    return out  # holders that are not fleet's are in out["refused"]: reported, left running


def status_row(host: Host, facts: HostFacts) -> dict[str, Any]:
    st = recorded(facts)
    pid = st.get("pid")
    alive = any(p.pid == pid for p in facts.servers) if isinstance(pid, int) else False
    main = next((p for p in facts.servers if p.pid == pid), None)
    uptime = facts.uptime_s(main) if main else None
    status = st.get("status", "unreadable" if facts.remote.state_error else "none")
    if (status == "ready" or (status in ("starting", "unverified") and isinstance(pid, int))) and not alive:
        status = "dead"  # also "starting" with its engine gone: it crashed, or the run launching it died
    return {
        "host": host.name,
        "playbook": st.get("playbook"),
        "engine": st.get("engine"),
        "engine_version": st.get("engine_version"),
        "pid": pid if alive else None,
        "port": st.get("port"),
        "uptime_s": round(uptime) if uptime is not None else None,
        "status": status,
        "attempts": st.get("attempts") or st.get("attempt"),
        "last_outcome": st.get("reason") or status,
        "applied_fixes": st.get("applied_fixes", []),
        "other_servers": len([p for p in facts.servers if p.pgid != st.get("pgid")]),
    }


NO_SERVER_LOG = 3  # the logs script's exit code when the host has no server log yet


def logs_script(log_dir: str, name: str | None, lines: int, follow: bool) -> str:
    d = log_dir.replace("~/", "$HOME/", 1) if log_dir.startswith("~/") else shlex.quote(log_dir)
    pick = f"f={d}/{shlex.quote(name)}.latest.log" if name else f"f=$(ls -t {d}/*.latest.log 2>/dev/null | head -n 1)"
    follow_flag = "-F" if follow else ""
    return f'{pick}\n[ -n "$f" ] && [ -e "$f" ] || exit {NO_SERVER_LOG}\nexec tail -n {int(lines)} {follow_flag} "$f"\n'


def logs(t: Transport, host: Host, *, lines: int, follow: bool, sink: Callable[[bytes], bool]) -> int:
    """Print (or follow) the newest server log on the host: one round trip, streamed as written."""
    code = t.stream(logs_script(host.settings.log_dir, None, lines, follow), sink, timeout_s=10**7 if follow else 60)
    if code == NO_SERVER_LOG:
        raise FleetError(
            f"{host.name}: no server log in {host.settings.log_dir} yet.",
            f"fleet writes one when it deploys: fleet deploy PLAYBOOK --host {host.name}",
        )
    return code
