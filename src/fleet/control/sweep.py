"""`fleet health`: one probe round trip per host, all hosts in parallel under one deadline, optional
healing through the deploy loop (rate-limited per host; hardware faults are never "healed")."""

from __future__ import annotations

import json
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from fleet.crashes import Diagnosis, LogContext, Signature, diagnose
from fleet.errors import FleetError, HostStepError, StoppedSince
from fleet.facts import HostFacts, parse_facts
from fleet.health import CRITICAL, UNKNOWN, HostHealth, after_heal, check_failed, evaluate, step_failed, unreachable
from fleet.hostscripts import host_said, script_for, step_python
from fleet.inventory import Host
from fleet.protocol import HealDecision, HealthAnswer, HealthRequest, ServerAnswer, json_object
from fleet.secrets import redact
from fleet.terminal import safe_line
from fleet.transport import Transport


@dataclass(frozen=True)
class HealthOptions:
    http_timeout_s: float = 5.0
    generation_timeout_s: float = 30.0
    skip_generation: bool = False
    heal: bool = False
    max_heals_per_hour: int = 3
    unreachable_status: str = UNKNOWN
    signatures: tuple[Signature, ...] | None = None  # the knowledge base with the operator's --crashes files
    secrets: dict[str, str] = field(default_factory=dict)  # redacted from the server log lines it reads
    # playbook name -> its api_key_env: the only key fleet sends to a deployment of that playbook
    api_keys: dict[str, str] = field(default_factory=dict)
    heal_by: float | None = None  # time.monotonic() when the run ends (--deadline): a heal must be done by then


def check_host(t: Transport, host: Host, options: HealthOptions) -> HostHealth:
    started = time.monotonic()
    s = host.settings
    args: HealthRequest = {
        "gpu_devices": s.gpu_devices,
        "engines": {str(k): v for k, v in s.engines.items()},
        "state_dir": s.state_dir,
        "disk_paths": [s.models_dir, s.log_dir, s.state_dir],
        "http_timeout_s": options.http_timeout_s,
        "generation_timeout_s": options.generation_timeout_s,
        "skip_generation": options.skip_generation,
        "kernel_log": s.kernel_log,
        "keys_on_stdin": True,
    }
    python = next(iter(s.engines.values()), "python3")
    raw = _probe(t, host, args, python, options, {})
    if "probe_error" in raw or "error" in raw:
        return step_failed(host.name, f"health probe failed: {raw.get('probe_error') or raw.get('error')}")
    facts = parse_facts(host.name, json.dumps(raw["facts"]))
    answers = raw.get("deployments") or {}
    _ask_again_with_keys(t, host, args, python, options, facts, answers)
    diagnoses = {}
    for name, answer in answers.items():
        engine = facts.remote.deployment(name).recorded.engine
        lines = [redact(x, options.secrets) for x in answer.get("log_lines") or []]  # an engine may echo a secret
        diagnoses[name] = diagnose(lines, LogContext(engine=engine), options.signatures) if lines else None
    _ask_before_condemning(t, host, args, python, options, answers, diagnoses)
    return evaluate(host.name, raw, facts, diagnoses, time.monotonic() - started, s.expected_gpus)


def _ask_again_with_keys(
    t: Transport,
    host: Host,
    args: HealthRequest,
    python: str,
    options: HealthOptions,
    facts: HostFacts,
    answers: dict[str, ServerAnswer],
) -> None:
    """A server with an API key (api_key_env) is asked its prompt again, with its key: only the key the
    client's playbook of that name gives its engine (a host's record cannot name another secret to be
    sent), only to the host that asked for it, and by a probe that asks the prompt alone (the first one
    read the log and kernel lines: reading them again would skip what it saw)."""
    keys: dict[str, str] = {}
    asked: list[str] = []
    why: dict[str, str] = {}
    for name, answer in sorted(answers.items()):
        if not (g := _generation(answer)):
            continue
        playbook = facts.remote.deployment(name).recorded.playbook or name
        wanted = str(g["needs_key"])
        if options.api_keys.get(playbook) != wanted:
            why[name] = f"the server wants the key {wanted}, which no playbook {playbook} here gives it (api_key_env)"
        elif wanted not in options.secrets:
            why[name] = f"the server wants its API key, and {wanted} is not set in fleet's environment"
        else:
            keys[wanted] = options.secrets[wanted]
            asked.append(name)
    only: HealthRequest = {**args, "generation_only": asked}
    again = _probe(t, host, only, python, options, keys) if asked else {}
    for name in asked:
        http = ((again.get("deployments") or {}).get(name) or {}).get("http") or {}
        if http.get("models"):  # the engine's key guards /v1/models too
            answers[name]["http"]["models"] = http["models"]
        answers[name]["http"]["generation"] = http.get("generation") or {
            "skipped": f"asked again with its key, the host said nothing ({again.get('probe_error', 'no answer')})"
        }
    for name, reason in why.items():
        answers[name]["http"]["generation"] = {"skipped": reason}


