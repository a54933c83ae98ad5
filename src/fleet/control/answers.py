"""What a host step's answer means to the operator: the errors fleet raises from it, and what fleet saw
itself (a failed smoke check, a timeout, a kill) as log lines the crash knowledge base can match."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, cast

from fleet.errors import DeployFailed, FleetError, LockedError, PreflightError, StoppedSince, UnsafeToKill
from fleet.protocol import ActResult, LockResult, WatchEvent
from fleet.secrets import shown_processes

LOCK_GRACE_S = 5.0  # a lock whose holder process is gone counts as stale after this long untouched


def locked(host_name: str, lock: LockResult, since: str = "") -> LockedError:
    holder = lock.get("holder_pid")
    working = f"; its process {holder} on the host is running" if holder else ""
    return LockedError(
        f"{host_name}: locked by {lock.get('owner')}{' since ' + since if since else ''} "
        f"({lock.get('command') or 'deploy'}{working}).",
        "Wait for it to finish. A fleet run that is interrupted or killed has its host process release the "
        f"lock within seconds; a lock with no live process is taken over after {LOCK_GRACE_S:.0f} s.",
    )


def overlap_refused(host_name: str, deployment: str, lock: LockResult) -> PreflightError:
    """Found by the act step under the host's guard: another deployment took these GPUs meanwhile."""
    who = "; ".join(
        f"deployment {o.get('deployment')} on GPUs {','.join(map(str, o.get('gpus') or [])) or 'all'}"
        + (f" and port {o['port']}" if o.get("port") else "")
        + (f" (pid {o['pid']})" if o.get("pid") else " (deploying now)")
        for o in lock.get("overlap") or []
    )
    return PreflightError(
        f"{host_name}: deployment {deployment} would share GPUs or a port with {who}. Nothing on the host was changed.",
        "Run it again once the other is up (fleet then picks another port), place it on other GPUs (gpus:, "
        "--gpus), or pass --replace to stop the other first.",
    )


def unwritable_host_dir(host_name: str, what: str, setting: str, found: Mapping[str, object]) -> PreflightError:
    """The host-side step found a directory it needs unwritable ({path, error}) before changing anything."""
    return PreflightError(
        f"{host_name}: {what} {found.get('path')} on the host cannot be written ({found.get('error')}). "
        "Nothing on the host was changed.",
        f"Set {setting}: for this host to a directory its SSH user can write.",
    )


def unwritable_state_dir(host_name: str, lock: LockResult) -> PreflightError:
    """The host-side step could not take its lock: the state directory cannot be made or written."""
    return unwritable_host_dir(host_name, "fleet's state directory", "state_dir", lock)


def newer_record(host_name: str, out: ActResult) -> PreflightError | None:
    """The act step refused as a record a newer fleet wrote asks (any mode: deploy, stop, forget)."""
    if not (newer := out.get("record_too_new")):
        return None
    changed = "Nothing on the host was changed." if not out.get("ended") else "Its server was stopped first."
    return PreflightError(f"{host_name}: {newer}. {changed}", "Run that fleet there, or upgrade this one.")


def refuse_unless_taken(host_name: str, deployment: str, out: ActResult) -> None:
    """A stop's or a forget's act step that did nothing: its lock was not taken (the state directory
    cannot be written, or another run holds the deployment), or a record a newer fleet wrote refused it."""
    lock = out["lock"]
    if lock["status"] == "unwritable":
        raise unwritable_state_dir(host_name, lock)
    if lock["status"] == "held":
        raise locked(f"{host_name} (deployment {deployment})", lock)
    if newer := newer_record(host_name, out):
        raise newer


def rollback_said(out: ActResult) -> str:
    if back := out.get("rolled_back"):
        unrecorded = " (not recorded: `fleet status` names the old pid)" if out.get("rollback_unrecorded") else ""
        return (
            f"rolled back: the previous server was relaunched (pid {back['pid']}, log {back['log']}), "
            f"unchecked{unrecorded}."
        )
    return f"the previous server was not relaunched: {out.get('rollback_failed')}. The host has no server."


def synthetic_line(ev: WatchEvent) -> str | None:
    """What fleet itself observed, as a log line the knowledge base can match."""
    if ev["e"] == "smoke":
        if ev.get("status") == 200:
            return f"[fleet] smoke check failed: garbage output (answer {ev.get('text', '')[:120]!r})"
        # what answered is quoted, never taken as lines of its own (a newline in it would start one)
        return f"[fleet] smoke check failed: HTTP {ev.get('status')} ({str(ev.get('text', ''))[:200]!r})"
    if ev["e"] == "timeout":
        if ev.get("what") == "progress":
            return f"[fleet] no log progress for {ev.get('after_s', 0):.0f} s"
        if ev.get("what") == "stall":
            usual = ev.get("usual_s")
            against = f"it usually takes {usual:.0f} s here" if usual is not None else "it never finished here before"
            return (
                f"[fleet] start-up stalled in {ev.get('phase')}: no progress for {ev.get('after_s', 0):.0f} s "
                f"(bound {ev.get('bound_s', 0):.0f} s; {against})"
            )
        return f"[fleet] {ev.get('what')} timeout after {ev.get('after_s', 0):.0f} s"
    if ev["e"] == "exit":
        code = ev.get("code")
        if ev.get("oom_killed"):
            return f"[fleet] container OOM-killed: its memory limit was reached (exit {code})"
        if code is not None and code > 128:
            return f"[fleet] engine killed by signal {code - 128}" if code - 128 == 9 else None
        if code is None:
            return "[fleet] engine killed by signal (no exit status recorded)"
    return None


