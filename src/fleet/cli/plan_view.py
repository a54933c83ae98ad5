"""`fleet plan`: the exact command line a deploy would run, each flag with its reason; with --engine an
upgrade's diff, with --check the engine's own verdict on the host. Nothing on the host is changed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fleet.cli import complete
from fleet.cli.base import Invocation, cli, emit_json, parse_gpus, say, split_deployment, transport_for
from fleet.cli.complete import host_option
from fleet.cli.report import describe_change, describe_resolved

if TYPE_CHECKING:
    from fleet.inventory import Host
    from fleet.protocol import Premises


@cli.command()
@click.argument("playbook", shell_complete=complete.playbooks)
@host_option(help="Inventory host (default: the playbook's default_host).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--name", "deployment", help="The deployment's name on the host (default: the playbook's).")
@click.option("--gpus", help="Place it: a count (4) or GPU indices (6,7; one as device=3). Overrides gpus:.")
@click.option("--engine", "engine_spec", help="Also plan with this engine version (sglang==0.5.23): an upgrade's diff.")
@click.option(
    "--diff", "diff_only", is_flag=True, help="With --engine: print the diff alone, not today's plan after it."
)
@click.option(
    "--check",
    "engine_check",
    is_flag=True,
    help="Also run the engine's own check on the host and show what it resolves.",
)
@click.pass_obj
def plan(
    ctx: Invocation,
    playbook: str,
    host_name: str | None,
    as_json: bool,
    deployment: str | None,
    gpus: str | None,
    engine_spec: str | None,
    diff_only: bool,
    engine_check: bool,
) -> None:
    """Show the exact command line and environment `fleet deploy` would run, each flag with its reason.

    Gathers the host's facts in one round trip; changes nothing on the host. Exits 4 when pre-flight
    refuses the deployment.

    With --engine, the same deployment is also planned for that engine version, installed or not, and
    shown as a diff against today's plan: flags renamed, removed or newly set, and verdicts that differ
    (--diff: that alone).

    With --check, the engine's own check (the one a deploy runs before stopping anything) runs on the
    host for this command line: its verdict, and what it resolves for the settings the plan leaves to it.
    Nothing is locked, stopped or started. Exits 4 when the engine refuses it.

    \b
    Examples:
      fleet plan qwen35-nvfp4 --host blackwell
      fleet plan qwen36-27b --host ct129 --engine sglang==0.5.23 --diff
      fleet plan qwen36-27b --host ct129 --check
    """
    from fleet.control import placing
    from fleet.control.gather import model_path, read_facts
    from fleet.control.naming import deployment_name
    from fleet.inventory.runtime import chosen_runtime

    host_name, deployment = split_deployment(host_name, deployment)
    if diff_only and not engine_spec:
        from fleet.errors import ConfigError

        raise ConfigError("--diff shows an upgrade's diff: it needs --engine.", "Add --engine sglang==VERSION.")
    placement = parse_gpus(gpus)
    pb = ctx.playbook(playbook)
    if pb.spec.hosts:  # one model over several hosts: every rank's plan
        from fleet.cli.groups import plan_group, refuse_single_host_options

        refuse_single_host_options(host=host_name, name=deployment, gpus=gpus, engine=engine_spec, check=engine_check)
        plan_group(ctx, pb, as_json)
        return
    host = ctx.host(host_name, pb)
    name = deployment_name(deployment, pb)
    path = model_path(host, pb.spec.model)
    with transport_for(ctx, host) as t:
        f = read_facts(
            t, host, model=path, engine=pb.spec.engine, runtime=chosen_runtime(pb.spec.runtime, host.settings.runtime)
        )
    placed = placing.place_and_plan(
        host, pb, f, name, placement, replace=False, signatures=ctx.signatures, show_refusal=True
    )
    result = placed.result
    preview = _upgrade_preview(ctx, host, pb, f, name, placement, engine_spec, result.plan) if engine_spec else None
    # a plan pre-flight refuses is not the engine's to judge (a container's image may not even be there)
    checked = None
    if engine_check and result.plan and not result.errors and result.model and result.gpus:
        checked = _checked_on_host(ctx, host, pb, f, name, placement, result)
    if as_json:
        emit_json(_plan_json(host, pb, name, placed, preview, checked))
    else:
        _say_plan(host, pb, name, placed, preview, checked, diff_only)
    if result.errors or (checked is not None and checked["verdict"] == "rejected"):
        raise click.exceptions.Exit(4)


def _plan_json(
    host: Host, pb: Any, name: str, placed: Any, preview: dict[str, Any] | None, checked: dict[str, Any] | None
) -> dict[str, Any]:
    result = placed.result
    return {
        "host": host.name,
        "playbook": pb.name,
        "deployment": name,
        "placement": placed.how,
        "model": result.model.describe() if result.model else None,
        "plan": result.plan.to_json() if result.plan else None,
        "verdicts": [vars(v) for v in result.verdicts],
        "upgrade_preview": preview,
        "engine_check": checked,
    }


def _checked_on_host(
    ctx: Invocation, host: Host, pb: Any, f: Any, name: str, placement: Any, result: Any
) -> dict[str, Any]:
    """The engine's own check of the plan on the host; where the engine picks otherwise than fleet's table
    said, also the plan a deploy would make again on its picks."""
    from fleet.control import placing
    from fleet.plan import keyed_premises

    premises = keyed_premises(result.plan, result.model, result.gpus, result.wishes)
    checked = _engine_verdict(ctx, host, result.plan, premises)
    if checked["differ"]:  # what the deploy would do: plan again on the engine's own picks
        again = placing.place_and_plan(
            host,
            pb,
            f,
            name,
            placement,
            replace=False,
            signatures=ctx.signatures,
            show_refusal=True,
            told=checked["picks"],
        ).result
        if again.plan is not None:
            checked["replanned"] = {"picks": checked["differ"], "argv": again.plan.argv()}
            checked["change"] = describe_change(result.plan.engine_args(), again.plan.engine_args())
    return checked


def _say_plan(
    host: Host,
    pb: Any,
    name: str,
    placed: Any,
    preview: dict[str, Any] | None,
    checked: dict[str, Any] | None,
    diff_only: bool,
) -> None:
    from fleet.render import render_plan

    result = placed.result
    if preview is not None:  # what --engine asked for comes first; today's plan follows for reference
        say(f"upgrade preview: {preview['versions']} ({preview['installed']})")
        for line in preview["diff"] or ["(no difference in the command line, environment or verdicts)"]:
            say(f"  {line}")
        if preview.get("engine_check") is not None:
            _say_check("the engine's own check, in that version's environment", preview["engine_check"], "  ")
    if not diff_only or result.errors:  # a refusal is said whatever was asked
        if preview is not None:
            say("\ntoday's plan:")
        render_plan(result, host.name, pb.name)
        say(f"deployment {name} on {host.name}: {placed.how}")
    if checked is not None:
        _say_check(f"the engine's own check on {host.name}", checked, "")


def _say_check(title: str, check: dict[str, Any], indent: str) -> None:
    """The engine's own verdict, what it resolved, and what it said when it did not accept."""
    say(f"{indent}{title}: {check['verdict']}")
    if check.get("resolved"):
        say(f"{indent}  the engine resolved: {describe_resolved(check['resolved'])}")
    if check.get("replanned"):
        picks = ", ".join(f"{k} {v}" for k, v in check["replanned"]["picks"].items())
        say(f"{indent}  the engine picks {picks} itself here, not what fleet's table said: a deploy plans again")
        say(f"{indent}  on its picks before stopping anything: {check['change']}")
    if check["verdict"] != "accepted":
        for line in check["output"].splitlines():
            say(f"{indent}  {line}")


