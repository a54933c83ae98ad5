"""The deploy loop, fast: fleet's real host scripts run in a simulated host's own namespaces (no sshd;
fleet_testbed.nshost). Covers what the SSH suite covers slowly: the round trips of a first-time deploy,
a known crash fixed and relaunched, the lock, restart after a failure, and resuming a cut log stream."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from conftest import ROOT
from fleet import events
from fleet.control import attempt_watch, ops
from fleet.control.gather import read_facts
from fleet.control.status_rows import status_rows
from fleet.control.sweep import HealthOptions, check_host, heal_host
from fleet.errors import HostSilent, HostUnreachable, LockedError, PreflightError, TransportError, UnsafeToKill
from fleet.inventory import load_playbook
from fleet_testbed import nshost, simhost
from simengine import wait_until

E = TypeVar("E")

# each test starts simulated engines in a host's namespaces and waits for them (seconds): the coverage
# tier and `make test` run them; `make unit` runs the same loop's branches against scripted hosts
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not nshost.available(), reason="needs root, unshare and nsenter"),
]


@pytest.fixture
def host(tmp_path: Path) -> Iterator[nshost.NamespaceHost]:
    h = nshost.NamespaceHost(tmp_path, simhost.CT129, nshost.loopback_address())
    yield h
    h.close()


class Events:
    """The deploy's progress events, captured as every listener gets them."""

    def __init__(self) -> None:
        self.seen: list[events.Event] = []

    def __call__(self, event: events.Event) -> None:
        self.seen.append(event)

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.seen if isinstance(e, kind)]


def deploy(
    h: nshost.NamespaceHost, t: Any = None, playbook: str = "qwen36-27b", engine_check: bool = False, **placed: Any
) -> tuple[Any, Events]:
    """A deploy through fleet's own loop; the engine's own check (a Python start, ~0.5 s) only when asked.
    `placed`: name, gpus, replace (as --name, --gpus, --replace)."""
    seen = Events()
    pb = load_playbook(playbook, ROOT / "playbooks")
    result = ops.deploy(t or h.transport(), h.host, pb, force=False, engine_check=engine_check, progress=seen, **placed)
    return result, seen


def state(h: nshost.NamespaceHost) -> dict[str, Any]:
    return json.loads(simhost.newest_record(h.dir).read_text())


def test_a_first_time_deploy_costs_three_round_trips_and_records_the_server(host: nshost.NamespaceHost) -> None:
    result, seen = deploy(host, engine_check=True)
    assert result.ok and [a.outcome for a in result.attempts] == ["ready"]
    said = [e.kind for e in seen.seen if not isinstance(e, events.LogLine | events.StartupPhase)]
    assert said == ["planned", "attempt", "engine_check", "stopped", "launched", "ready"]
    # the engine's start-up, phase by phase, as its own lines said it; no ETA on a first start
    phases = seen.of(events.StartupPhase)
    assert list(dict.fromkeys(p.phase for p in phases)) == ["distributed", "weights", "kv_cache", "graphs", "warmup"]
    assert all(p.eta_s is None and p.starts == 0 for p in phases)
    assert seen.of(events.LogLine) and seen.of(events.Ready)[0].smoke["ok"]
    assert result.round_trips == 3  # facts, act, watch
    st = state(host)
    assert st["status"] == "ready" and st["schema"] == 2 and st["learned_key"] and st["deployment"] == "qwen36-27b"
    assert "sglang.launch_server" in host.shell(f"cat /proc/{st['pid']}/cmdline | tr '\\0' ' '")
    assert not simhost.record(host.dir, "lock.json").exists()


def test_a_host_where_nothing_runs_in_a_container_is_never_asked_for_its_containers(
    host: nshost.NamespaceHost,
) -> None:
    """docker/podman are asked for fleet's containers only when a record or the launch names a runtime, or
    some process runs in a container: otherwise no container of fleet's can hold anything, and a `ps` costs
    a deploy more than the rest of its stop (~70 ms for podman)."""
    asked = host.dir / "podman-asked"
    podman = host.dir / "bin" / "podman"
    podman.parent.mkdir(exist_ok=True)
    podman.write_text(f'#!/bin/sh\necho "$*" >> {asked}\necho "[]"\n')
    podman.chmod(0o755)
    result, seen = deploy(host)
    assert result.ok and seen.of(events.Stopped)  # the act step ran: the GPUs were freed, the server launched
    assert not asked.exists(), asked.read_text()


