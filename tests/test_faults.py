"""Faults, on real sshd and real processes: each asserts the outcome, the message, and that no orphan
server or stale lock is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import CT129, ROOT, run_cli
from fleet.terminal import safe_line
from fleet.transport.ssh import ANSWER_S, SILENT_S
from fleet_testbed import simhost

pytestmark = pytest.mark.ssh
FLEET = str(Path(sys.executable).parent / "fleet")


def env_of(sb: simhost.Sandbox) -> dict[str, str]:
    return {
        **os.environ,
        **sb.env(),
        "FLEET_INVENTORY": str(sb.inventory),
        "FLEET_PLAYBOOKS": str(ROOT / "playbooks"),
        "PYTHONPATH": str(ROOT / "testbed"),
    }


def state_path(sb: simhost.Sandbox) -> Path:
    return simhost.record(sb.host_dir("ct129"), "state.json")


def wait_launched(sb: simhost.Sandbox, timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            st = json.loads(state_path(sb).read_text())
            if st.get("pid"):
                return st
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("the deploy never launched")


def deploy_in_background(sb: simhost.Sandbox, *extra: str, quiet: bool = False) -> subprocess.Popen[str]:
    """`fleet deploy qwen36-27b --host ct129` as its own process (to kill, interrupt or cut it)."""
    out = subprocess.DEVNULL if quiet else subprocess.PIPE
    return subprocess.Popen(
        [FLEET, "deploy", "qwen36-27b", "--host", "ct129", *extra],
        env=env_of(sb),
        stdout=out,
        stderr=out,
        text=True,
    )


def servers(sb: simhost.Sandbox) -> list[str]:
    """Process groups running an SGLang server on ct129 (one per server: launcher, main, children)."""
    command = "ps -eo pgid=,args= | grep '[s]glang.launch_server' || true"
    out = subprocess.run([*simhost.ssh_argv(sb, CT129), command], capture_output=True, text=True).stdout
    return sorted({line.split()[0] for line in out.splitlines()})


def no_stale_lock(sb: simhost.Sandbox) -> bool:
    return not simhost.record(sb.host_dir("ct129"), "lock.json").exists()


def test_dropped_connection_while_streaming_resumes_without_gaps_or_repeats(fleet_env: simhost.Sandbox) -> None:
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=6.0)
    p = deploy_in_background(fleet_env, "--show-log")
    st = wait_launched(fleet_env)
    time.sleep(1.0)
    simhost.drop_connections(fleet_env, CT129)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "connection dropped; reconnecting and resuming the log at byte" in err
    streamed = [line[len("  | ") :] for line in err.splitlines() if line.startswith("  | ")]
    # the log's lines end at \n (a progress bar's redraws are \r inside one), shown terminal-safe
    logged = [safe_line(x) for x in Path(st["log"]).read_bytes().decode().split("\n")]
    assert (
        streamed == logged[: len(streamed)]
        and len(streamed) >= logged.index(next(x for x in logged if "fired up and ready" in x)) + 1
    )
    assert len(servers(fleet_env)) == 1 and no_stale_lock(fleet_env)


def state_of(sb: simhost.Sandbox) -> dict:
    return json.loads(state_path(sb).read_text())


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_fleet_killed_or_interrupted_mid_deploy_frees_the_host_at_once(
    fleet_env: simhost.Sandbox, how: signal.Signals
) -> None:
    """The host-side watcher notices its client is gone (its stdin ends) while the engine is still loading
    and silent: it records the server as unverified and releases the lock; the next run needs no
    takeover and replaces the unverified server."""
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=6.0)
    p = deploy_in_background(fleet_env, quiet=True)
    first = wait_launched(fleet_env)
    time.sleep(0.5)
    p.send_signal(how)
    p.wait(timeout=30)
    assert wait_for(lambda: no_stale_lock(fleet_env), 5), "the lock outlived the run that held it"
    st = state_of(fleet_env)
    assert st["status"] == "unverified" and "before the server was checked" in st["reason"]
    assert st["pid"] == first["pid"]  # the launched engine stays recorded, not orphaned
    status = run_cli("status", "--host", "ct129")
    assert "unverified" in status.out or "dead" in status.out
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=0.3)
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 0, r.err
    assert "took over" not in r.err
    assert "stopped fleet's server pid" in r.err  # the half-done attempt's server, found from the host's state
    assert state_of(fleet_env)["pid"] != first["pid"]
    assert len(servers(fleet_env)) == 1 and no_stale_lock(fleet_env)


def test_frozen_host_is_given_up_within_the_documented_bound_and_left_consistent(
    fleet_env: simhost.Sandbox,
) -> None:
    """Every sshd of the host stopped, connections left open: fleet says so within SILENT_S + ANSWER_S (plus
    slack), exits 3; once the host thaws, its watcher lets go and the next deploy recovers."""
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=6.0)
    p = deploy_in_background(fleet_env)
    first = wait_launched(fleet_env)
    time.sleep(0.5)
    simhost.freeze_host(fleet_env, CT129, True)
    try:
        start = time.monotonic()
        _, err = p.communicate(timeout=120)
        waited = time.monotonic() - start
    finally:
        simhost.freeze_host(fleet_env, CT129, False)
    assert p.returncode == 3, err
    assert "ct129: no answer from the host for" in err and "Traceback" not in err
    assert waited < SILENT_S + ANSWER_S + 10, waited
    assert "paramiko" not in err and "No existing session" not in err
    assert wait_for(lambda: no_stale_lock(fleet_env), 10), "the thawed host kept the lock"
    assert state_of(fleet_env)["pid"] == first["pid"]
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=0.3)
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 0, r.err
    assert len(servers(fleet_env)) == 1 and no_stale_lock(fleet_env)


def test_frozen_host_at_connect_is_named_as_such(fleet_env: simhost.Sandbox) -> None:
    simhost.freeze_host(fleet_env, CT129, True)
    try:
        p = subprocess.run(
            [FLEET, "status", "--host", "ct129"], env=env_of(fleet_env), capture_output=True, text=True, timeout=90
        )
    finally:
        simhost.freeze_host(fleet_env, CT129, False)
    assert p.returncode == 3
    said = p.stdout + p.stderr
    assert "no SSH answer from" in said and "it accepted the TCP connection, then said nothing" in said
    assert "No existing session" not in p.stderr and "Traceback" not in p.stderr and "paramiko" not in p.stderr


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_deleted_or_truncated_log_does_not_kill_a_healthy_server(fleet_env: simhost.Sandbox, damage: str) -> None:
    """Readiness also comes from /health: the server is proven and kept; the log's fate is reported."""
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=3.0)
    p = deploy_in_background(fleet_env)
    st = wait_launched(fleet_env)
    assert wait_for(lambda: Path(st["log"]).stat().st_size > 0, 10)
    time.sleep(0.5)  # the watcher has read what is there (it looks every 20 ms): a cut loses lines it knew
    log = Path(st["log"])
    if damage == "deleted":
        log.unlink()
    else:
        os.truncate(log, 0)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert f"the engine's log was {damage}" in err
    assert state_of(fleet_env)["status"] == "ready" and state_of(fleet_env)["pid"] == st["pid"]
    assert len(servers(fleet_env)) == 1 and no_stale_lock(fleet_env)


