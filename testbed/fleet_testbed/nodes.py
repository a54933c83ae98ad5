"""Simulated hosts that are separate machines as far as fleet can tell, for trying a multi-node group from
the command line: each host's sshd runs in network, UTS, PID and mount namespaces of its own, on a bridge
of this machine (a real address per host, real TCP between them, a host name each). The loopback sandbox
cannot do this: its hosts share one network and one host name, which a group's pre-flight rightly refuses.

Needs root, util-linux's unshare and iproute2 (as fleet_testbed.nshost).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

from fleet_testbed import nshost, simhost

NODES_FILE = "nodes.json"  # in the root: the bridge to remove when the nodes go down

# One model over the two nodes (2 GPUs each: TP 4): rank 0 on node-a serves HTTP; the ranks meet at its
# port 50000.
TWO_NODES = """\
engine: sglang
model: Qwen3.6-27B
served_name: qwen36
hosts: [node-a, node-b]
tp: 4
dist_port: 50000
smoke:
  prompt: "What is the capital of France? Answer in one word."
  expect: "(?i)paris"
"""


def _start_node(root: Path, spec: simhost.HostSpec, network: nshost.Network, port: int) -> simhost.HostSpec:
    """One node: its directory, its sshd listening on every address of its own network; the spec with the
    address it got on the bridge."""
    hdir = simhost.build_host(root, spec)
    # the ranks' rendezvous waits scale with start-up: at 0 (SIM_SPEED=0) it would time out at once
    simhost.set_host(hdir, startup_scale=max(float(os.environ.get("SIM_SPEED", "1.0")), 0.01))
    host_key, _ = simhost.ensure_keys(root)
    path_env = f"{hdir}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    config = hdir / "sshd_config"
    config.write_text(
        f"ListenAddress 0.0.0.0:{port}\nHostKey {host_key}\nAuthorizedKeysFile {root}/keys/authorized_keys\n"
        f"PidFile {hdir}/sshd.pid\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nMaxSessions 200\nLogLevel ERROR\n"
        f"SetEnv SIM_HOST_DIR={hdir} PATH={path_env}\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    own = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--uts", "--kill-child"]
    named = ["sh", "-c", f'hostname {shlex.quote(spec.name)} && exec "$@"', "sh"]
    sshd = [simhost.sshd_binary(), "-D", "-e", "-f", str(config)]
    simhost.stop_sshd(hdir)
    with open(hdir / "sshd.log", "ab") as log:
        proc = subprocess.Popen(
            [*own, *named, *simhost._own_files(hdir), *sshd],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    (hdir / "sshd.outer.pid").write_text(str(proc.pid))
    address, interface = network.attach(nshost.inner_pid(proc.pid))
    (hdir / "interface").write_text(interface)
    placed = replace(spec, address=address)
    simhost._wait_port(address, port)
    return placed


def up(root: Path, names: tuple[str, ...] = ("node-a", "node-b"), port: int = 2222) -> simhost.Sandbox:
    """Two-GPU A6000 nodes named `names`, each its own machine on a new bridge; an inventory for them."""
    down(root)
    root.mkdir(parents=True, exist_ok=True)
    network = nshost.Network()
    (root / NODES_FILE).write_text(json.dumps({"bridge": network.bridge}))
    specs = [_start_node(root, replace(simhost.CT129, name=n), network, port) for n in names]
    (root / "known_hosts").write_text("".join(simhost.host_key_line(root, s.address, port) for s in specs))
    (root / "ssh_config").write_text("# fleet nodes: nothing from ~/.ssh/config\n")
    inventory = simhost.inventory_yaml(root, specs, port).replace("# Simulated fleet on loopback", "# Simulated nodes")
    for s in specs:  # the interface each node's ranks talk on (what an operator sets on a box with several)
        interface = (root / s.name / "interface").read_text()
        inventory = inventory.replace(
            f"    kernel_log: {root / s.name}/kern.log\n",
            f"    kernel_log: {root / s.name}/kern.log\n    network_interface: {interface}\n",
        )
    (root / "inventory.yaml").write_text(inventory)
    return simhost.Sandbox(root, specs, port)


def down(root: Path) -> None:
    simhost.down(root)
    nodes = root / NODES_FILE
    if nodes.exists():
        subprocess.run(["ip", "link", "del", json.loads(nodes.read_text())["bridge"]], capture_output=True)
        nodes.unlink()