def test_a_known_crash_is_relaunched_with_its_fix_and_given_up_when_it_comes_back(
    host: nshost.NamespaceHost,
) -> None:
    simhost.set_host(
        host.dir,
        inject_scheduler_error=(
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
            "mem_fraction_static=0.85"
        ),
    )
    result, seen = deploy(host)
    assert [e.signature for e in seen.of(events.Relaunching)] == ["sglang-kv-not-enough-memory"]
    assert seen.of(events.Relaunching)[0].fix == "memory fraction +0.04"
    assert [e.outcome for e in seen.of(events.Diagnosed)] == ["crashed", "crashed"]
    assert not result.ok and result.reason == "sglang-kv-not-enough-memory came back after its fix was applied"
    st = state(host)
    assert st["status"] == "failed" and st["learned_key"] and st["attempt"] == 2
    assert not simhost.record(host.dir, "lock.json").exists()


def test_a_second_run_while_the_first_holds_the_lock_is_refused(host: nshost.NamespaceHost) -> None:
    assert deploy(host)[0].ok
    simhost.record(host.dir, "lock.json").write_text(
        json.dumps({"run_id": "other", "owner": "someone", "since": 1, "command": "deploy", "holder_pid": 1})
    )
    with pytest.raises(LockedError) as caught:
        ops.restart(host.transport(), host.host, force=False, progress=Events())
    assert (
        "locked by someone" in caught.value.message and "its process 1 on the host is running" in caught.value.message
    )


def test_restart_after_a_failed_deploy_keeps_the_learned_key(host: nshost.NamespaceHost) -> None:
    assert deploy(host)[0].ok
    key = state(host)["learned_key"]
    simhost.set_host(host.dir, inject_scheduler_error="RuntimeError: boom")
    assert not ops.restart(host.transport(), host.host, force=False, progress=Events()).ok
    assert state(host)["status"] == "failed" and state(host)["learned_key"] == key
    simhost.set_host(host.dir, inject_scheduler_error=None)
    assert ops.restart(host.transport(), host.host, force=False, progress=Events()).ok
    assert state(host)["learned_key"] == key


@pytest.mark.parametrize("cut_at", [300, 700, 1300, 2100])
def test_a_stream_cut_inside_a_batch_resumes_without_gaps_or_repeats(host: nshost.NamespaceHost, cut_at: int) -> None:
    """The connection drops in the middle of what the watcher wrote at once (several lines read from the
    log together, one of them half sent): every line it never delivered is sent again, none twice."""
    t = host.transport()
    t.cut_after = None
    original_stream = t.stream

    def cut_first_watch(script: str, on_chunk: Any, **kwargs: Any) -> int:
        if "host/watch.py" in script or "LogFollower" in script:
            t.stream = original_stream  # type: ignore[method-assign]
            t.cut_after = cut_at
        return original_stream(script, on_chunk, **kwargs)

    t.stream = cut_first_watch  # type: ignore[method-assign]
    result, seen = deploy(host, t)
    assert result.ok and seen.of(events.Reconnecting)
    streamed = [e.line for e in seen.of(events.LogLine)]
    logged = Path(state(host)["log"]).read_bytes().decode().split("\n")  # a bar redraws with \r inside a line
    assert streamed == logged[: len(streamed)]
    assert any("Uvicorn running on" in x for x in streamed)  # past the cut, up to the server's answer


@pytest.mark.parametrize(("failure", "tries"), [(HostUnreachable, 6), (HostSilent, 1)])
def test_a_watch_whose_connection_keeps_failing_is_resumed_five_times_and_a_silent_host_never(
    host: nshost.NamespaceHost, monkeypatch: pytest.MonkeyPatch, failure: type[HostUnreachable], tries: int
) -> None:
    """A cut connection is resumed from its offset, at most five times; a host that answers nothing at all
    (HostSilent) is not waited for again. Either way the deploy ends with the error, not a false success."""
    monkeypatch.setattr(attempt_watch, "RESUME_WAITS_S", (0.0,) * 5)
    t = host.transport()
    original_stream = t.stream
    watches: list[str] = []

    def failing_watch(script: str, on_chunk: Any, **kwargs: Any) -> int:
        if "host/watch.py" in script or "LogFollower" in script:
            watches.append(script)
            raise failure(f"{host.host.name}: cut", "")
        return original_stream(script, on_chunk, **kwargs)

    t.stream = failing_watch  # type: ignore[method-assign]
    with pytest.raises(failure):
        deploy(host, t)
    assert len(watches) == tries


def engine_pid(h: nshost.NamespaceHost) -> int:
    return int(state(h)["pid"])


def alive(h: nshost.NamespaceHost, pid: int) -> bool:
    """Running, not a zombie: the namespace's init (a sleeper) never reaps what it inherits."""
    return h.shell(f"ps -o stat= -p {pid} || true").strip()[:1] not in ("", "Z")


@pytest.fixture
def blackwell(tmp_path: Path) -> Iterator[nshost.NamespaceHost]:
    h = nshost.NamespaceHost(tmp_path, simhost.BLACKWELL, nshost.loopback_address())
    yield h
    h.close()