def test_host_that_stops_answering_mid_deploy_fails_clearly_then_recovers(fleet_env: simhost.Sandbox) -> None:
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=6.0)
    p = deploy_in_background(fleet_env)
    wait_launched(fleet_env)
    time.sleep(0.5)
    simhost.freeze_sshd(fleet_env, CT129, True)
    try:
        simhost.drop_connections_outside(fleet_env, CT129)
        start = time.monotonic()
        out, err = p.communicate(timeout=180)
        assert time.monotonic() - start < 120
    finally:
        simhost.freeze_sshd(fleet_env, CT129, False)
    assert p.returncode == 3
    assert "error: ct129:" in err and ("no SSH answer" in err or "SSH" in err)
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=0.3)
    time.sleep(6)
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 0, r.err
    assert len(servers(fleet_env)) == 1 and no_stale_lock(fleet_env)


def test_full_log_disk_is_refused_before_anything_is_stopped(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    running = servers(fleet_env)
    logs = fleet_env.host_dir("ct129") / "logs"
    mount = subprocess.run(
        [*simhost.ssh_argv(fleet_env, CT129), f"mount -t tmpfs -o size=64k tmpfs {logs}"],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.fail(f"cannot mount a tiny tmpfs in the host's namespace: {mount.stderr}")
    try:
        r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
        assert r.code == 4 and "MiB free for logs in" in r.err and "Free disk space there first." in r.err
        assert servers(fleet_env) == running and no_stale_lock(fleet_env)
    finally:
        subprocess.run([*simhost.ssh_argv(fleet_env, CT129), f"umount {logs}"], capture_output=True)


@pytest.mark.parametrize("damage", ["", "{not json", '{"status": "ready", "pid": "x"}'])
def test_damaged_state_file_is_reported_and_rebuilt(fleet_env: simhost.Sandbox, damage: str) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    state_path(fleet_env).write_text(damage)
    status = run_cli("status", "--host", "ct129")
    assert status.code == 0 and "Traceback" not in status.out + status.err
    h = run_cli("health", "--host", "ct129", "--json")
    assert "Traceback" not in h.out + h.err
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 0, r.err
    assert json.loads(state_path(fleet_env).read_text())["status"] == "ready"
    assert len(servers(fleet_env)) == 1


def test_heal_while_a_deploy_holds_the_lock_does_not_act(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    pgid = json.loads(state_path(fleet_env).read_text())["pgid"]
    subprocess.run([*simhost.ssh_argv(fleet_env, CT129), f"kill -9 -- -{pgid}"], check=True)
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=6.0)
    p = deploy_in_background(fleet_env, quiet=True)
    try:
        deadline = time.monotonic() + 20
        while not simhost.record(fleet_env.host_dir("ct129"), "lock.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        h = run_cli("health", "--host", "ct129", "--heal", "--json", "--lock-file", str(tmp_path / "l"))
        row = json.loads(h.out)
        assert row["heal"] is None or row["heal"].startswith("qwen36-27b: heal failed: ct129: locked by"), row["heal"]
    finally:
        assert p.wait(timeout=120) == 0
    assert len(servers(fleet_env)) == 1 and no_stale_lock(fleet_env)


def test_host_that_stops_answering_during_launch_fails_clearly_then_recovers(fleet_env: simhost.Sandbox) -> None:
    simhost.set_host(fleet_env.host_dir("ct129"), check_delay_s=3.0)  # keeps fleet inside its act round trip
    p = deploy_in_background(fleet_env)
    lock = simhost.record(fleet_env.host_dir("ct129"), "lock.json")
    deadline = time.monotonic() + 20
    while not lock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    simhost.freeze_sshd(fleet_env, CT129, True)
    try:
        simhost.drop_connections_outside(fleet_env, CT129)
        out, err = p.communicate(timeout=180)
    finally:
        simhost.freeze_sshd(fleet_env, CT129, False)
    assert p.returncode == 3 and "error: ct129:" in err
    simhost.set_host(fleet_env.host_dir("ct129"), check_delay_s=0)
    time.sleep(6)
    r = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 0, r.err
    assert len(servers(fleet_env)) == 1 and no_stale_lock(fleet_env)


def test_secrets_in_engine_errors_are_redacted(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "hf_LEAKYtoken987654321"
    monkeypatch.setenv("HF_TOKEN", token)
    pbs = tmp_path / "pbs"
    pbs.mkdir()
    (pbs / "tok.yaml").write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + "secret_env: [HF_TOKEN]\n")
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(pbs))
    simhost.set_host(fleet_env.host_dir("ct129"), inject_scheduler_error=f"RuntimeError: 401 for token {token}")
    r = run_cli("deploy", "tok", "--host", "ct129")
    assert r.code == 7 and "RuntimeError: 401 for token ***" in r.err
    assert token not in r.out + r.err
    j = run_cli("deploy", "tok", "--host", "ct129", "--json")
    assert token not in j.out + j.err


def test_commands_over_several_hosts_report_the_others_and_exit_with_what_failed(
    fleet_env: simhost.Sandbox, tmp_path: Path
) -> None:
    """One unreachable host does not hide the others, and a script can tell it happened: exit 3 (every
    failure was "unreachable"), not 0 (status said nothing) or 1 (stop)."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        fleet_env.inventory.read_text().replace(
            "groups:", "  gone: {address: 127.0.2.51, connect_timeout_s: 2}\ngroups:"
        )
    )
    status = run_cli("-i", str(inv), "status")
    assert status.code == 3, status
    header, *rows = status.out.splitlines()
    lines = {line.split()[0]: line for line in rows}
    assert header.split()[:2] == ["DEPLOYMENT", "STATUS"]
    assert set(lines) == {"blackwell", "ct129", "gone"} and "unreachable" in lines["gone"]
    as_json = run_cli("-i", str(inv), "status", "--json")
    assert as_json.code == 3 and len(as_json.out.splitlines()) == 3
    assert run_cli("-i", str(inv), "status", "--host", "ct129").code == 0
    stop = run_cli("-i", str(inv), "stop", "--all")
    assert stop.code == 3 and "ct129: stopped" in stop.out and "gone: error: gone: cannot connect" in stop.err


def test_the_launcher_does_not_depend_on_the_playbooks_environment(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PATH=/nonexistent in the engine's environment (opted in): the launcher still records the engine's
    exit status, and the secret never touches the host's disk (it travels on the launcher's stdin)."""
    token = "hf_NEVERonDISK123456"
    monkeypatch.setenv("HF_TOKEN", token)
    pbs = tmp_path / "pbs"
    pbs.mkdir()
    (pbs / "odd.yaml").write_text(
        (ROOT / "playbooks" / "qwen36-27b.yaml").read_text()
        + "secret_env: [HF_TOKEN]\nenv: {PATH: /nonexistent}\nallow_runtime_env: [PATH]\nmax_attempts: 1\n"
    )
    monkeypatch.setenv("FLEET_PLAYBOOKS", str(pbs))
    simhost.set_host(fleet_env.host_dir("ct129"), inject_scheduler_error="RuntimeError: boom from the engine")
    r = run_cli("deploy", "odd", "--host", "ct129")
    assert r.code == 7 and "RuntimeError: boom from the engine" in r.err
    logs = fleet_env.host_dir("ct129") / "logs"
    exits = sorted(logs.glob("odd-*.exit"))
    assert exits and exits[-1].read_text().strip() not in ("", "127")
    host_files = [p for p in fleet_env.host_dir("ct129").rglob("*") if p.is_file() and p.stat().st_size < 1 << 20]
    assert not [p for p in host_files if token.encode() in p.read_bytes()]
    assert not list(logs.glob("*.env")) and no_stale_lock(fleet_env)


def on_host(sb: simhost.Sandbox, command: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """A shell command inside the simulated host (its mount and pid namespaces)."""
    return subprocess.run([*simhost.ssh_argv(sb, CT129), command], capture_output=True, text=True, **kwargs)


def test_a_disk_that_fills_after_the_stop_rolls_back_to_the_previous_server(fleet_env: simhost.Sandbox) -> None:
    """The space check passed, then the state disk filled while the old server's GPU memory was being
    released: the state write fails after the stop. fleet relaunches the previous server, cleans up its
    temporary file and lock, and says what happened (it left no server, a stale lock and a temp file)."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    old_pid = state_of(fleet_env)["pid"]
    state = fleet_env.host_dir("ct129") / "state"
    mounted = on_host(
        fleet_env,
        f"cp -a {state} {state}.saved && mount -t tmpfs -o size=20m tmpfs {state} && cp -a {state}.saved/. {state}/",
    )
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a small tmpfs in the host's namespace: {mounted.stderr}")
    simhost.set_host(fleet_env.host_dir("ct129"), memory_release_s=4)
    fill = subprocess.Popen(
        [
            *simhost.ssh_argv(fleet_env, CT129),
            f"while kill -0 {old_pid} 2>/dev/null; do sleep 0.05; done; "
            f"dd if=/dev/zero of={state}/filler bs=1M 2>/dev/null",
        ]
    )
    try:
        p = subprocess.run([FLEET, "restart", "--host", "ct129"], env=env_of(fleet_env), capture_output=True, text=True)
        fill.wait(timeout=30)
        assert p.returncode == 7, p.stderr
        assert "failed after the old server was stopped (No space left on device)" in p.stderr
        assert "rolled back: the previous server was relaunched (pid" in p.stderr
        assert len(servers(fleet_env)) == 1
        left = on_host(fleet_env, f"ls -a {state}").stdout.split()
        assert "lock.json" not in left and not [f for f in left if f.endswith(".tmp")], left
    finally:
        on_host(fleet_env, f"umount {state}; rm -rf {state}.saved")
        simhost.set_host(fleet_env.host_dir("ct129"), memory_release_s=0)


def test_a_full_state_disk_is_refused_before_anything_is_stopped(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    running = servers(fleet_env)
    state = fleet_env.host_dir("ct129") / "state"
    mounted = on_host(
        fleet_env,
        f"cp -a {state} {state}.saved && mount -t tmpfs -o size=8m tmpfs {state} && cp -a {state}.saved/. {state}/",
    )
    assert mounted.returncode == 0, mounted.stderr
    try:
        r = run_cli("restart", "--host", "ct129")
        assert r.code == 4 and "MiB free" in r.err and "before it stops anything" in r.err
        assert servers(fleet_env) == running
        assert "lock.json" not in on_host(fleet_env, f"ls -a {state}").stdout.split()
    finally:
        on_host(fleet_env, f"umount {state}; rm -rf {state}.saved")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_fleet_gone_during_the_engine_check_changes_nothing_on_the_host(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: signal.Signals
) -> None:
    """The act step holds fleet's stdin: when fleet goes (Ctrl-C, kill -9) while the engine's own check
    runs, the host stops the check and changes nothing. It went on to stop the healthy server and launch
    the new plan with nothing watching it (found by an adversarial run)."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    before = state_of(fleet_env)
    pbs = tmp_path / "pbs"
    pbs.mkdir()
    (pbs / "other.yaml").write_text((ROOT / "playbooks" / "qwen36-27b.yaml").read_text() + "mem_fraction: 0.8\n")
    simhost.set_host(fleet_env.host_dir("ct129"), check_delay_s=4.0)
    p = subprocess.Popen(
        [FLEET, "deploy", "other", "--host", "ct129", "--name", "qwen36-27b"],  # a new plan for the same deployment
        env={**env_of(fleet_env), "FLEET_PLAYBOOKS": str(pbs)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lock = simhost.record(fleet_env.host_dir("ct129"), "lock.json")
    assert wait_for(lock.exists, 20)
    time.sleep(1.0)
    p.send_signal(how)
    p.wait(timeout=30)
    assert wait_for(lambda: no_stale_lock(fleet_env), 5), "the act step kept the lock after fleet was gone"
    time.sleep(4.0)  # past the end of the check: nothing may happen later either
    after = state_of(fleet_env)
    assert (after["status"], after["pid"], after["playbook"]) == ("ready", before["pid"], "qwen36-27b")
    assert len(servers(fleet_env)) == 1


def test_fleet_gone_while_the_log_is_busy_still_frees_the_host(fleet_env: simhost.Sandbox) -> None:
    """A watcher writing a busy log to a closed channel found fleet gone by a broken pipe, and died without
    recording the server as unverified or releasing the lock (found by an adversarial run)."""
    simhost.set_host(fleet_env.host_dir("ct129"), startup_scale=6.0)
    p = deploy_in_background(fleet_env, quiet=True)
    st = wait_launched(fleet_env)
    stop = threading.Event()

    def chatter() -> None:
        with open(st["log"], "a") as log:
            i = 0
            while not stop.is_set():  # ~20k lines a second: busy, without starving everything else
                log.write("".join(f"INFO chatty line {i + j}\n" for j in range(200)))
                log.flush()
                i += 200
                time.sleep(0.01)

    writer = threading.Thread(target=chatter, daemon=True)
    writer.start()
    try:
        time.sleep(1.0)
        p.send_signal(signal.SIGKILL)  # the channel closes mid-flood: the watcher's next write breaks
        p.wait(timeout=60)
        assert wait_for(lambda: no_stale_lock(fleet_env), 10), "the watcher kept the lock"
    finally:
        stop.set()
        writer.join()
        if p.poll() is None:
            p.kill()
            p.wait()
    assert state_of(fleet_env)["status"] == "unverified"


def test_a_log_disk_out_of_inodes_is_refused_before_anything_is_stopped(fleet_env: simhost.Sandbox) -> None:
    """Bytes to spare but no inode left: the old server was stopped, then no log could be created."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    running = servers(fleet_env)
    logs = fleet_env.host_dir("ct129") / "logs"
    mounted = on_host(fleet_env, f"mount -t tmpfs -o size=500m,nr_inodes=8 tmpfs {logs}")
    assert mounted.returncode == 0, mounted.stderr
    try:
        r = run_cli("restart", "--host", "ct129")
        assert r.code == 4 and "free inodes in" in r.err and "before it stops anything" in r.err, r.err
        assert servers(fleet_env) == running
    finally:
        on_host(fleet_env, f"umount {logs}")
