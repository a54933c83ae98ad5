"""A simulated GPU host without sshd, for fast tests of the deploy loop: fleet's own host scripts run
unchanged in the host's own PID and mount namespaces (so `ps`, `fuser` and `kill` there see only that
host), entered with nsenter instead of over SSH. Same scripts, same protocol; only the channel differs.

Needs root and util-linux's unshare/nsenter (`available()` says); tests skip without them.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import shutil
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from fleet.errors import HostUnreachable
from fleet.inventory import Host, load_inventory
from fleet.transport.base import CommandResult, OnChunk, Stdin, feed, timed_out
from fleet_testbed import simhost


def loopback_address() -> str:
    """A loopback address of its own for one simulated host: the namespaces share the network, and two test
    runs on one machine (a CI run beside a developer's) must not meet on 127.0.3.3:30000."""
    return f"127.{random.randrange(100, 200)}.{random.randrange(0, 256)}.{random.randrange(2, 255)}"


def available() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("unshare")) and bool(shutil.which("nsenter"))


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True)


class Network:
    """A bridge on this machine joining hosts that each have a network namespace of their own: real
    addresses, real TCP between them, and a firewall per host (iptables inside its namespace). A subnet
    and bridge name of its own, so two test runs on one machine never meet."""

    def __init__(self) -> None:
        tag = f"{random.randrange(16**5):05x}"
        self.bridge = f"flb{tag}"
        self.prefix = f"10.{random.randrange(100, 250)}.{random.randrange(0, 256)}"
        self.members = 0
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.prefix}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def attach(self, pid: int) -> tuple[str, str]:
        """Gives the namespace of `pid` an interface on the bridge; returns (its address, its name there)."""
        self.members += 1
        outside, inside = f"{self.bridge}h{self.members}", f"{self.bridge}n{self.members}"
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("link", "set", inside, "netns", str(pid))
        address = f"{self.prefix}.{self.members + 1}"
        for argv in (
            ["addr", "add", f"{address}/24", "dev", inside],
            ["link", "set", inside, "up"],
            ["link", "set", "lo", "up"],
        ):
            subprocess.run(["nsenter", "--target", str(pid), "--net", "ip", *argv], check=True, capture_output=True)
        return address, inside

    def close(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def inner_pid(outer: int) -> int:
    """The first process inside the namespaces `unshare --fork` (pid `outer`) made."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = Path(f"/proc/{outer}/task/{outer}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise RuntimeError("the namespace's first process did not start")


class NamespaceHost:
    """One simulated host: its directory (simhost.build_host) and a namespace kept open by a sleeper."""

    def __init__(
        self, root: Path, spec: simhost.HostSpec, bind_address: str = "", network: Network | None = None
    ) -> None:
        """`network`: the host gets a network namespace of its own on that bridge (its address is then
        the bridge's, not `bind_address`); else it shares this machine's network and binds `bind_address`."""
        own_net = ["--net", "--uts"] if network is not None else []  # and a host name of its own
        self._outer = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", *own_net, "--kill-child", "sleep", "infinity"],
            start_new_session=True,
        )
        self.init_pid = self._inner_pid()
        self.interface = "lo"
        if network is not None:
            bind_address, self.interface = network.attach(self.init_pid)
            subprocess.run(["nsenter", "--target", str(self.init_pid), "--uts", "hostname", spec.name], check=True)
        self.namespaces = ["--pid", "--mount", *own_net]
        self.spec = replace(spec, address=bind_address)
        self.dir = simhost.build_host(root, self.spec)
        simhost.set_host(self.dir, startup_scale=0.01)
        self.env = {
            "PATH": f"{self.dir}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.dir),
            "SIM_HOST_DIR": str(self.dir),
            "LANG": "C.UTF-8",
            # `make coverage` measures the host scripts too: coverage follows subprocesses through these
            **{k: v for k, v in os.environ.items() if k.startswith("COVERAGE_")},
        }
        inventory = root / f"{spec.name}-inventory.yaml"
        inventory.write_text(
            f"hosts:\n  {spec.name}:\n    connection: local\n    bind_address: '{bind_address}'\n"
            f"    engines: {{sglang: {self.dir}/env/bin/python}}\n    models_dir: {self.dir}/models\n"
            f"    state_dir: {self.dir}/state\n    log_dir: {self.dir}/logs\n"
            f"    gpu_devices: {self.dir}/dev/nvidia*\n"
            # the simulated host's own kernel log: this machine's dmesg (a test's container OOM-killed
            # at its memory limit, say) is not the simulated host's
            f"    kernel_log: {self.dir}/kern.log\n"
            + (f"    network_interface: {self.interface}\n" if network is not None else "")
        )
        self.host: Host = load_inventory(inventory).hosts[spec.name]

    def _inner_pid(self) -> int:
        return inner_pid(self._outer.pid)

    def transport(self) -> NamespaceTransport:
        return NamespaceTransport(self)

    def shell(self, command: str) -> str:
        """A command inside the host, as a test's side door."""
        return self.transport().run(command, timeout_s=30).text

    def block_port(self, port: int) -> None:
        """A firewall on this host that silently drops connections to `port` (a packet filter, not a
        refusal: the peer's connect times out, as across a real firewall)."""
        self.shell(f"iptables -I INPUT -p tcp --dport {port} -j DROP")

    def close(self) -> None:
        """Ends the namespace: --kill-child takes every process of the host with it."""
        self._outer.send_signal(signal.SIGKILL)
        self._outer.wait()


class NamespaceTransport:
    """fleet's Transport protocol, into a NamespaceHost. `cut_after` (bytes) ends a stream early the way
    a dropped connection does, to test resuming."""

    def __init__(self, host: NamespaceHost) -> None:
        self.nshost = host
        self.host_name = host.spec.name
        self.commands_run = 0
        self.chunked_input_connects = False
        # streams still running: close() ends them, as closing a connection ends its commands
        self._streaming: set[subprocess.Popen[bytes]] = set()
        self.cut_after: int | None = None

    def _argv(self, script: str) -> list[str]:
        return [
            "nsenter",
            "--target",
            str(self.nshost.init_pid),
            *self.nshost.namespaces,
            "--",
            "/bin/sh",
            "-c",
            script,
        ]

    def run(self, script: str, *, stdin: bytes = b"", timeout_s: float = 60.0) -> CommandResult:
        self.commands_run += 1
        try:
            p = subprocess.run(
                self._argv(script),
                input=stdin,
                capture_output=True,
                timeout=timeout_s,
                env=self.nshost.env,
                start_new_session=True,  # as sshd runs each command
            )
        except subprocess.TimeoutExpired as exc:
            raise timed_out(self.host_name, timeout_s) from exc
        return CommandResult(p.returncode, p.stdout, p.stderr)

    def stream(self, script: str, on_chunk: OnChunk, *, stdin: Stdin = b"", timeout_s: float = 3600.0) -> int:
        self.commands_run += 1
        proc = subprocess.Popen(
            self._argv(script),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.nshost.env,
            start_new_session=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        self._streaming.add(proc)
        pipe = proc.stdin
        # bytes: left open while fleet listens: its end tells the command fleet is gone (as over SSH). A
        # broken pipe: it ended without reading its input; its output and exit code still count.
        with contextlib.suppress(BrokenPipeError):
            feed(stdin, lambda chunk: (pipe.write(chunk), pipe.flush()), pipe.close)
        deadline = time.monotonic() + timeout_s
        sent = 0
        try:
            while time.monotonic() < deadline:
                if not select.select([proc.stdout], [], [], 0.5)[0]:
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    return proc.wait()
                if self.cut_after is not None and sent + len(chunk) > self.cut_after:
                    on_chunk(chunk[: self.cut_after - sent])
                    self.cut_after = None
                    raise HostUnreachable(f"{self.host_name}: the connection dropped (cut by the test).", "")
                sent += len(chunk)
                if not on_chunk(chunk):
                    return -1
            raise timed_out(self.host_name, timeout_s, "stream")
        finally:
            with contextlib.suppress(BrokenPipeError, ValueError):  # unread input left in its buffer
                proc.stdin.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            self._streaming.discard(proc)

    def close(self) -> None:
        for proc in list(self._streaming):
            with contextlib.suppress(OSError):
                proc.kill()