def test_the_engine_check_refuses_a_command_line_before_the_running_server_is_stopped(
    blackwell: nshost.NamespaceHost,
) -> None:
    assert deploy(blackwell, playbook="qwen35-nvfp4")[0].ok
    running = engine_pid(blackwell)
    # the same deployment, from another playbook: it replaces its own server
    result, seen = deploy(blackwell, playbook="qwen35-nvfp4-handwritten", engine_check=True, name="qwen35-nvfp4")
    assert result.ok, result.reason
    assert [e.verdict for e in seen.of(events.EngineChecked)] == ["rejected", "rejected", "accepted"]
    assert [e.nothing_stopped for e in seen.of(events.Relaunching)] == [True, True]
    assert [p["pid"] for p in seen.of(events.Stopped)[0].stopped][:1] == [running]  # only after the check passed
    assert [a.outcome for a in result.attempts] == ["rejected", "rejected", "ready"]
    assert not alive(blackwell, running)


def test_a_second_start_has_an_eta_and_its_timeline_is_kept_with_the_record(host: nshost.NamespaceHost) -> None:
    simhost.set_host(host.dir, startup_scale=1.0)  # phases of 0.2-0.3 s, so the ETA has something to count
    assert deploy(host)[0].ok
    ops.stop(host.transport(), host.host, force=False)
    result, seen = deploy(host)
    assert result.ok
    phases = seen.of(events.StartupPhase)
    assert phases and all(p.starts == 1 and p.eta_s is not None for p in phases)
    assert phases[0].eta_s > phases[-1].eta_s  # it counts down
    kept = state(host)["startup"]
    assert kept["outcome"] == "ready" and kept["order"] == ["distributed", "weights", "kv_cache", "graphs", "warmup"]
    history = json.loads((host.dir / "state" / "startup.json").read_text())  # the host's, not the deployment's
    assert [h["outcome"] for h in next(iter(history.values()))] == ["ready", "ready"]


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_each_engine_versions_own_start_up_lines_give_the_phases_and_their_bars(
    host: nshost.NamespaceHost, version: str
) -> None:
    """The simulated engine prints each version's lines (0.5.23: "Init parallel begin.", "Memory pool end."
    alone, "Capture target verify CUDA graph begin.") and tqdm's bars, redrawn inside one line."""
    simhost.set_host(host.dir, sglang_version=version)
    result, seen = deploy(host)
    assert result.ok, result.reason
    phases = seen.of(events.StartupPhase)
    assert list(dict.fromkeys(p.phase for p in phases)) == ["distributed", "weights", "kv_cache", "graphs", "warmup"]
    bars = {(p.phase, p.done, p.of) for p in phases if p.of}
    assert ("weights", 6, 6) in bars and ("graphs", 8, 8) in bars
    spelled = "Init parallel begin." if version == "0.5.23" else "Init torch distributed begin."
    assert any(spelled in e.line for e in seen.of(events.LogLine))