def engine_resolved(check: Mapping[str, object]) -> dict[str, Any]:
    """What the engine resolved, as the act step's check answered it (a host's odd answer: nothing)."""
    said = check.get("resolved")
    return dict(said) if isinstance(said, dict) else {}


def act_answer(answer: ActResult) -> ActResult:
    """The act step's answer as fleet keeps and shows it: the processes it stopped, left or refused, with
    credentials on their command lines masked (a server started by hand with `--api-key ...`)."""
    raw = cast(dict[str, Any], answer)
    for key in ("ended", "left", "refused"):
        if isinstance(raw.get(key), list):
            raw[key] = shown_processes(raw[key])
    return answer


def act_refusal(host_name: str, deployment: str, out: ActResult) -> FleetError | None:
    """Why the act step launched nothing, as the error a run ends with (None: it went ahead): the deployment
    was stopped since its check, the host's lock is held or its GPUs overlap another deployment's, a
    directory fleet writes is unwritable or short of space, a write failed after the old server stopped,
    or GPU holders fleet will not kill (UnsafeToKill: nothing was stopped)."""
    if out.get("stopped_since"):
        return StoppedSince(
            f"{host_name}: deployment {deployment} was stopped after the check found it down; "
            "not restarted (a stop is never undone by a heal).",
            f"Start it again yourself: fleet restart --host {host_name}/{deployment}.",
        )
    lock = out["lock"]
    if newer := newer_record(host_name, out):
        return newer
    if lock["status"] == "unwritable":
        return unwritable_state_dir(host_name, lock)
    if lock["status"] == "held":
        return locked(host_name, lock, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lock.get("since") or 0)))
    if lock["status"] == "overlap":
        return overlap_refused(host_name, deployment, lock)
    if unwritable := out.get("log_dir_unwritable"):
        return unwritable_host_dir(host_name, "the log directory", "log_dir", unwritable)
    if unwritable := out.get("record_unwritable"):
        return PreflightError(
            f"{host_name}: deployment {deployment}'s record {unwritable.get('path')} cannot be written "
            f"({unwritable.get('error')}). Nothing on the host was changed.",
            "Move it out of fleet's state directory, then run again.",
        )
    if unsafe := out.get("weight_cache_dir"):
        return PreflightError(
            f"{host_name}: the weight cache daemon's directory cannot be used ({unsafe.get('error')}). Nothing "
            "on the host was changed.",
            f"Remove {unsafe.get('path')} if it is not this user's, then run again.",
        )
    if short := out.get("short_of_space"):
        return PreflightError(
            f"{host_name}: {short['short']} in {short['path']} ({short['setting']}); fleet needs "
            f"{short['need'] >> 20} MiB and some free inodes there before it stops anything. Nothing on the "
            "host was changed.",
            "Free disk space there first.",
        )
    if stuck := out.get("withdraw_failed"):
        return DeployFailed(
            f"{host_name}: the engine's check refused the command line after the launch beside it had started, "
            f"and its container could not be removed ({stuck}); it runs, and its record names it.",
            f"Remove it with: fleet stop --host {host_name}/{deployment}.",
        )
    if failed := out.get("write_failed"):
        return DeployFailed(
            f"{host_name}: writing {failed['path']} failed after the old server was stopped "
            f"({failed['error']}); {rollback_said(out)}",
            "Free disk space on the host, then run again.",
        )
    if short := out.get("budget_short"):
        return PreflightError(
            f"{host_name}: the engine's own check resolved mem_fraction_static {short['fraction']:g} on this host: "
            f"{short['room_mib'] / 1024:.1f} GiB of each GPU's {short['gpu_mib'] / 1024:.1f} GiB, less than the "
            f"{short['need_mib'] / 1024:.1f} GiB the weights and one prefill step's KV cache need: it would stop at "
            "load. Nothing on the host was changed.",
            "Use more GPUs (gpus: or tp:), a smaller or quantized checkpoint, or set mem_fraction: in the playbook.",
        )
    if out.get("refused"):
        who = "; ".join(
            f"pid {p.get('pid')} ({p.get('user')}: {str(p.get('cmdline'))[:80]}) — {p['why']}" for p in out["refused"]
        )
        if any(p.get("forceable") is False for p in out["refused"]):  # a container's name, a runtime: no --force helps
            return UnsafeToKill(
                f"{host_name}: in the way, and never stopped or removed by fleet: {who}.",
                "Remove or rename that container yourself (--force never removes a container that is not this "
                "fleet's), or make its runtime list its containers again.",
            )
        return UnsafeToKill(
            f"{host_name}: GPU/port holders fleet will not kill: {who}.",
            "Stop them yourself, or set kill_policy: force for this host (or pass --force).",
        )
    return None
