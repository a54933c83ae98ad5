"""The SSH transport against a real sshd: output and exit codes, hostile strings stay data, strict host
keys, timeouts, one connection reused."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import CT129, run_cli
from fleet.errors import HostKeyError, HostUnreachable, TransportError
from fleet.host.common import SIMULATED_GPUS_MARK
from fleet.inventory import Host, load_inventory
from fleet.transport import SshOptions, base, connect
from fleet.transport.ssh_socket import tcp_connect
from fleet_testbed import simhost
from simengine import tcp_ports_to, wait_until

pytestmark = pytest.mark.ssh

HOSTILE = [
    "; touch {c}",
    "$(touch {c})",
    "`touch {c}`",
    "' ; touch {c}; '",
    '" ; touch {c}; "',
    "\n touch {c}",
    "a b  c",
    "&& touch {c}",
    "| touch {c}",
    "> {c}",
]


def transport(sb: simhost.Sandbox, known_hosts: Path | None = None, accept: bool = False):  # type: ignore[no-untyped-def]
    host = load_inventory(sb.inventory).hosts["ct129"]
    return connect(host, SshOptions(known_hosts or sb.known_hosts, sb.root / "ssh_config", accept))


def test_output_and_exit_codes(fleet_env: simhost.Sandbox) -> None:
    t = transport(fleet_env)
    try:
        r = t.run("echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.text, r.error_text) == (3, "out\n", "err\n")
        assert t.run("cat", stdin=b"through stdin").text == "through stdin"
        assert t.run("echo $SIM_HOST_DIR").text.strip() == str(fleet_env.host_dir("ct129"))
        assert t.commands_run == 3
    finally:
        t.close()


def test_a_reader_that_went_away_is_not_a_dropped_connection(fleet_env: simhost.Sandbox) -> None:
    """`fleet logs | head -1`: writing to the closed pipe fails in fleet's own process; that is no lost
    host (exit 3, "the SSH connection dropped"): the reader's own error comes through as it is, and the
    CLI ends as `tail` does (141), saying nothing."""
    import subprocess
    import sys

    t = transport(fleet_env)

    def reader_gone(chunk: bytes) -> bool:
        raise BrokenPipeError(32, "Broken pipe")

    try:
        with pytest.raises(BrokenPipeError):
            t.stream("echo one; sleep 5", reader_gone, timeout_s=30)
        assert t.run("echo still").text == "still\n"  # the connection itself is fine
    finally:
        t.close()
    assert run_cli("deploy", "qwen36-27b", "--host", "ct129").code == 0
    import json

    log = Path(json.loads(simhost.record(fleet_env.host_dir("ct129"), "state.json").read_text())["log"])
    with log.open("a") as f:  # far more than a pipe holds: fleet is still writing when `head` has gone
        f.write(("INFO a line of the engine's log, long enough to fill a pipe quickly\n") * 20000)
    piped = subprocess.run(
        f"{sys.executable} -m fleet logs --host ct129 -n 10000 | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == 141 and piped.stderr == "", piped.stderr


def test_output_written_after_the_exit_status_is_not_lost(fleet_env: simhost.Sandbox) -> None:
    """sshd sends the exit status when the command exits; output still in the pipe follows it."""
    t = transport(fleet_env)
    try:
        assert t.run("(sleep 0.2; echo late) & echo early").text == "early\nlate\n"
        chunks: list[bytes] = []
        assert t.stream("(sleep 0.2; echo late) & echo early", lambda c: chunks.append(c) or True) == 0
        assert b"".join(chunks) == b"early\nlate\n"
    finally:
        t.close()


def test_a_background_process_holding_stdout_does_not_hang_the_command(fleet_env: simhost.Sandbox) -> None:
    t = transport(fleet_env)
    try:
        start = time.monotonic()
        r = t.run("sleep 30 & echo started")  # sleep keeps the output open for 30 s
        assert (r.exit_code, r.text) == (0, "started\n")
        assert time.monotonic() - start < 10  # the exit status plus a grace period, not the 30 s
    finally:
        t.close()


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_strings_are_data_not_commands(fleet_env: simhost.Sandbox, tmp_path: Path, template: str) -> None:
    canary = fleet_env.host_dir("ct129") / "canary"
    canary.unlink(missing_ok=True)
    value = template.format(c=canary)
    t = transport(fleet_env)
    try:
        r = t.run(f"printf '%s' {shlex.quote(value)}")
        assert r.text == value
    finally:
        t.close()
    assert not canary.exists()


def test_unknown_host_key_is_refused_with_how_to_accept(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    before = tcp_ports_to(CT129.address, fleet_env.port)
    t = transport(fleet_env, empty)
    with pytest.raises(HostKeyError) as err:
        t.run("true")
    assert "is unknown" in err.value.message and "--accept-new-host-key" in err.value.hint
    # the refused connection is not left open (paramiko's thread closes it a moment later)
    assert wait_until(lambda: tcp_ports_to(CT129.address, fleet_env.port) <= before, timeout=5)


def test_accept_new_host_key_records_it_then_checks_it(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    t = transport(fleet_env, known, accept=True)
    assert t.run("true").exit_code == 0
    t.close()
    assert f"[{CT129.address}]:{fleet_env.port} ssh-ed25519 " in known.read_text()
    strict = transport(fleet_env, known)
    assert strict.run("true").exit_code == 0
    strict.close()


def test_changed_host_key_is_always_refused(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = (other.with_suffix(".pub")).read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[{CT129.address}]:{fleet_env.port} {kind} {key}\n")
    for accept in (False, True):
        t = transport(fleet_env, known, accept=accept)
        with pytest.raises(HostKeyError) as err:
            t.run("true")
        # the host itself is named (not as a "jump host"), and the hint names its known_hosts entry
        assert err.value.message.startswith(f"ct129: the host key of {CT129.address}:{fleet_env.port} has CHANGED")
        assert f"ssh-keygen -R '[{CT129.address}]:{fleet_env.port}'" in err.value.hint


def test_cli_accept_flag_reaches_the_transport(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = tmp_path / "kh"
    known.write_text("")
    monkeypatch.setenv("FLEET_KNOWN_HOSTS", str(known))
    assert run_cli("facts", "--host", "ct129").code == 3
    assert run_cli("--accept-new-host-key", "facts", "--host", "ct129", "--json").code == 0
    assert run_cli("facts", "--host", "ct129", "--json").code == 0


@pytest.mark.parametrize(
    ("variable", "content", "said"),
    [
        ("FLEET_KNOWN_HOSTS", None, "(FLEET_KNOWN_HOSTS) is a directory; it must be the SSH host keys fleet checks"),
        ("FLEET_KNOWN_HOSTS", b"\xec\x00 not text \xff\n", "cannot be read as a known_hosts file (UnicodeDecodeError"),
        ("FLEET_SSH_CONFIG", None, "(FLEET_SSH_CONFIG) is a directory; it must be the ssh_config fleet reads"),
        ("FLEET_SSH_CONFIG", b"Host *\n  ProxyCommand\n", "cannot be read as an ssh_config file (Unparsable line"),
    ],
)
def test_a_bad_known_hosts_or_ssh_config_file_is_a_clear_error(
    fleet_env: simhost.Sandbox,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    content: bytes | None,
    said: str,
) -> None:
    """A directory, binary junk or an unparsable line: named with the file, before any connection (was
    a traceback, or for an ssh_config directory silently no config at all)."""
    path = tmp_path / "file"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    monkeypatch.setenv(variable, str(path))
    deploy = run_cli("deploy", "qwen36-27b", "--host", "ct129")
    assert deploy.code == 2 and f"{path} " in deploy.err and said in deploy.err and "Traceback" not in deploy.err
    status = run_cli("status", "--host", "ct129")
    assert status.code == 2 and said in status.out
    assert run_cli("status", "--host", "ct129", "--json").code == 2


@pytest.mark.parametrize(
    ("identity", "said"),
    [
        ("dir", "is a directory"),
        ("missing", "does not exist"),
        ("binary", "is not a private key"),
        ("device", "is not a regular file"),
    ],
)
def test_an_identity_file_that_is_no_key_is_named_as_such(
    fleet_env: simhost.Sandbox, tmp_path: Path, identity: str, said: str
) -> None:
    """Not "cannot connect to 127.0.0.3:2222 (Is a directory). Check the address and port" (or a
    UnicodeDecodeError traceback for a binary file): the setting, its path and what is wrong."""
    path = tmp_path / "key"
    if identity == "dir":
        path.mkdir()
    elif identity == "binary":
        path.write_bytes(b"\x00\xaf\xfe binary, not a key\n")
    elif identity == "device":
        path = Path("/dev/null")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        re.sub(r"identity_file: .*", f"identity_file: {path}", fleet_env.inventory.read_text(), count=1)
    )
    r = run_cli("-i", str(inventory), "deploy", "qwen36-27b", "--host", "ct129")
    assert r.code == 2 and f"ct129: identity_file {path} {said}" in r.err and "Traceback" not in r.err
    assert "identity_file: for this host in the inventory" in r.err
    status = run_cli("-i", str(inventory), "status", "--host", "ct129")
    assert status.code == 2 and f"identity_file {path} {said}" in status.out


def test_the_connection_to_sshd_sends_small_messages_at_once(fleet_env: simhost.Sandbox) -> None:
    """paramiko's own socket leaves Nagle's algorithm on: authentication then waits for sshd's delayed
    ACK (the benchmark measures a new connection ready in ~27 ms instead of ~115 ms)."""
    t = transport(fleet_env)
    try:
        t.run("true")
        sock = t._conn.client.get_transport().sock  # type: ignore[attr-defined]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert sock.getpeername() == (CT129.address, fleet_env.port)
    finally:
        t.close()


def connects_counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The addresses fleet's SSH transport opens a TCP connection to, from now on."""
    import fleet.transport.ssh as ssh

    opened: list[str] = []

    def counted(host: str, port: int, timeout_s: float) -> socket.socket:
        opened.append(host)
        return tcp_connect(host, port, timeout_s)

    monkeypatch.setattr(ssh, "tcp_connect", counted)
    return opened