def test_a_slow_load_that_keeps_moving_its_bar_is_no_stall(
    host: nshost.NamespaceHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow disk: 6 shards of half a second, the load past its stall bound (2 s here) but the bar moving
    every half second (in a line tqdm ends only when it closes): the start goes on to ready."""
    monkeypatch.setattr("fleet.control.deploy.STALL_FLOOR_S", 2.0)
    assert deploy(host)[0].ok  # a fast start first: the load's usual length here is a fraction of a second
    ops.stop(host.transport(), host.host, force=False)
    simhost.set_host(host.dir, slow_weights_s=0.5)
    result, seen = deploy(host)
    assert result.ok and [a.outcome for a in result.attempts] == ["ready"]
    loads = [p for p in seen.of(events.StartupPhase) if p.phase == "weights" and p.of]
    assert any(p.done is not None and p.done < 6 for p in loads)  # seen moving before its line ended
    # it ran past its stall bound and was still no stall (6 x 0.5 s of sleeping on the host: well past 2 s,
    # whatever the moments the watcher read its first and last line)
    assert state(host)["startup"]["phases"]["weights"] > 2.0


@pytest.mark.parametrize(("hook", "phase"), [("hang_graph_capture", "graphs"), ("hang_rendezvous", "distributed")])
def test_a_graph_capture_or_rendezvous_that_hangs_is_a_stall_long_before_the_ready_timeout(
    host: nshost.NamespaceHost, monkeypatch: pytest.MonkeyPatch, hook: str, phase: str
) -> None:
    """With one start behind it the host knows how long each phase takes; a capture or a meeting of the
    ranks that then hangs is told apart from "still loading" and stopped, not waited for until
    ready_timeout (900 s)."""
    monkeypatch.setattr("fleet.control.deploy.STALL_FLOOR_S", 2.0)  # the sim captures in 0.2 s; 30 s is real life
    assert deploy(host)[0].ok
    ops.stop(host.transport(), host.host, force=False)
    simhost.set_host(host.dir, **{hook: True})
    began = time.monotonic()
    result, seen = deploy(host)
    assert time.monotonic() - began < 60
    assert not result.ok and [a.outcome for a in result.attempts] == ["timeout"]
    diagnosis = result.attempts[0].diagnosis
    assert diagnosis is not None and diagnosis.signature == "fleet-startup-stall"
    assert any(f"start-up stalled in {phase}" in line for line in diagnosis.evidence)
    assert seen.of(events.StartupPhase)[-1].phase == phase
    st = state(host)
    running = host.shell(f"ps -o stat= -g {st['pgid']} || true").split()
    assert st["status"] == "failed" and [s for s in running if not s.startswith("Z")] == []


def test_status_says_a_starting_servers_phase_and_eta_and_a_stall_is_waited_through_when_the_playbook_says(
    host: nshost.NamespaceHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`on_stall: wait`: a hung capture is said once, the attempt goes on (here until its engine dies);
    meanwhile `fleet status`, another run, reads the phase and an ETA from the host."""
    from fleet.cli.report import starting_text

    monkeypatch.setattr("fleet.control.deploy.STALL_FLOOR_S", 1.0)
    assert deploy(host)[0].ok  # one start behind it: the next has an ETA
    ops.stop(host.transport(), host.host, force=False)
    simhost.set_host(host.dir, hang_graph_capture=True)
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    pb = dataclasses.replace(pb, spec=msgspec.structs.replace(pb.spec, on_stall="wait", max_attempts=1))
    seen = Events()
    outcome: list[Any] = []
    run = threading.Thread(
        target=lambda: outcome.append(ops.deploy(host.transport(), host.host, pb, force=False, engine_check=False,
                                                 progress=seen)))  # fmt: skip
    run.start()
    try:
        assert wait_until(lambda: seen.of(events.StartupStalled), timeout=60)
        row = status_rows(host.host, read_facts(host.transport(), host.host))[0]
        assert row["status"] == "starting" and row["startup"]["phase"] == "graphs"
        assert row["startup"]["eta_s"] is not None and row["startup"]["starts"] == 1
        assert "capturing CUDA graphs" in starting_text(row["startup"]) and "ready in about" in starting_text(
            row["startup"]
        )
        assert run.is_alive()  # said, and still waiting
    finally:
        # the engine dies (its launcher, the recorded pid, sees that and says so)
        host.shell(f"pkill -KILL -P {state(host)['pid']} || true")
        run.join(60)
    result = outcome[0]
    assert not result.ok and [a.outcome for a in result.attempts] != ["timeout"]  # it ended by the kill, not a stall
    assert [s.phase for s in seen.of(events.StartupStalled)] == ["graphs"]  # one quiet spell, said once
    row = status_rows(host.host, read_facts(host.transport(), host.host))[0]
    assert row["startup"] is None and not (simhost.record(host.dir, "phase.json")).exists()
    assert state(host)["on_stall"] == "wait"  # kept, so a restart or a heal waits the same way


def test_stop_stops_fleets_server_and_records_it_stopped(host: nshost.NamespaceHost) -> None:
    assert deploy(host)[0].ok
    pid = engine_pid(host)
    out = ops.stop(host.transport(), host.host, force=False)
    assert pid in [p["pid"] for p in out["ended"]] and not out["refused"]
    assert not alive(host, pid)
    st = state(host)
    assert st["status"] == "stopped" and st["pid"] == pid and st["learned_key"]  # the record keeps what it knew
    assert not simhost.record(host.dir, "lock.json").exists()


def test_status_names_the_engines_own_pid_as_stop_does(host: nshost.NamespaceHost) -> None:
    """The record keeps fleet's launcher (the group it stops); the pid shown is the engine's, in status and
    in what stop says it stopped."""
    from fleet.cli.report import describe_stopped

    assert deploy(host)[0].ok
    row = status_rows(host.host, read_facts(host.transport(), host.host))[0]
    assert row["pid"] == state(host)["pid"] and row["engine_pid"] not in (None, row["pid"])
    assert "sglang.launch_server" in host.shell(f"tr '\\0' ' ' < /proc/{row['engine_pid']}/cmdline")
    out = ops.stop(host.transport(), host.host, force=False)
    assert describe_stopped(out["ended"])[0].startswith(f"fleet's server pid {row['engine_pid']} (")


def test_a_process_holding_a_gpu_that_is_no_engine_is_left_alone_unless_forced(host: nshost.NamespaceHost) -> None:
    assert deploy(host)[0].ok
    running = engine_pid(host)
    host.shell(f"setsid sh -c 'exec sleep 600 3<{host.dir}/dev/nvidia0' </dev/null >/dev/null 2>&1 &")
    holder = int(host.shell("sleep 0.2; pgrep -x sleep -n").strip())
    with pytest.raises(UnsafeToKill) as caught:
        ops.restart(host.transport(), host.host, force=False, progress=Events())
    assert f"pid {holder}" in caught.value.message and "sleep 600" in caught.value.message
    assert alive(host, holder) and alive(host, running)  # nothing was stopped: the server serves on
    assert state(host)["pid"] == running and not simhost.record(host.dir, "lock.json").exists()
    assert ops.restart(host.transport(), host.host, force=True, progress=Events()).ok
    assert not alive(host, holder)


def test_an_unwritable_log_dir_is_refused_before_the_running_server_is_stopped(host: nshost.NamespaceHost) -> None:
    assert deploy(host)[0].ok
    running = engine_pid(host)
    settings = msgspec.structs.replace(host.host.settings, log_dir=f"{simhost.record(host.dir)}/logs")
    broken = dataclasses.replace(host.host, settings=settings)
    with pytest.raises(PreflightError) as caught:
        ops.restart(host.transport(), broken, force=False, progress=Events())
    assert "the log directory" in caught.value.message and "Nothing on the host was changed" in caught.value.message
    assert alive(host, running) and state(host)["status"] == "ready"
    assert not simhost.record(host.dir, "lock.json").exists()


def test_health_of_a_served_host_is_ok_and_a_dead_server_is_healed_within_the_hourly_limit(
    host: nshost.NamespaceHost,
) -> None:
    assert deploy(host)[0].ok
    options = HealthOptions(max_heals_per_hour=1, heal=True)

    def problems() -> list[str]:  # the load is not the host's: tests run side by side
        return [c.name for c in check_host(host.transport(), host.host, options).problems() if c.name != "load"]

    assert problems() == []
    healthy = check_host(host.transport(), host.host, options)
    assert {c.name for c in healthy.checks} >= {"server", "port", "models", "generation"}
    host.shell(f"kill -9 -{state(host)['pgid']}")
    down = check_host(host.transport(), host.host, options)
    assert down.status == "critical" and down.healable and not down.server_up

    def restart(name: str) -> Any:
        return ops.restart(host.transport(), host.host, force=False, progress=Events(), name=name)

    healed = heal_host(host.transport(), host.host, down, options, restart)
    assert healed.heal == "qwen36-27b: restarted: server ready"
    assert problems() == []
    host.shell(f"kill -9 -{state(host)['pgid']}")
    again = heal_host(host.transport(), host.host, check_host(host.transport(), host.host, options), options, restart)
    assert again.heal is not None and "1 heals in the last hour" in again.heal  # crash-looping: left alone


def test_a_heal_the_runs_deadline_would_cut_off_is_not_started_and_not_counted(host: nshost.NamespaceHost) -> None:
    """cron's `fleet health --heal` ends at its --deadline (55 s): a restart longer than what was left
    was started anyway and cut off by the run's end, the old server stopped and the new one unverified.
    A heal starts only when the deployment's usual start-up here fits in what is left of the run."""
    assert deploy(host)[0].ok
    host.shell(f"kill -9 -{state(host)['pgid']}")
    options = HealthOptions(max_heals_per_hour=1, heal=True)
    down = check_host(host.transport(), host.host, options)
    usual = down.start_s["qwen36-27b"]  # the deploy's own start-up, kept on the host
    asked: list[str] = []

    def restart(name: str) -> Any:
        asked.append(name)
        return ops.restart(host.transport(), host.host, force=False, progress=Events(), name=name)

    short = dataclasses.replace(options, heal_by=time.monotonic() + usual + 1)
    cut = heal_host(host.transport(), host.host, down, short, restart)
    assert asked == [] and cut.status == "critical"
    assert cut.heal is not None and cut.heal.startswith("qwen36-27b: not healed: it usually takes ")
    assert "raise --deadline" in cut.heal
    roomy = dataclasses.replace(options, heal_by=time.monotonic() + usual + 300)
    healed = heal_host(host.transport(), host.host, down, roomy, restart)  # the refused heal spent no count
    assert asked == ["qwen36-27b"] and healed.heal == "qwen36-27b: restarted: server ready"


def test_ctrl_c_between_launch_and_watch_frees_the_lock_and_records_the_server_unverified(
    host: nshost.NamespaceHost,
) -> None:
    """The one moment no host step holds fleet's stdin: act has answered, the watch has not started. An
    interrupt there costs one more round trip, and leaves no lock for the next run to take over."""

    def interrupt_once_launched(event: events.Event) -> None:
        if isinstance(event, events.Launched):
            raise KeyboardInterrupt

    t = host.transport()
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    with pytest.raises(KeyboardInterrupt):
        ops.deploy(t, host.host, pb, force=False, engine_check=False, progress=interrupt_once_launched)
    assert t.commands_run == 3  # facts, act, and the interrupted run's clean-up
    assert not simhost.record(host.dir, "lock.json").exists()
    st = state(host)
    assert st["status"] == "unverified" and "before the server was checked" in st["reason"]
    again, _ = deploy(host)
    assert again.ok and state(host)["pid"] != st["pid"]


def test_a_lock_left_by_a_run_that_died_is_taken_over_and_said(host: nshost.NamespaceHost) -> None:
    lock = simhost.record(host.dir, "lock.json")
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"run_id": "dead", "owner": "ana@laptop", "since": 1, "command": "deploy"}))
    os.utime(lock, (1, 1))  # untouched for longer than the grace, and no holder process
    result, seen = deploy(host)
    assert result.ok
    assert [e.previous["owner"] for e in seen.of(events.LockTakenOver)] == ["ana@laptop"]
    assert not lock.exists()


