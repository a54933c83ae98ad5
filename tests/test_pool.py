"""The connection pool (`fleet pool start`): SSH connections kept open between fleet runs.

Every test here runs with a real pool process (started by the CLI, as a user would) in front of the real
sshd of the simulated hosts. The transport and deploy tests imported below run again unchanged through
it: the pool must be invisible except for the handshakes it saves.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import CT129, run_cli
from fleet.errors import ConfigError, HostKeyError
from fleet.frames import read_frame
from fleet.inventory import load_inventory
from fleet.paths import pool_socket
from fleet.transport import SshOptions, connect
from fleet.transport.pool import PooledTransport, ask_pool, raise_error_frame
from fleet_testbed import simhost
from simengine import tcp_ports_to, wait_until

# The same tests, run again with the pool in front (pytest collects what a test module imports).
from test_deploy import (  # noqa: F401
    playbooks,
    test_secrets_never_reach_argv_state_or_output,
    test_the_motivating_story_fixes_two_crashes_then_remembers,
)
from test_transport import (  # noqa: F401
    test_a_background_process_holding_stdout_does_not_hang_the_command,
    test_accept_new_host_key_records_it_then_checks_it,
    test_changed_host_key_is_always_refused,
    test_hostile_strings_are_data_not_commands,
    test_output_and_exit_codes,
    test_output_written_after_the_exit_status_is_not_lost,
    test_proxy_jump_reaches_a_host_through_another,
    test_secrets_travel_on_stdin_not_argv,
    test_ssh_config_alias_user_port_and_identity_are_honoured,
    test_unknown_host_key_is_refused_with_how_to_accept,
)

pytestmark = pytest.mark.ssh


@pytest.fixture(autouse=True)
def pool(fleet_env: simhost.Sandbox, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A running pool with its own cache dir (short: a unix socket path holds 108 bytes)."""
    cache = Path(tempfile.mkdtemp(prefix="fp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    r = run_cli("pool", "start", "--idle-timeout", "60")
    assert r.code == 0 and "connection pool started" in r.out, r.err
    yield cache / "fleet"
    run_cli("pool", "stop")
    shutil.rmtree(cache, ignore_errors=True)


def pool_state() -> dict:
    r = run_cli("pool", "status", "--json")
    return json.loads(r.out)


def ct129_transport(sb: simhost.Sandbox):  # type: ignore[no-untyped-def]
    host = load_inventory(sb.inventory).hosts["ct129"]
    return connect(host, SshOptions(sb.known_hosts, sb.root / "ssh_config"))


def test_one_connection_serves_run_after_run(fleet_env: simhost.Sandbox) -> None:
    before = tcp_ports_to(CT129.address, fleet_env.port)  # other tests' connections, if any
    assert run_cli("status", "--host", "ct129").code in (0, 1)
    held_by_pool = tcp_ports_to(CT129.address, fleet_env.port) - before
    assert len(held_by_pool) == 1  # still open after the run ended
    for _ in range(3):
        run_cli("health", "--host", "ct129", "--skip-generation")
    assert tcp_ports_to(CT129.address, fleet_env.port) - before == held_by_pool  # no new handshake
    (held,) = pool_state()["connections"]
    assert held["host"] == "ct129" and held["open"] and held["commands"] >= 4


def test_a_run_reaches_the_host_without_loading_paramiko(fleet_env: simhost.Sandbox) -> None:
    code = (
        "import sys; from fleet.cli import main; rc = main(['status', '--host', 'ct129']); "
        "print('paramiko' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ct129" in r.stdout and r.stdout.strip().endswith("False"), r.stdout + r.stderr


def test_a_dropped_connection_is_replaced_without_failing_the_run(fleet_env: simhost.Sandbox) -> None:
    t = ct129_transport(fleet_env)
    assert isinstance(t, PooledTransport) and t.run("echo one").text == "one\n"
    before = tcp_ports_to(CT129.address, fleet_env.port)
    (first,) = pool_state()["connections"]
    simhost.drop_connections(fleet_env, CT129)  # e.g. sshd restarted, or the host rebooted
    time.sleep(0.3)
    assert t.run("echo two").text == "two\n"
    after = tcp_ports_to(CT129.address, fleet_env.port)
    assert len(after - before) == 1 and before - after  # the old connection gone, one new one
    (second,) = pool_state()["connections"]
    assert second["opened_at"] > first["opened_at"] and second["commands"] == 2


def test_a_refused_handshake_leaves_nothing_in_the_pool(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = load_inventory(fleet_env.inventory).hosts["ct129"]
    with pytest.raises(HostKeyError):
        connect(host, SshOptions(empty, None)).run("true")
    assert pool_state()["connections"] == []  # not listed as a "(closed)" connection until the idle timeout
    assert run_cli("status", "--host", "ct129").code == 0  # the host's real connection is unaffected
    assert [c["open"] for c in pool_state()["connections"]] == [True]


def test_a_stream_ends_on_the_host_when_the_run_goes_away(fleet_env: simhost.Sandbox) -> None:
    code = (
        "from fleet.inventory import load_inventory; from fleet.transport import SshOptions, connect; "
        f"from pathlib import Path; h = load_inventory(Path('{fleet_env.inventory}')).hosts['ct129']; "
        f"t = connect(h, SshOptions(Path('{fleet_env.known_hosts}'), None)); "
        "t.stream('echo started; sleep 30', lambda c: print(c, flush=True) or True)"
    )
    quiet_stream = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert quiet_stream.stdout is not None and "started" in quiet_stream.stdout.readline()
    (held,) = pool_state()["connections"]
    assert held["in_use"] == 1
    quiet_stream.send_signal(signal.SIGKILL)  # Ctrl-C / a killed cron run: nothing more is written
    quiet_stream.wait()
    quiet_stream.stdout.close()
    deadline = time.monotonic() + 5
    while pool_state()["connections"][0]["in_use"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool_state()["connections"][0]["in_use"] == 0  # channel closed, not left until `sleep 30` ends


def test_the_pool_exits_after_its_idle_timeout(fleet_env: simhost.Sandbox, pool: Path) -> None:
    assert run_cli("pool", "stop").code == 0
    assert run_cli("pool", "start", "--idle-timeout", "1").code == 0
    pid = pool_state()["pid"]
    before = tcp_ports_to(CT129.address, fleet_env.port)
    assert run_cli("status", "--host", "ct129").code in (0, 1)
    deadline = time.monotonic() + 10
    while pool_socket().exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pool_socket().exists()
    assert run_cli("pool", "status").code == 1
    assert "closed ct129 after 1 s idle" in (pool / "pool.log").read_text()
    stat = Path(f"/proc/{pid}/stat")
    while stat.exists() and stat.read_text().split()[2] != "Z" and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    assert not stat.exists() or stat.read_text().split()[2] == "Z"  # exited (a zombie until init reaps it)
    # its socket file goes first (no new clients), then its SSH connections; all are gone once it exited
    assert tcp_ports_to(CT129.address, fleet_env.port) <= before


def test_a_socket_left_by_a_dead_pool_is_ignored_then_reclaimed(fleet_env: simhost.Sandbox, pool: Path) -> None:
    state = pool_state()
    os.kill(state["pid"], signal.SIGKILL)  # dies without removing its socket file
    time.sleep(0.2)
    assert pool_socket().exists()
    r = run_cli("status", "--host", "ct129")  # runs directly over SSH
    assert r.code in (0, 1) and "ct129" in r.out, r.err
    assert run_cli("pool", "status").code == 1
    assert run_cli("pool", "start").code == 0
    assert pool_state()["pid"] != state["pid"]


def test_a_second_start_finds_the_running_pool(fleet_env: simhost.Sandbox) -> None:
    pid = pool_state()["pid"]
    r = run_cli("pool", "start")
    assert r.code == 0 and f"already running (pid {pid})" in r.out


def test_a_cache_path_too_long_for_a_unix_socket_is_said_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was "cannot reach the connection pool (AF_UNIX path too long). Stop it with `fleet pool stop`"."""
    long = tmp_path / ("x" * (110 - len(str(tmp_path))))
    long.mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(long))
    for argv in (("pool", "start"), ("pool", "status"), ("pool", "serve")):
        r = run_cli(*argv)
        assert r.code == 2 and "the pool's socket path is too long for a unix socket" in r.err, argv
        assert "Set XDG_CACHE_HOME to a shorter directory" in r.err


def test_only_this_user_can_use_the_pool(fleet_env: simhost.Sandbox) -> None:
    sock = pool_socket()
    assert sock.stat().st_mode & 0o777 == 0o600
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to try as another user")
    try_status = (
        "import socket,struct,json,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "b=json.dumps({'op':'status','version':'0'}).encode(); s.sendall(struct.pack('>I',len(b))+b); "
        "print(repr(s.recv(100)))"
    )
    no_answer = ("b''", "ConnectionResetError", "BrokenPipeError")  # closed before, during or after the request
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-c"]
    r = subprocess.run([*as_nobody, try_status, str(sock)], capture_output=True, text=True, timeout=30)
    assert "PermissionError" in r.stderr  # the socket file's mode
    for loosened in (sock.parent.parent, sock.parent):
        os.chmod(loosened, 0o755)
    os.chmod(sock, 0o666)  # even if every mode were loosened, the pool checks who is asking
    r = subprocess.run([*as_nobody, try_status, str(sock)], capture_output=True, text=True, timeout=30)
    assert any(x in r.stdout + r.stderr for x in no_answer) and "pid" not in r.stdout, r.stdout + r.stderr


def test_a_pool_from_another_fleet_version_says_so(fleet_env: simhost.Sandbox) -> None:
    sock = ask_pool(pool_socket(), {"op": "status", "version": "0.0.0"})
    assert sock is not None
    with sock, pytest.raises(ConfigError) as err:
        raise_error_frame(read_frame(sock))
    assert "runs fleet" in err.value.message and "fleet pool stop && fleet pool start" in err.value.hint


def test_the_pool_log_names_hosts_never_commands_or_input(fleet_env: simhost.Sandbox, pool: Path) -> None:
    t = ct129_transport(fleet_env)
    assert t.run("cat >/dev/null; echo marker-in-script", stdin=b"hf_POOLSECRET").exit_code == 0
    log = (pool / "pool.log").read_text()
    assert "connected ct129" in log
    assert "hf_POOLSECRET" not in log and "marker-in-script" not in log


# --- warm runs: the `fleet` command forked from the pool's pre-imported process ------------------------

FLEET = str(Path(sys.executable).parent / "fleet")


def fleet_process(*argv: str, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """The installed `fleet` command as a person runs it, with Python's import log on stderr."""
    return subprocess.run(
        [sys.executable, "-X", "importtime", FLEET, *argv], capture_output=True, text=True, timeout=120, cwd=cwd, **kw
    )


def imported_click(r: subprocess.CompletedProcess[str]) -> bool:
    return any(line.split("|")[-1].strip() == "click" for line in r.stderr.splitlines() if "|" in line)


def test_a_warm_run_answers_like_a_cold_one_without_importing_fleet(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    warm = fleet_process("health", "--host", "ct129", "--skip-generation", "--json")
    assert not imported_click(warm), warm.stderr[-2000:]  # the client imported no CLI, no pydantic
    cold_cache = tmp_path / "cold"
    cold = fleet_process(
        "health",
        "--host",
        "ct129",
        "--skip-generation",
        "--json",
        env={**os.environ, "XDG_CACHE_HOME": str(cold_cache)},
    )
    assert imported_click(cold)
    assert warm.returncode == cold.returncode
    w, c = json.loads(warm.stdout), json.loads(cold.stdout)
    assert [(x["name"], x["status"]) for x in w["checks"]] == [(x["name"], x["status"]) for x in c["checks"]]
    assert (w["status"], w["gpus"], w["playbook"]) == (c["status"], c["gpus"], c["playbook"])


def first_row(status_out: str) -> str:
    """`fleet status`'s first row, under its header."""
    header, row, *_ = status_out.splitlines()
    assert header.startswith("DEPLOYMENT")
    return row


def test_a_warm_run_uses_its_own_directory_environment_and_streams(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    shutil.copy(fleet_env.inventory, tmp_path / "mine.yaml")
    env = {k: v for k, v in os.environ.items() if k != "FLEET_INVENTORY"}
    r = fleet_process("-i", "mine.yaml", "status", "--host", "ct129", cwd=tmp_path, env=env)
    assert r.returncode == 0 and first_row(r.stdout).startswith("ct129") and not imported_click(r), r.stderr[-1500:]
    bad = fleet_process("-i", "mine.yaml", "status", "--host", "nosuch", cwd=tmp_path, env=env)
    assert bad.returncode == 2 and bad.stdout == "" and "error:" in bad.stderr and "nosuch" in bad.stderr
    assert not imported_click(bad)


def test_ctrl_c_reaches_the_warm_run(fleet_env: simhost.Sandbox) -> None:
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    follow = subprocess.Popen(
        [FLEET, "logs", "--host", "ct129", "--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert follow.stdout is not None and follow.stdout.readline()  # following the log
    follow.send_signal(signal.SIGINT)
    try:
        _, err = follow.communicate(timeout=10)
    finally:
        follow.kill()
    assert follow.returncode == 130 and "aborted" in err, err


def test_a_warm_run_ends_when_its_fleet_process_is_killed(fleet_env: simhost.Sandbox) -> None:
    """SIGKILL (a cron timeout's) cannot be passed on; in-process the command would die with it."""
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    follow = subprocess.Popen(
        [FLEET, "logs", "--host", "ct129", "--follow"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert follow.stdout is not None and follow.stdout.readline()  # following the log, in a warm process
    follow.send_signal(signal.SIGKILL)
    follow.wait()
    # The warm process writes to the same pipe: its end of file means that process has ended too.
    ended = threading.Event()
    threading.Thread(target=lambda: (follow.stdout and follow.stdout.read(), ended.set()), daemon=True).start()
    assert ended.wait(10), "the warm run went on following the log after its fleet process was killed"
    follow.stdout.close()
    assert wait_until(lambda: pool_state()["connections"][0]["in_use"] == 0, timeout=5)  # the stream on the host too


def test_after_fleet_changes_runs_leave_the_stale_warm_process_alone(fleet_env: simhost.Sandbox) -> None:
    import fleet.paths

    source = Path(fleet.paths.__file__)
    before = source.stat()
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # as an upgrade or an edit would
    try:
        r = fleet_process("status", "--host", "ct129")
    finally:
        os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert r.returncode == 0 and first_row(r.stdout).startswith("ct129")
    assert imported_click(r)  # ran in its own process, with the code on disk


def test_stopping_the_pool_stops_its_warm_process(fleet_env: simhost.Sandbox, pool: Path) -> None:
    warm_socket = pool / "pool-run.sock"
    assert warm_socket.exists()
    assert run_cli("pool", "stop").code == 0
    assert not warm_socket.exists() and not pool_socket().exists()
    r = fleet_process("status", "--host", "ct129")
    assert r.returncode == 0 and imported_click(r)


def test_relative_paths_mean_what_they_mean_where_fleet_runs(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(fleet_env.root / "keys" / "id_ed25519", tmp_path / "mykey")
    shutil.copy(fleet_env.known_hosts, tmp_path / "my_known_hosts")
    key_line = f"  identity_file: {fleet_env.root}/keys/id_ed25519"
    inventory = fleet_env.inventory.read_text()
    assert key_line in inventory
    (tmp_path / "inv.yaml").write_text(inventory.replace(key_line, "  identity_file: mykey"))
    monkeypatch.chdir(tmp_path)  # not where the pool was started
    monkeypatch.setenv("FLEET_KNOWN_HOSTS", "my_known_hosts")
    r = run_cli("-i", "inv.yaml", "status", "--host", "ct129")
    assert r.code == 0 and first_row(r.out).startswith("ct129"), r.err
    (held,) = pool_state()["connections"]
    assert held["host"] == "ct129" and held["commands"] == 1


def test_ctrl_c_before_the_warm_run_answers_says_aborted_not_a_traceback() -> None:
    """Found by an adversarial pass: Ctrl-C within the first milliseconds under `fleet pool` (before the
    pool's forked run said its pid) printed a KeyboardInterrupt traceback. The forked run itself ends
    with the launcher (`_end_with_the_launcher`)."""
    code = (
        "import sys, fleet.launch as launch\n"
        "def interrupted(argv): raise KeyboardInterrupt\n"
        "launch.run_warm = interrupted\n"
        "sys.argv = ['fleet', 'status']\n"
        "launch.main()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 130 and run.stderr.strip() == "aborted", run.stderr