def _ask_before_condemning(
    t: Transport,
    host: Host,
    args: HealthRequest,
    python: str,
    options: HealthOptions,
    answers: dict[str, ServerAnswer],
    diagnoses: dict[str, Diagnosis | None],
) -> None:
    """A crash line in the log of a server whose /health answers, and whose prompt this check did not ask
    (--skip-generation): the prompt is asked now, alone, so that a real answer, not log text a client may
    have put there, decides whether it is broken (and healed)."""
    suspects = [
        name
        for name, d in sorted(diagnoses.items())
        if d is not None and d.found_failure and _unasked(answers[name].get("http") or {})
    ]
    if not suspects:
        return
    only: HealthRequest = {**args, "generation_only": suspects, "skip_generation": False}
    again = _probe(t, host, only, python, options, {})
    for name in suspects:
        http = ((again.get("deployments") or {}).get(name) or {}).get("http") or {}
        if http.get("generation"):
            answers[name]["http"]["generation"] = http["generation"]


def _unasked(http: Any) -> bool:
    g = http.get("generation") or {}
    health = (http.get("health") or {}).get("status")
    return "ok" not in g and not g.get("serving") and not g.get("needs_key") and health == 200


def _generation(answer: Any) -> dict[str, Any] | None:
    """A deployment's generation check when it still needs an API key, else None."""
    g = (answer.get("http") or {}).get("generation") if isinstance(answer, dict) else None
    return g if isinstance(g, dict) and g.get("needs_key") else None


def _probe(
    t: Transport, host: Host, args: HealthRequest, python: str, options: HealthOptions, keys: dict[str, str]
) -> HealthAnswer:
    stdin = json.dumps({"keys": keys}).encode() + b"\n"
    result = t.run(script_for("health", args, [python]), stdin=stdin, timeout_s=options.generation_timeout_s + 60)
    raw = json_object(result.text)
    if raw is None:  # the host answered: its probe failed, which is not an SSH problem
        return {"probe_error": f"said no result: {host_said(result, 200, keys)}"}  # the keys it was sent hidden
    return cast(HealthAnswer, raw)


def heal_host(
    t: Transport,
    host: Host,
    health: HostHealth,
    options: HealthOptions,
    restart: Callable[[str], Any],
) -> HostHealth:
    """Restart each unhealthy deployment through the deploy loop (`restart(name)`), unless its rate limit
    says it is crash-looping. The limit is decided on the host (its clock, its record); when it cannot
    be, nothing is restarted."""
    for name in health.healable:
        health = _heal_one(t, host, health, options, name, restart)
    return health


# A restart is its start-up and more: the stop, the probe, the prompt, the round trips between them.
HEAL_BEYOND_START_S = 15.0


def _heal_one(
    t: Transport, host: Host, health: HostHealth, options: HealthOptions, name: str, restart: Callable[[str], Any]
) -> HostHealth:
    usual, left = health.start_s.get(name), _left(options)
    if usual is not None and left is not None and usual + HEAL_BEYOND_START_S > left:
        # the run would end mid-restart: the old server stopped, the new one left unverified
        return after_heal(
            health,
            name,
            False,
            f"not healed: it usually takes {usual:.0f} s to start here and {max(0.0, left):.0f} s of the run's "
            f"--deadline are left; raise --deadline (fleet cron install --deadline) or run fleet restart",
        )
    args = {"state_dir": host.settings.state_dir, "deployment": name, "limit": options.max_heals_per_hour}
    result = t.run(script_for("heal", args, [step_python(host)]), timeout_s=30)
    try:
        decision = cast(HealDecision, json.loads(result.text))
        allowed, recent = bool(decision["allowed"]), int(decision["recent"])
    except (ValueError, KeyError, TypeError):
        said = json_object(result.text) or {}
        detail = str(said.get("error") or "") or (result.text + result.error_text).strip()[-200:]
        why = safe_line(detail or f"exit {result.exit_code}")
        return after_heal(health, name, False, f"not healed: the heal could not be recorded on the host ({why})")
    if not allowed:
        return after_heal(
            health,
            name,
            False,
            f"not healed: {recent} heals in the last hour (limit "
            f"{options.max_heals_per_hour}); the server is crash-looping",
        )
    try:
        outcome = restart(name)
    except StoppedSince:
        return after_heal(health, name, False, "not healed: stopped by an operator since the check")
    except FleetError as exc:
        return after_heal(health, name, False, f"heal failed: {exc.message}")
    ok = bool(getattr(outcome, "ok", False))
    return after_heal(
        health, name, ok, "restarted: server ready" if ok else f"restart failed: {getattr(outcome, 'reason', '?')}"
    )


def _left(options: HealthOptions) -> float | None:
    return None if options.heal_by is None else options.heal_by - time.monotonic()


