"""`fleet fixes`: the fixes a host has learned (a crash fixed once is applied again on every deploy of the
same model, engine version and GPU model there), listed and forgotten."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from fleet.cli.base import Invocation, cli, each_host, emit_json, exit_for_failures, say
from fleet.cli.complete import host_option
from fleet.errors import ConfigError
from fleet.terminal import safe_line


@cli.group()
def fixes() -> None:
    """List or forget the fixes hosts have learned.

    \b
    Examples:
      fleet fixes list --all
      fleet fixes forget --host blackwell sglang-spec-hybrid-no-buffer
    """


def _rows(ctx: Invocation, table: Any) -> list[dict[str, Any]]:
    """The learned table as rows: each entry with its key's parts and whether today's knowledge still
    prescribes its fix (an entry it no longer knows is kept on the host and never applied)."""
    from fleet.crashes import known_fixes

    known = known_fixes(ctx.signatures)
    rows = []
    for key, entries in sorted(table.items()) if isinstance(table, dict) else []:
        parts = (str(key).split("|") + ["", "", "", "", ""])[:5]
        for e in entries if isinstance(entries, list) else []:
            if not isinstance(e, dict) or e.get("signature") == "engine-picks":
                continue
            signature = str(e.get("signature"))
            rows.append(
                {
                    "model": parts[1],
                    "engine": f"{parts[2]} {parts[3]}".strip(),
                    "gpu": parts[4],
                    "signature": signature,
                    "learned_at": str(e.get("learned_at", "?")),
                    "applied": signature in known,
                    "fix": known[signature].describe() if signature in known else None,
                }
            )
    return rows


@fixes.command("list")
@host_option(help="Inventory host or group.")
@click.option("--all", "all_hosts", is_flag=True, help="Every host in the inventory.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per fix.")
@click.pass_obj
def fixes_list(ctx: Invocation, host_name: str | None, all_hosts: bool, as_json: bool) -> None:
    """The fixes each host learned: model, engine, GPU, signature, when, and the fix applied today.
    Example: fleet fixes list --host blackwell"""
    from fleet.control.gather import read_facts

    results = each_host(ctx, host_name, all_hosts, lambda t, host: read_facts(t, host).remote.learned)
    failed = []
    for name, table, error in results:
        if error is not None:
            say(f"{name}: {error.message}", err=True)
            failed.append(error.exit_code)
            continue
        rows = _rows(ctx, table)
        if as_json:
            for row in rows:
                emit_json({"host": name, **row})
            continue
        if not rows:
            say(f"{name}: no learned fixes")
        for row in rows:
            say(fix_line(name, row))
    exit_for_failures(failed)


def fix_line(host: str, row: Mapping[str, object]) -> str:
    """One learned fix as `fleet fixes list` shows it; every field one line (the host's learned record is
    anyone's to edit there: a newline in a signature cannot forge a row of its own)."""
    fix = row["fix"] if row["applied"] else "not applied: today's knowledge has no fix for it"
    fields = (row["model"], row["engine"], row["gpu"], row["signature"], f"learned {row['learned_at']}", fix)
    return "  ".join([host, *(safe_line(str(f)) for f in fields)])


@fixes.command("forget")
@click.argument("signature", required=False)
@host_option(help="Inventory host or group.")
@click.option("--all", "all_hosts", is_flag=True, help="Every host in the inventory.")
@click.option("--model", help="Only the fixes learned for this model path (as `fleet fixes list` shows it).")
@click.option("--every", is_flag=True, help="Every learned fix (no SIGNATURE given).")
@click.pass_obj
def fixes_forget(
    ctx: Invocation, signature: str | None, host_name: str | None, all_hosts: bool, model: str | None, every: bool
) -> None:
    """Forget learned fixes: the next deploy plans without them (and learns again what it must).
    Example: fleet fixes forget --host blackwell sglang-spec-hybrid-no-buffer"""
    from fleet.control.forget import forget_fixes

    if not signature and not every:
        raise ConfigError("no fix named.", "Give a SIGNATURE (fleet fixes list shows them), or --every.")
    if signature and every:
        raise ConfigError("a SIGNATURE and --every.", "Give one of them.")

    def forget(t: Any, host: Any) -> Any:
        return forget_fixes(t, host, signature, model)

    failed = []
    for name, forgotten, error in each_host(ctx, host_name, all_hosts, forget):
        if error is not None:
            say(f"{name}: {error.message}", err=True)
            failed.append(error.exit_code)
            continue
        for f in forgotten:
            model_path = (str(f["key"]).split("|") + [""])[1]
            say(f"{name}: forgot {f['signature']} for {model_path} (learned {f.get('learned_at', '?')})")
        if not forgotten:
            say(f"{name}: no learned fix matched")
    exit_for_failures(failed)
