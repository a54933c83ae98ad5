"""Playbooks placed on several hosts (`hosts:`, one model over them): what `fleet plan`, `deploy`, `stop` and
`health` do with one. The commands themselves live with the single-host ones (cli/hosts.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from fleet.cli.base import Invocation, emit_json, say, transport_for
from fleet.cli.report import attempt_json, describe_host_stop, progress_for

if TYPE_CHECKING:
    from fleet.control.group import GroupResult, GroupRun
    from fleet.health import HostHealth
    from fleet.inventory import NamedPlaybook


def group_run(
    ctx: Invocation,
    playbook: NamedPlaybook,
    *,
    as_json: bool = False,
    show_log: bool = False,
    force: bool = False,
    engine_check: bool = True,
) -> GroupRun:
    from fleet.control.group import GroupRun
    from fleet.inventory import check_playbook_host

    check_playbook_host(playbook, ctx.inventory)
    return GroupRun(
        playbook,
        ctx.inventory,
        lambda host: transport_for(ctx, host),
        lambda where: progress_for(where, as_json=as_json, show_log=show_log),
        force=force,
        engine_check=engine_check,
        signatures=ctx.signatures,
    )


def refuse_single_host_options(**given: Any) -> None:
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v]
    if named:
        raise click.UsageError(
            f"{', '.join(named)}: the playbook is placed on its hosts: (one model over several hosts); "
            "it runs on all of their GPUs, under its own name."
        )


def plan_group(ctx: Invocation, playbook: NamedPlaybook, as_json: bool) -> None:
    results, problems = group_run(ctx, playbook).plan()
    hosts = playbook.spec.hosts or []
    if as_json:
        emit_json(
            {
                "playbook": playbook.name,
                "hosts": hosts,
                "ranks": [
                    {
                        "rank": i,
                        "host": host,
                        "plan": r.plan.to_json() if r.plan else None,
                        "verdicts": [vars(v) for v in r.verdicts],
                    }
                    for i, (host, r) in enumerate(zip(hosts, results, strict=True))
                ],
                "refused": problems,
            }
        )
    else:
        from fleet.render import render_plan

        for i, (host, r) in enumerate(zip(hosts, results, strict=True)):
            say(f"rank {i} of {len(hosts)}:")
            render_plan(r, host, playbook.name)
        for problem in problems:
            say(f"refused: {problem}", err=True)
    if problems or any(r.errors for r in results):
        raise click.exceptions.Exit(4)


def deploy_group(
    ctx: Invocation, playbook: NamedPlaybook, *, force: bool, engine_check: bool, as_json: bool, show_log: bool
) -> None:
    run = group_run(ctx, playbook, as_json=as_json, show_log=show_log, force=force, engine_check=engine_check)
    result = run.deploy()
    if as_json:
        emit_json(group_result_json(result))
    else:
        print_group_result(result)
    if not result.ok:
        raise click.exceptions.Exit(4 if result.refused_before_stopping else 7)


def stop_group(ctx: Invocation, playbook: NamedPlaybook, force: bool) -> None:
    from fleet.control.group_health import stop_group as stop_every_rank

    for host, out in stop_every_rank(group_run(ctx, playbook, force=force)):
        say(describe_host_stop(host, out))


def print_group_result(r: GroupResult) -> None:
    over = f"{r.playbook} over {', '.join(r.hosts)}"
    if r.ok:
        fixes = [a.fix for a in r.attempts if a.fix]
        said = f"; relaunched whole: {', '.join(fixes)}" if fixes else ""
        say(f"{over} is up at {r.endpoint} after {len(r.attempts)} attempt(s){said}.")
        return
    say(f"{over} FAILED after {len(r.attempts)} attempt(s): {r.reason}", err=True)
    d = r.attempts[-1].diagnosis if r.attempts else None
    if d is not None:
        say(f"  diagnosis: {d.category}{' (' + d.signature + ')' if d.signature else ''}: {d.explanation}", err=True)
        for line in d.evidence:
            say(f"  evidence: {line}", err=True)
    if r.failed_rank is not None:
        say(f"  last log lines of rank {r.failed_rank.rank} ({r.failed_rank.host}):", err=True)
        for line in r.failed_rank.lines[-30:]:
            say(f"    {line}", err=True)
    if r.not_stopped:
        say(f"  NOT stopped: {'; '.join(r.not_stopped)} — run fleet stop {r.playbook} once it is reachable.", err=True)
    else:
        say("  every rank was stopped: a group is never left half up.", err=True)


def group_result_json(r: GroupResult) -> dict[str, Any]:
    failed = r.failed_rank
    return {
        "playbook": r.playbook,
        "hosts": r.hosts,
        "ok": r.ok,
        "reason": r.reason,
        "endpoint": r.endpoint,
        "attempts": [attempt_json(a) for a in r.attempts],
        "failed_rank": {"rank": failed.rank, "host": failed.host, "ended": failed.ended} if failed else None,
        "not_stopped": r.not_stopped,
    }


def groups_here(ctx: Invocation) -> list[NamedPlaybook]:
    """The playbooks with hosts: whose hosts are all in this inventory (another inventory is another fleet)."""
    from fleet.errors import FleetError

    out = []
    for path in sorted(ctx.playbooks_dir.glob("*.yaml")) if ctx.playbooks_dir.is_dir() else []:
        try:
            pb = ctx.playbook(path.stem)
        except FleetError:
            continue  # a broken playbook is reported when it is used
        if pb.spec.hosts and all(h in ctx.inventory.hosts for h in pb.spec.hosts):
            out.append(pb)
    return out


def group_health(ctx: Invocation, heal: bool, hosts_checked: Sequence[HostHealth] = ()) -> list[HostHealth]:
    """Each group that is deployed as one result named group/NAME: every rank alive and ready, and rank 0's
    server sound as its host's check found it (`hosts_checked`); with --heal a broken group is relaunched
    whole."""
    from fleet.control.group_health import group_health as group_health_of
    from fleet.errors import FleetError
    from fleet.health import UNKNOWN, HostHealth
    from fleet.health.checks import Check

    out: list[HostHealth] = []
    for pb in groups_here(ctx):
        try:
            rank0 = next((r for r in hosts_checked if r.host == (pb.spec.hosts or [""])[0]), None)
            problems = [
                f"{c.name}: {c.detail}"
                for c in (rank0.checks if rank0 else ())
                if c.deployment == pb.name and c.status == "critical"
            ]
            h = group_health_of(group_run(ctx, pb), heal=heal, rank0_problems=problems)
        except FleetError as exc:
            out.append(HostHealth(f"group/{pb.name}", UNKNOWN, (Check("group", UNKNOWN, exc.message),)))
            continue
        if h is not None:
            out.append(
                HostHealth(f"group/{pb.name}", h.status, tuple(h.checks), h.status == "ok", pb.name, heal=h.heal)
            )
    return out