def test_a_server_started_by_hand_on_the_gpus_is_stopped_as_a_stale_engine(host: nshost.NamespaceHost) -> None:
    """The operator's own engine from before fleet (same user, an engine by what it runs) holds the GPUs
    and the port: fleet stops it without --force and says why."""
    assert deploy(host)[0].ok
    planned = state(host)["plan"]["argv"]
    by_hand_argv = [*planned[:3], "--api-key", "sk-by-hand-4242", *planned[3:]]  # python -m sglang.launch_server
    argv = " ".join(shlex.quote(w) for w in by_hand_argv)
    ops.stop(host.transport(), host.host, force=False)
    host.shell(f"cd {host.dir} && setsid {argv} </dev/null >/dev/null 2>&1 &")
    # its children titled as the engine's (a child's argv names its title before it retitles itself), and
    # holding the GPUs: both schedulers and the detokenizer
    host.shell("for i in $(seq 200); do [ $(pgrep -c -f '^sglang::') -ge 3 ] && break; sleep 0.05; done")
    by_hand = int(host.shell("pgrep -f -o '[s]glang.launch_server'").strip())
    port = state(host)["port"]
    result, seen = deploy(host)
    assert result.ok
    assert state(host)["port"] == port  # its port is taken over, not moved off: it was about to be free
    stopped = seen.of(events.Stopped)[0].stopped
    assert by_hand in [p["pid"] for p in stopped]
    assert not alive(host, by_hand)
    shown = json.dumps([events.to_json(e) for e in seen.seen])  # what every listener was given
    assert "--api-key ***" in shown and "sk-by-hand-4242" not in shown  # its credential is not repeated


