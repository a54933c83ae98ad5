"""`fleet status` as a table: a header row, then a row per deployment with columns as wide as their
widest cell, so a long deployment or playbook name shifts its column instead of the rest of its row."""

from __future__ import annotations

from typing import Any

from fleet.cli.report import starting_text
from fleet.protocol import STOPPED
from fleet.terminal import safe_line

COLUMNS = ("DEPLOYMENT", "STATUS", "GPUS", "PLAYBOOK", "ENGINE", "PID", "PORT", "UP", "ATTEMPTS", "NOTES")


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    where = f"{r['host']}/{r['deployment']}" if r.get("deployment") else str(r["host"])
    if r.get("error"):  # the host could not be asked: why, in the notes
        return (where, "unreachable", "-", "-", "-", "-", "-", "-", "-", str(r["error"]))
    gpus = ",".join(map(str, r["gpus"])) if isinstance(r.get("gpus"), list) else str(r.get("gpus") or "-")
    engine = " ".join(str(x) for x in (r.get("engine"), r.get("engine_version")) if x) or "-"
    notes = [
        f"{r['stopped_left_out']} stopped (--all shows them)" if r.get("stopped_left_out") else "",
        f"container {r['container']}" if r.get("container") else "",
        str(r["group"]) if r.get("group") else "",
        f"weight cache {r['weight_cache']}" if r.get("weight_cache") else "",
        "fixes: " + ",".join(r["applied_fixes"]) if r.get("applied_fixes") else "",
    ]
    return (
        where,
        str(r["status"]),
        gpus,
        str(r.get("playbook") or "-"),
        engine,
        str(r.get("engine_pid") or r.get("pid") or "-"),  # the engine's own process, as `fleet stop` names it
        str(r.get("port") or "-"),
        f"{r['uptime_s']}s" if r.get("uptime_s") is not None else "-",
        str(r.get("attempts") or "-"),
        "  ".join(n for n in notes if n),
    )


def status_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The table's lines; a starting deployment's phase and ETA follow its row, indented."""
    # every cell one line: a field of a record on a host (a status, a playbook) cannot start a row of its own
    cells = [tuple(safe_line(c) for c in _cells(r)) for r in rows]
    widths = [max(len(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS))]

    def line(values: tuple[str, ...]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    out = [line(COLUMNS)]
    for r, c in zip(rows, cells, strict=True):
        out.append(line(c))
        if r.get("startup") and not r.get("error"):
            out.append(" " * (widths[0] + 2) + starting_text(r["startup"]))
    return out


def without_stopped(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of deployments that are not stopped; a host left with none keeps one row that says how
    many stopped ones it has, so every host asked still answers."""
    kept: list[dict[str, Any]] = []
    for host in dict.fromkeys(r["host"] for r in rows):
        mine = [r for r in rows if r["host"] == host]
        shown = [r for r in mine if r.get("status") != STOPPED]
        if not shown:
            shown = [{"host": host, "deployment": None, "status": "none", "stopped_left_out": len(mine)}]
        kept += shown
    return kept