def twice_at_once(command: Callable[[], None]) -> None:
    """`command` in two threads started together: a deploy's probe and its act started ahead."""
    start = threading.Barrier(2)

    def run() -> None:
        start.wait()
        command()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


def test_two_threads_first_commands_open_one_connection(
    fleet_env: simhost.Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy's act step starts beside its probe (fleet.step_ahead): both ask a transport not yet
    connected at once, and the host sees one connection, not two (one left open until fleet exits)."""
    opened = connects_counted(monkeypatch)
    t = transport(fleet_env)
    said: list[str] = []
    try:
        twice_at_once(lambda: said.append(t.run("echo hi").text))
        assert said == ["hi\n", "hi\n"] and opened == [CT129.address]
    finally:
        t.close()


def test_through_a_jump_host_the_one_tcp_connection_is_fleets_own(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    host, config = behind_a_jump_host(fleet_env, tmp_path)
    t = connect(host, SshOptions(fleet_env.known_hosts, config))
    try:
        t.run("true")
        sock = t._conn.gateway.client.get_transport().sock  # type: ignore[attr-defined]
        assert sock.getpeername() == ("127.0.2.2", fleet_env.port)  # the jump host; ct129 is a channel in it
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        t.close()


def test_every_read_acknowledges_at_once_where_a_plain_socket_delays() -> None:
    """After a few request/answer exchanges Linux delays ACKs (up to 40 ms); sshd, which keeps Nagle on
    until a session starts, then holds its next packet for that ACK. fleet's socket asks again for
    quick ACKs after every read."""
    quick_ack = socket.TCP_QUICKACK  # type: ignore[attr-defined]  # Linux, where fleet's tests run

    def acks_at_once_after_exchanges(client: socket.socket, peer: socket.socket) -> list[int]:
        seen = []
        for _ in range(5):
            client.sendall(b"ping")
            peer.recv(4)
            peer.sendall(b"pong")
            client.recv(4)
            seen.append(client.getsockopt(socket.IPPROTO_TCP, quick_ack))
        return seen

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as plain, server.accept()[0] as peer:
            assert 0 in acks_at_once_after_exchanges(plain, peer), "the kernel never delays ACKs here"
        with tcp_connect("127.0.0.1", port, 5) as ours, server.accept()[0] as peer:
            assert acks_at_once_after_exchanges(ours, peer) == [1] * 5
            assert ours.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_making_connections_leaves_the_shared_fabric_config_alone(fleet_env: simhost.Sandbox) -> None:
    """Connections made in a sweep's threads share one fabric Config; writing to it re-merges it, and it is
    empty meanwhile for the threads reading it (a 50-host sweep lost hosts to "no config key 'user'")."""
    from fleet.transport import ssh

    config = ssh._fabric_config(str(fleet_env.root / "ssh_config"))
    merged = config._config
    for _ in range(3):
        transport(fleet_env)
    assert config._config is merged


def test_command_timeout_is_a_clear_error(fleet_env: simhost.Sandbox) -> None:
    t = transport(fleet_env)
    try:
        start = time.monotonic()
        with pytest.raises(TransportError, match="command timed out after 1 s"):
            t.run("sleep 10", timeout_s=1)
        assert time.monotonic() - start < 5
    finally:
        t.close()


def test_a_command_that_floods_its_output_is_stopped_and_the_connection_kept(
    fleet_env: simhost.Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One answer is held to a bound (fleet.transport.base.ANSWER_BYTES, 32 MiB; 4 MiB here)."""
    monkeypatch.setattr(base, "ANSWER_BYTES", 4 << 20)
    t = transport(fleet_env)
    try:
        with pytest.raises(TransportError, match="more than 4 MiB of output for one answer; it was stopped"):
            t.run("exec cat /dev/zero", timeout_s=60)
        r = t.run("head -c 3000000 /dev/zero >&2; echo the-end >&2; echo ok")
        assert r.text == "ok\n" and r.error_text.endswith("the-end\n") and len(r.stderr) == base.ERROR_TAIL_BYTES
    finally:
        t.close()


def test_refused_and_silent_hosts_fail_within_the_connect_timeout(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    silent = socket.socket()
    silent.bind(("127.0.2.50", 2322))
    silent.listen()
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        "defaults: {port: 2322, connect_timeout_s: 2}\nhosts:\n  refusing: {address: 127.0.2.51}\n"
        "  silent: {address: 127.0.2.50}\n"
    )
    hosts = load_inventory(inv).hosts
    try:
        for name, message in (("refusing", "cannot connect"), ("silent", "SSH")):
            t = connect(hosts[name], SshOptions(fleet_env.known_hosts, None))
            start = time.monotonic()
            with pytest.raises(HostUnreachable, match=message):
                t.run("true")
            assert time.monotonic() - start < 8
    finally:
        silent.close()


def test_a_first_connect_that_failed_is_not_tried_again_by_the_thread_that_waited_for_it(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frozen sshd (the TCP connection accepted, no banner) as a deploy's probe and its act started
    ahead both reach it: one attempt, its error said to both, not a second connection (or a second
    failed login) after the first timed out."""
    silent = socket.socket()
    silent.bind(("127.0.2.52", 0))
    silent.listen()
    inv = tmp_path / "inv.yaml"
    port = silent.getsockname()[1]
    # 4 s: the second thread reads the attempts made before the first one ends, however loaded the machine
    inv.write_text(f"defaults: {{port: {port}, connect_timeout_s: 4}}\nhosts:\n  frozen: {{address: 127.0.2.52}}\n")
    opened = connects_counted(monkeypatch)
    t = connect(load_inventory(inv).hosts["frozen"], SshOptions(fleet_env.known_hosts, None))
    said: list[BaseException] = []

    def first_command() -> None:
        try:
            t.run("true")
        except HostUnreachable as exc:
            said.append(exc)

    try:
        twice_at_once(first_command)
        assert len(said) == 2 and all("no SSH answer" in str(exc) for exc in said)
        assert opened == ["127.0.2.52"]
        with pytest.raises(HostUnreachable):  # a later command tries again: the host may have come back
            t.run("true")
        assert opened == ["127.0.2.52"] * 2
    finally:
        t.close()
        silent.close()


def test_secrets_travel_on_stdin_not_argv(fleet_env: simhost.Sandbox) -> None:
    t = transport(fleet_env)
    try:
        r = t.run("read -r s; sleep 0.3 & ps -eo args; wait; echo got=$s", stdin=b"hf_TOPSECRET\n")
        assert "got=hf_TOPSECRET" in r.text
        assert r.text.count("hf_TOPSECRET") == 1
    finally:
        t.close()


def test_ssh_config_alias_user_port_and_identity_are_honoured(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu-box-alias\n  HostName {CT129.address}\n  Port {fleet_env.port}\n  User root\n"
        f"  IdentityFile {fleet_env.root / 'keys' / 'id_ed25519'}\n"
    )
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  box:\n    address: gpu-box-alias\n")
    host = load_inventory(inv).hosts["box"]
    t = connect(host, SshOptions(fleet_env.known_hosts, config))
    try:
        assert t.run("echo $SIM_HOST_DIR").text.strip() == str(fleet_env.host_dir("ct129"))
    finally:
        t.close()


def behind_a_jump_host(sb: simhost.Sandbox, tmp_path: Path) -> tuple[Host, Path]:
    """ct129 reached through blackwell (ssh_config alias "jump"), and that ssh_config."""
    key = sb.root / "keys" / "id_ed25519"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host jump\n  HostName 127.0.2.2\n  Port {sb.port}\n  IdentityFile {key}\n")
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  box:\n    address: {CT129.address}\n    port: {sb.port}\n"
        f"    identity_file: {key}\n    proxy_jump: jump\n"
    )
    return load_inventory(inv).hosts["box"], config


def test_proxy_jump_reaches_a_host_through_another(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    host, config = behind_a_jump_host(fleet_env, tmp_path)
    t = connect(host, SshOptions(fleet_env.known_hosts, config))
    try:
        assert t.run("echo $SIM_HOST_DIR").text.strip() == str(fleet_env.host_dir("ct129"))
    finally:
        t.close()
    empty = tmp_path / "kh"
    empty.write_text("")
    strict = connect(host, SshOptions(empty, config))  # the jump host's key is checked strictly too
    with pytest.raises(HostKeyError):
        strict.run("true")


def test_a_jump_hosts_key_is_named_and_needs_its_own_consent(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    """Only the target's key is known: the error names the jump host (not the target, whose key is fine),
    and --accept-new-host-key does not record the jump host's key; --accept-new-jump-host-key does."""
    host, config = behind_a_jump_host(fleet_env, tmp_path)
    known = tmp_path / "kh"
    target_key = f"[{CT129.address}]:{fleet_env.port}"
    known.write_text(
        "".join(x + "\n" for x in fleet_env.known_hosts.read_text().splitlines() if x.startswith(target_key))
    )
    before = known.read_text()
    for options in (SshOptions(known, config), SshOptions(known, config, accept_new_host_key=True)):
        t = connect(host, options)
        with pytest.raises(HostKeyError) as caught:
            t.run("true")
        t.close()
        assert caught.value.message.startswith(
            f"box: the host key of the jump host [127.0.2.2]:{fleet_env.port} (ProxyJump for "
        )
        assert "--accept-new-jump-host-key" in caught.value.hint
        assert known.read_text() == before
    t = connect(host, SshOptions(known, config, accept_new_jump_host_key=True))
    try:
        assert t.run("echo $SIM_HOST_DIR").text.strip() == str(fleet_env.host_dir("ct129"))
    finally:
        t.close()
    assert known.read_text().startswith(before) and f"[127.0.2.2]:{fleet_env.port}" in known.read_text()


def test_a_changed_jump_host_key_is_named_as_the_jump_hosts(fleet_env: simhost.Sandbox, tmp_path: Path) -> None:
    host, config = behind_a_jump_host(fleet_env, tmp_path)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()[:2]
    known = tmp_path / "kh"
    lines = [x for x in fleet_env.known_hosts.read_text().splitlines() if not x.startswith("[127.0.2.2]")]
    known.write_text("\n".join([*lines, f"[127.0.2.2]:{fleet_env.port} {' '.join(other)}"]) + "\n")
    t = connect(host, SshOptions(known, config, accept_new_host_key=True, accept_new_jump_host_key=True))
    with pytest.raises(HostKeyError) as caught:
        t.run("true")
    t.close()
    assert caught.value.message.startswith("box: the host key of the jump host 127.0.2.2 (ProxyJump for ")
    assert "has CHANGED" in caught.value.message


def test_local_connection_runs_the_same_probe_without_ssh(
    fleet_env: simhost.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = fleet_env.host_dir("blackwell")
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  here:\n    connection: local\n    engines: {{sglang: {h}/env/bin/python}}\n"
        f"    models_dir: {h}/models\n    state_dir: {tmp_path}/state\n    gpu_devices: {h}/dev/nvidia*\n"
    )
    r = run_cli("-i", str(inv), "facts", "--host", "here", "--json")
    assert r.code == 0, r.err
    import json

    facts = json.loads(r.out)
    assert facts["round_trips"] == 1 and len(facts["gpu"]["gpus"]) == 8


def local_gpu_host(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in GPU device file, and an inventory whose host `here` is this machine (connection: local)."""
    dev = tmp_path / "dev" / "nvidia0"
    dev.parent.mkdir()
    dev.touch()
    (dev.parent / SIMULATED_GPUS_MARK).touch()
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  here:\n    connection: local\n    gpu_devices: {tmp_path}/dev/nvidia*\n"
        f"    state_dir: {tmp_path}/state\n    log_dir: {tmp_path}/logs\n    models_dir: {tmp_path}\n"
    )
    return dev, inv


def test_a_hostile_process_name_reaches_the_terminal_as_plain_text(tmp_path: Path) -> None:
    """Anyone on a host can name a process with escape sequences (window title, clear screen) or rich
    markup; `fleet facts` printed the first raw (found by a hostile run of this session's change)."""
    dev, inv = local_gpu_host(tmp_path)
    name = "\x1b]0;owned\x07\x1b[2J[link=https://example.invalid]evil[/link]"
    holder = subprocess.Popen(["bash", "-c", f"exec 3<{dev}; exec -a {shlex.quote(name)} sleep 30"])
    try:
        assert wait_until(lambda: str(dev) in [os.path.realpath(p) for p in Path(f"/proc/{holder.pid}/fd").iterdir()])
        for argv in (["facts", "--host", "here"], ["stop", "--host", "here"]):
            r = run_cli("-i", str(inv), *argv)
            assert r.code == 0 and "\x1b" not in r.out + r.err and "\x07" not in r.out + r.err, argv
            assert "[link=https://example.invalid]evil[/link]" in r.out, r.out  # shown as text, not as markup
    finally:
        holder.kill()
        holder.wait()


def test_a_worker_titled_like_an_engines_in_a_users_own_script_is_not_stopped_as_a_server(tmp_path: Path) -> None:
    """vllm.LLM and sglang.Engine title the workers of a user's own script as a server's (VLLM::EngineCore,
    sglang::scheduler_TP0): one on the GPUs under a script, not under an engine, is the user's job, refused
    without --force; the same title under an engine's entry point is a stale server's worker, stopped."""
    dev, inv = local_gpu_host(tmp_path)
    worker = (
        "import setproctitle, sys, time\n"
        "setproctitle.setproctitle('VLLM::EngineCore')\n"
        f"gpu = open({str(dev)!r})\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    script = tmp_path / "batch.py"  # the user's offline job: its engine core is a child it titles so
    script.write_text(
        "import subprocess, sys\n"
        f"core = subprocess.Popen([sys.executable, '-c', {worker!r}], stdout=sys.stdout)\n"
        "core.wait()\n"
    )
    job = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert job.stdout is not None and job.stdout.readline() == b"up\n"
        core = int(subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()[0])
        refused = run_cli("-i", str(inv), "stop", "--host", "here")
        assert refused.code == 0 and f"not stopped: pid {core}" in refused.out, refused.out
        assert "not an inference server" in refused.out
        assert job.poll() is None and Path(f"/proc/{core}").exists()
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        job.stdout.close()


def test_local_connection_treats_a_holder_in_the_callers_process_group_as_foreign(tmp_path: Path) -> None:
    """Commands run locally get a session of their own, as sshd gives them: fleet's "own process group",
    which it never signals, is then its command's, not that of the shell or script that ran fleet. (On the
    real H200 box, a torch process started by the same script passed for fleet's own and was not reported.)"""
    dev, inv = local_gpu_host(tmp_path)
    holder = subprocess.Popen(["sh", "-c", f"exec 3<{dev}; exec sleep 30"])  # pytest's own process group
    try:
        assert wait_until(lambda: str(dev) in [os.path.realpath(p) for p in Path(f"/proc/{holder.pid}/fd").iterdir()])
        refused = run_cli("-i", str(inv), "stop", "--host", "here")
        assert refused.code == 0 and f"not stopped: pid {holder.pid}" in refused.out
        assert "not an inference server" in refused.out
        assert holder.poll() is None
        forced = run_cli("-i", str(inv), "stop", "--host", "here", "--force")
        assert forced.code == 0 and "stopped 1 process(es)" in forced.out
        assert holder.wait(timeout=10) is not None
    finally:
        holder.kill()
        holder.wait()