def test_a_host_that_binds_an_ipv6_address_is_checked_and_reached_on_it(tmp_path: Path) -> None:
    """bind_address ::1: the engine listens there, fleet's checks on the host and the endpoint it gives
    put the address in brackets, and a stop finds the server by its record and its port."""
    h = nshost.NamespaceHost(tmp_path, simhost.CT129, "::1")
    try:
        result, seen = deploy(h)
        assert result.ok, [e for e in seen.seen if not isinstance(e, events.LogLine)]
        assert result.endpoint == f"http://[::1]:{result.plan.port}"
        assert result.plan.argv()[result.plan.argv().index("--host") + 1] == "::1"
        listening = h.shell(f"cat /proc/net/tcp6 | grep -ci ':{result.plan.port:04X} '")
        assert int(listening.split()[0]) >= 1
        report = check_host(h.transport(), h.host, HealthOptions())
        assert {c.name: c.status for c in report.checks}["http_health"] == "ok", report.checks
        ops.stop(h.transport(), h.host, force=False)
        assert json.loads(simhost.newest_record(h.dir).read_text())["status"] == "stopped"
        assert "sglang.launch_server" not in h.shell("ps -eo args")
    finally:
        h.close()


def test_a_give_up_that_cannot_reach_the_host_says_so(host: nshost.NamespaceHost) -> None:
    """The connection is lost between the failed attempt and the step that stops what it left and records
    it failed: the deploy still fails with its diagnosis, and says the host was left as it was (it said
    nothing: a server answering garbage could be left up without a word)."""
    simhost.set_host(host.dir, inject_scheduler_error="RuntimeError: boom")
    t = host.transport()
    real_stream, streams = t.stream, []

    def lost_on_the_third(script: str, on_chunk: Any, **kwargs: Any) -> Any:  # act, watch, the give-up's act
        streams.append(script)
        if len(streams) == 3:
            raise TransportError("ct129: connection lost.", "")
        return real_stream(script, on_chunk, **kwargs)

    t.stream = lost_on_the_third  # type: ignore[method-assign]
    result, _ = deploy(host, t)
    assert not result.ok and result.attempts[-1].diagnosis is not None
    assert result.not_stopped == "ct129: connection lost."
    # the host was left as the attempt left it: its record unchanged, the run's lock there until it goes stale
    assert state(host)["status"] == "starting"
    assert simhost.record(host.dir, "lock.json").exists()