def _upgrade_preview(
    ctx: Invocation, host: Host, pb: Any, f: Any, name: str, placement: Any, spec: str, now: Any
) -> dict[str, Any]:
    """The deployment planned for another engine version, as a diff against today's plan."""
    from dataclasses import replace

    from fleet.control import placing
    from fleet.control.engines import parse_spec
    from fleet.crashes.signatures import knowledge_diff
    from fleet.errors import ConfigError
    from fleet.facts.parse import EngineInstall
    from fleet.plan.defaults import plan_default_changes
    from fleet.plan.diff import plan_diff, versions

    engine, version = parse_spec(spec)
    if engine != pb.spec.engine:
        raise ConfigError(f"--engine {spec}: {pb.name} runs {pb.spec.engine}, not {engine}.", "")
    install = f.engines.get(engine) or EngineInstall(engine, "python3", None, {}, None)
    managed = [e for e in f.raw.get("managed_engines") or [] if e.get("engine") == engine]
    env = next((e for e in managed if e.get("version") == version and e.get("whole")), None)
    if env is not None:  # planned as it would run: from that version's own environment
        install = replace(install, python=str(env["python"]))
        installed = f"installed: fleet engine use {spec} --host {host.name}, then fleet restart, applies it"
    else:
        installed = f"not installed: fleet engine install {spec} --host {host.name}"
    then_facts = replace(f, engines={**f.engines, engine: replace(install, version=version, error=None)})
    then = placing.place_and_plan(
        host, pb, then_facts, name, placement, replace=False, signatures=ctx.signatures, show_refusal=True
    ).result
    if now is None or then.plan is None:
        lines = [f"{v.level}: {v.message}" for v in then.errors] or ["no plan for one of the two versions"]
        return {"versions": f"{engine} -> {version}", "installed": installed, "diff": lines, "plan": None}
    check = _engine_verdict(ctx, host, then.plan) if env is not None and then.plan.container is None else None
    return {
        "versions": versions(now, then.plan),
        "installed": installed,
        "diff": plan_diff(now, then.plan)
        + plan_default_changes(then.model, then.gpus, now, then.plan)
        + knowledge_diff(ctx.signatures, engine, now.engine_version, then.plan.engine_version),
        "plan": then.plan.to_json(),
        "engine_check": check,
    }


def _engine_verdict(ctx: Invocation, host: Host, plan: Any, premises: Premises | None = None) -> dict[str, Any]:
    from fleet.control.engine_verdict import engine_verdict

    with transport_for(ctx, host) as t:
        return engine_verdict(t, plan, premises)