def sweep(
    hosts: list[Host], run_one: Callable[[Host], HostHealth], deadline_s: float, unreachable_status: str
) -> list[HostHealth]:
    """Check every host in parallel; a host that has not answered by the deadline is reported, not waited for."""
    results: dict[str, HostHealth] = {}
    started = time.monotonic()

    def worker(h: Host) -> None:
        try:
            results[h.name] = run_one(h)
        except HostStepError as exc:
            results[h.name] = step_failed(h.name, exc.message, time.monotonic() - started)
        except FleetError as exc:
            results[h.name] = unreachable(h.name, exc.message, unreachable_status, time.monotonic() - started)
        except Exception as exc:  # a bug in fleet: said for this host (not "no answer"), the traceback kept
            traceback.print_exc()
            reason = f"fleet failed checking this host: {type(exc).__name__}: {exc}"
            results[h.name] = check_failed(h.name, reason, time.monotonic() - started)

    threads = [threading.Thread(target=worker, args=(h,), daemon=True) for h in hosts]
    for th in threads:
        th.start()
    for th in threads:
        th.join(max(0.0, deadline_s - (time.monotonic() - started)))
    return [results.get(h.name) or _late(h, deadline_s, unreachable_status) for h in hosts]


def _late(h: Host, deadline_s: float, unreachable_status: str) -> HostHealth:
    return unreachable(h.name, f"no answer within the {deadline_s:.0f} s deadline", unreachable_status, deadline_s)


HOSTS_PER_PROCESS = 8
RESULT_GRACE_S = 5.0  # a child's own sweep ends at the deadline; this is for handing its results over


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, as taskset or a cgroup cpuset sets it). Linux only: on
    macOS a forked process can crash once system frameworks are loaded, so a sweep there stays in one."""
    return len(os.sched_getaffinity(0)) if sys.platform.startswith("linux") else 1


def sweep_processes(host_count: int, cpus: int | None, other_threads: int) -> int:
    """How many processes share a cold sweep. An SSH handshake is ~10 ms of client CPU in Python, all of it
    under one GIL: 50 hosts in one process queue ~0.5 s behind it, while the hosts answer in parallel.
    One, in a process running other threads: fork copies only the calling thread, not the locks' owners."""
    if other_threads:
        return 1
    return max(1, min(cpus or 1, -(-host_count // HOSTS_PER_PROCESS)))


def sweep_in_processes(
    hosts: list[Host],
    run_one: Callable[[Host], HostHealth],
    deadline_s: float,
    unreachable_status: str,
    processes: int,
) -> list[HostHealth]:
    """`sweep`, the hosts dealt out to `processes` forked copies of this one (this one keeps a share).

    Only for a process that runs no other thread (see `sweep_processes`); children hand their results
    back pickled through a pipe and leave with os._exit (no atexit handlers, no stdio flushed twice)."""
    if processes <= 1:
        return sweep(hosts, run_one, deadline_s, unreachable_status)
    if any(h.settings.connection == "ssh" for h in hosts):
        import fleet.transport.ssh  # noqa: F401 - imported once here rather than in every child
    shares = [hosts[i::processes] for i in range(processes)]
    children = []
    parent = os.getpid()
    for share in shares[1:]:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            status = 1
            try:
                os.close(read_end)
                _end_with(parent)
                answer = pickle.dumps(sweep(share, run_one, deadline_s, unreachable_status))
                with os.fdopen(write_end, "wb") as out:
                    out.write(answer)
                status = 0
            except Exception:
                traceback.print_exc()
            finally:  # also on Ctrl-C (SIGINT reaches the whole process group): the parent reports
                os._exit(status)
        os.close(write_end)
        children.append((pid, read_end, share))
    started = time.monotonic()
    mine = sweep(shares[0], run_one, deadline_s, unreachable_status)
    results = {r.host: r for r in mine}
    for pid, read_end, share in children:
        data = _read_all(read_end, started + deadline_s + RESULT_GRACE_S)
        if data is None:  # late (stopped, or stuck past the deadline): its hosts are reported, not lost
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            theirs = [_late(h, deadline_s, unreachable_status) for h in share]
        else:
            exit_code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            try:
                theirs = pickle.loads(data)
            except Exception:  # it ended without handing its results over (its traceback is on stderr)
                reason = f"the fleet process checking this host ended without an answer (exit code {exit_code})"
                theirs = [check_failed(h.name, reason, time.monotonic() - started) for h in share]
        results.update((r.host, r) for r in theirs)
    return [results.get(h.name) or _late(h, deadline_s, unreachable_status) for h in hosts]


def _end_with(parent: int) -> None:
    """Have the kernel kill this child when the `fleet` that forked it dies (cron's timeout killing it,
    say): the child holds the overlap lock's descriptor, and outliving the parent would block the next run."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before that took effect
        os._exit(1)


def _read_all(fd: int, until: float) -> bytes | None:
    """Everything written to `fd` until its writer closed it, or None if that did not happen by `until`."""
    chunks: list[bytes] = []
    try:
        while (left := until - time.monotonic()) > 0 and select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
        return None
    finally:
        os.close(fd)


__all__ = [
    "CRITICAL",
    "HealthOptions",
    "check_host",
    "heal_host",
    "sweep",
    "sweep_in_processes",
    "sweep_processes",
    "usable_cpus",
]