@pytest.mark.slow  # a ready_timeout of 6 s runs out
def test_an_engine_flooding_its_log_is_bounded_in_time_and_memory_and_stopped(host: nshost.NamespaceHost) -> None:
    """An engine that hangs while writing its log as fast as it can: the watcher never reached its
    ready_timeout check while lines came (ready_timeout: 20 ran 325 s), fleet kept every line (6.7 GB),
    and the hung engine was left running (issue 39). Now: the timeout holds, what fleet keeps is bounded,
    and the attempt's server is stopped when fleet gives up."""
    simhost.set_host(host.dir, flood_log=4_000_000)  # 4 MB a second of 4 KB lines, never ready
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    pb = dataclasses.replace(pb, spec=msgspec.structs.replace(pb.spec, ready_timeout_s=6, max_attempts=1))
    count = {"lines": 0, "chars": 0}

    def progress(event: events.Event) -> None:  # slower than the flood, as a terminal is; keeps nothing
        if isinstance(event, events.LogLine):
            count["lines"] += 1
            count["chars"] += len(event.line)
            time.sleep(0.002)

    result = ops.deploy(host.transport(), host.host, pb, force=False, engine_check=False, progress=progress)
    assert not result.ok and [a.outcome for a in result.attempts] == ["timeout"]
    assert count["lines"] > 100  # the flood went through fleet, line by line
    st = state(host)
    assert st["status"] == "failed"
    running = host.shell(f"ps -o stat= -g {st['pgid']} || true").split()
    assert [s for s in running if not s.startswith("Z")] == []  # nothing of the server runs (zombies: exited)
    assert not simhost.record(host.dir, "lock.json").exists()


def test_what_fleet_keeps_of_a_log_is_bounded_in_lines_and_bytes() -> None:
    from fleet.control.outcomes import KEPT_LOG_BYTES, KEPT_LOG_LINES, LogTail

    tail = LogTail()
    for i in range(3 * KEPT_LOG_LINES):
        tail.append(f"line {i}")
    assert len(tail.lines) == KEPT_LOG_LINES and tail.lines[-1] == f"line {3 * KEPT_LOG_LINES - 1}"
    for _ in range(1000):
        tail.append("x" * 16384)
    assert tail.chars <= KEPT_LOG_BYTES and tail.lines[-1] == "x" * 16384


@pytest.mark.slow  # the watcher waits out its stall window, then stops the engine (5 s drain)
def test_a_frozen_fleet_does_not_hold_the_host_or_leave_a_hung_engine(
    host: nshost.NamespaceHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fleet stopped (SIGSTOP, swapped out) while its engine hangs writing its log: the watcher blocked on
    its pipe, the host stayed locked for minutes past ready_timeout and the engine ran on (issue 39). The
    watcher never blocks now: reading nothing for stalled_s, fleet is frozen; the attempt's server is
    stopped, recorded failed, and the lock released, with fleet still frozen."""
    import threading

    monkeypatch.setattr(attempt_watch, "WATCH_STALLED_S", 2.0)
    simhost.set_host(host.dir, flood_log=2_000_000)
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    pb = dataclasses.replace(pb, spec=msgspec.structs.replace(pb.spec, max_attempts=1))
    thaw = threading.Event()

    def frozen(event: events.Event) -> None:  # fleet stops reading at the first line of the log
        if isinstance(event, events.LogLine):
            thaw.wait()

    done: list[Any] = []

    def run() -> None:
        try:
            done.append(ops.deploy(host.transport(), host.host, pb, force=False, engine_check=False, progress=frozen))
        except LockedError as exc:  # thawed, fleet finds the host gave its run up
            done.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        path = simhost.record(host.dir, "state.json", "qwen36-27b")
        assert wait_until(lambda: path.exists() and json.loads(path.read_text()).get("status") == "failed", 60)
        st = state(host)
        assert "read nothing" in st["reason"]
        running = host.shell(f"ps -o stat= -g {st['pgid']} || true").split()
        assert [s for s in running if not s.startswith("Z")] == []
        assert not simhost.record(host.dir, "lock.json").exists()
    finally:
        thaw.set()
        t.join(120)
    assert done and "the host stopped this run's server" in str(done[0]), done
    assert not simhost.record(host.dir, "lock.json").exists()


def test_a_terminal_that_does_not_read_never_gets_a_healthy_server_stopped(
    host: nshost.NamespaceHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleet deploy | less` left on its first page, or Ctrl-S: printing blocked, fleet stopped reading the
    watcher, and the host took it for frozen and stopped a healthy server (issue 39). Progress goes through a
    detached sink: the deploy reads on, proves the server, and what the terminal missed is counted."""
    import threading

    monkeypatch.setattr(attempt_watch, "WATCH_STALLED_S", 2.0)
    # more than every pipe between the engine's log and fleet holds, then loading for longer than the 2 s
    simhost.set_host(host.dir, chatty_log=4 << 20, chatty_s=4)
    resume = threading.Event()
    shown: list[events.Event] = []

    def paused_terminal(event: events.Event) -> None:
        if isinstance(event, events.LogLine):
            resume.wait()
        shown.append(event)

    progress = events.Detached(paused_terminal, limit=5)
    pb = load_playbook("qwen36-27b", ROOT / "playbooks")
    threading.Timer(10.0, resume.set).start()  # the operator scrolls on, long after the host's 2 s
    try:
        result = ops.deploy(host.transport(), host.host, pb, force=False, engine_check=False, progress=progress)
    finally:
        resume.set()
        progress.close()
    assert result.ok, (result.reason, [a.diagnosis for a in result.attempts])
    assert state(host)["status"] == "ready"
    said = [e.line for e in shown if isinstance(e, events.LogLine)]
    assert any(line.endswith("log lines not shown: the terminal was not reading") for line in said), said[-3:]


def test_an_api_key_reaches_the_engine_and_fleets_requests_and_nothing_else(
    host: nshost.NamespaceHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A playbook whose engine wants an API key: the smoke request got 401 and a healthy server was stopped
    as failed; a key in extra_args showed in plan, deploy --json, facts, the record and the act step's
    argv (issue 39). api_key_env: the key goes to the host on stdin, into the engine's command line by the
    launcher, and with fleet's requests; plans and records hold only its variable's name."""
    key = "sk-fleet-test-0123456789abcdef"
    monkeypatch.setenv("FLEET_TEST_API_KEY", key)
    pbs = tmp_path / "pbs"
    pbs.mkdir()
    (pbs / "keyed.yaml").write_text(
        (ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + "api_key_env: FLEET_TEST_API_KEY\n"
    )
    (pbs / "inline.yaml").write_text(
        (ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + f"extra_args: [--api-key, {key}]\n"
    )
    with pytest.raises(Exception, match="sets --api-key, which fleet sets itself; use api_key_env"):
        load_playbook("inline", pbs)
    pb = load_playbook("keyed", pbs)
    seen = Events()
    result = ops.deploy(host.transport(), host.host, pb, force=False, engine_check=False, progress=seen)
    assert result.ok, [a.diagnosis for a in result.attempts]
    st_text = simhost.record(host.dir, "state.json", "keyed").read_text()
    assert key not in st_text and key not in json.dumps(result.plan.to_json())
    assert "fleet-secret:FLEET_TEST_API_KEY" in result.plan.argv()
    shown = [e.line for e in seen.of(events.LogLine)]
    assert any("api_key=" in line for line in shown) and not any(key in line for line in shown)  # echoed, redacted
    st = json.loads(st_text)
    engine = host.shell(f"cat /proc/{engine_child(host, st['pid'])}/cmdline | tr '\\0' ' '")
    assert f"--api-key {key}" in engine  # the engine takes it only as a flag: its own command line has it
    launcher = host.shell(f"cat /proc/{st['pid']}/cmdline | tr '\\0' ' '")
    assert key not in launcher and "fleet-secret:FLEET_TEST_API_KEY" in launcher
    keyed = {"keyed": "FLEET_TEST_API_KEY"}
    with_key = check_host(
        host.transport(), host.host, HealthOptions(secrets={"FLEET_TEST_API_KEY": key}, api_keys=keyed)
    )
    checks = {(c.deployment, c.name): c for c in with_key.checks}
    assert checks[("keyed", "generation")].status == "ok" and "Paris" in checks[("keyed", "generation")].detail
    assert checks[("keyed", "models")].status == "ok", checks[("keyed", "models")]  # /v1/models asked with the key
    # the probe that asked again with the key left the log where the first one read it: what the engine
    # wrote meanwhile (that second request, at least) is read by the next check, not skipped
    book = json.loads((host.dir / "state" / "health.json").read_text())["deployments"]["keyed"]
    assert book["log_offset"] < Path(st["log"]).stat().st_size
    without = check_host(host.transport(), host.host, HealthOptions(api_keys=keyed))
    gen = {(c.deployment, c.name): c for c in without.checks}[("keyed", "generation")]
    assert "FLEET_TEST_API_KEY is not set in fleet's environment" in gen.detail
    # a key is sent only as the client's playbook of that name gives it: a host's record naming another
    # secret (rewritten on the host) gets nothing
    other = {"FLEET_TEST_API_KEY": key, "HF_TOKEN": "hf_secret_0123456789"}
    forged = dict(
        st, plan=dict(st["plan"], argv=[w.replace("FLEET_TEST_API_KEY", "HF_TOKEN") for w in st["plan"]["argv"]])
    )
    simhost.record(host.dir, "state.json", "keyed").write_text(json.dumps(forged))
    asked = check_host(host.transport(), host.host, HealthOptions(secrets=other, api_keys=keyed))
    gen = {(c.deployment, c.name): c for c in asked.checks}[("keyed", "generation")]
    assert "wants the key HF_TOKEN, which no playbook keyed here gives it" in gen.detail


def engine_child(host: nshost.NamespaceHost, launcher: int) -> int:
    return int(host.shell(f"ps -o pid= --ppid {launcher}").split()[0])
