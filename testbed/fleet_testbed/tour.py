"""`make tour`: the wider features on the simulated fleet, with the real `fleet` command, each in a few
commands: a deployment in a podman container, a service's rolling restart behind the real SGLang router,
one model over two hosts (hosts with network namespaces of their own: fleet_testbed.nodes), and a model
pulled from a local stand-in for the Hugging Face Hub (fleet_testbed.fakehub).

    python -m fleet_testbed.tour [container] [service] [group] [pull] [--root DIR] [--port P] [--net N] [--keep]

Each part brings up what it needs under --root and takes it down after (`--keep` leaves it up and says
how to reach it). The container part needs podman as root, and builds the simulated engine's image once
(a Debian rootfs by debootstrap, a few minutes; cached in .cache/images).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fleet_testbed import demo, nodes, simhost
from fleet_testbed.demo import REPO, fleet, loopback_specs
from fleet_testbed.nodes import TWO_NODES


def sandbox(root: Path, port: int, net: int) -> tuple[simhost.Sandbox, dict[str, str]]:
    """blackwell and ct129 behind real sshd on 127.0.NET.2/3, and fleet's environment pointing at them."""
    sb = simhost.up(root, loopback_specs(net), port)
    for spec in sb.specs:
        simhost.reset_host(sb, spec)
    return sb, environment(sb, root)


def environment(sb: simhost.Sandbox, root: Path) -> dict[str, str]:
    return {**demo.environment(sb, root), "FLEET_SERVICES": str(root / "services")}  # none but a part's own


def container(root: Path, port: int, net: int) -> None:
    """The motivating model in a podman container on blackwell: deploy, status, logs, stop."""
    if shutil.which("podman") is None or os.geteuid() != 0:
        raise SystemExit("tour container: needs podman, as root (`make system-deps` installs it on Debian)")
    from fleet_testbed import images

    print("\n# Building (once) the image of the simulated SGLang 0.5.11 ...", flush=True)
    image = images.sim_sglang("0.5.11")
    sb, env = sandbox(root, port, net)
    hdir = sb.host_dir("blackwell")
    for dev in sorted((hdir / "dev").glob("nvidia*")):  # character devices, as the driver's are
        dev.unlink()
        os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
    playbooks = root / "playbooks"
    playbooks.mkdir(exist_ok=True)
    (playbooks / "qwen35-box.yaml").write_text(images.container_playbook(hdir, image))
    env["FLEET_PLAYBOOKS"] = str(playbooks)
    print(f"\n# playbooks/qwen35-nvfp4.yaml with a runtime: section, in {playbooks / 'qwen35-box.yaml'}:")
    print("#   runtime: {container: podman, image: " + image + ", run_args: [...]}")
    fleet("deploy", "qwen35-box", "--host", "blackwell", env=env)
    fleet("status", env=env)
    fleet("logs", "-H", "blackwell/qwen35-box", "-n", "3", env=env)
    fleet("stop", "--host", "blackwell/qwen35-box", env=env)


def container_down(root: Path) -> None:
    subprocess.run(["podman", "rm", "-f", "-t", "0", "fleet-qwen35-box"], capture_output=True, check=False)
    simhost.down(root)


def service(root: Path, port: int, net: int) -> None:
    """services/qwen36.yaml: two replicas behind the real SGLang router; a rolling restart; down."""
    _, env = sandbox(root, port, net)
    env["FLEET_SERVICES"] = str(REPO / "services")
    print("\n# services/qwen36.yaml: a replica on ct129, one on blackwell's GPUs 6 and 7, the router on ct129")
    fleet("up", "qwen36", env=env)
    fleet("status", env=env)
    print("\n# Restart it replica by replica: each leaves the router, restarts, is proven, and comes back")
    fleet("restart", "qwen36", env=env)
    fleet("down", "qwen36", env=env)


def group(root: Path, port: int, net: int) -> None:
    """One model over two hosts, each its own machine on a bridge: deploy, status, logs, stop."""
    sb = nodes.up(root, port=port)
    env = environment(sb, root)
    playbooks = root / "playbooks"
    playbooks.mkdir(exist_ok=True)
    (playbooks / "two-nodes.yaml").write_text(TWO_NODES)
    env["FLEET_PLAYBOOKS"] = str(playbooks)
    addresses = ", ".join(f"{s.name} {s.address}" for s in sb.specs)
    print(f"\n# Two 2-GPU hosts with networks and host names of their own ({addresses}); the playbook:")
    print("\n".join(f"#   {line}" for line in TWO_NODES.splitlines()))
    fleet("deploy", "two-nodes", env=env)
    fleet("status", env=env)
    fleet("logs", "-H", "node-a/two-nodes", "-H", "node-b/two-nodes", "-n", "2", env=env)
    fleet("stop", "two-nodes", env=env)


def pull(root: Path, port: int, net: int) -> None:
    """A model pulled onto ct129 from a local stand-in for the Hugging Face Hub, then deployed."""
    from fleet_testbed.fakehub import FakeHub, Repo, make_model

    _, env = sandbox(root, port, net)
    model = root / "ct129" / "models" / "Qwen3.6-27B"
    source = make_model(root / "hub" / "Qwen3.6-27B", config=model / "config.json")  # small weights, real config
    shutil.rmtree(model)
    hub = FakeHub()
    hub.add("Qwen/Qwen3.6-27B", Repo(source))
    env["HF_ENDPOINT"] = hub.url  # as for a mirror: `python -m fleet_testbed.fakehub REPO=DIR` serves one by hand
    print(
        f"\n# ct129 has no Qwen3.6-27B; the Hub's stand-in at {hub.url} has Qwen/Qwen3.6-27B (hf_repo: in the playbook)"
    )
    try:
        fleet("pull", "qwen36-27b", "--host", "ct129", env=env)
        fleet("deploy", "qwen36-27b", "--host", "ct129", env=env)
        fleet("stop", "--host", "ct129/qwen36-27b", env=env)
    finally:
        hub.close()


# each part, and what takes its hosts down again (run when it ends, however it ends)
PARTS: dict[str, tuple[Callable[[Path, int, int], None], Callable[[Path], None]]] = {
    "container": (container, container_down),
    "service": (service, simhost.down),
    "group": (group, nodes.down),
    "pull": (pull, simhost.down),
}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.tour")
    ap.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)} (default: all)")
    ap.add_argument("--root", type=Path, default=Path(os.environ.get("FLEET_TOUR", "/tmp/fleet-tour")))
    ap.add_argument("--port", type=int, default=2244, help="the simulated hosts' sshd port")
    ap.add_argument("--net", type=int, default=9, choices=range(0, 256), metavar="N",
                    help="the loopback hosts on 127.0.N.2 and 127.0.N.3 (default 9)")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="leave the last part's hosts up")
    a = ap.parse_args()
    unknown = [p for p in a.parts if p not in PARTS]
    if unknown:
        ap.error(f"no part named {', '.join(unknown)}: the parts are {', '.join(PARTS)}")
    os.environ.setdefault("SIM_SPEED", "0.2")
    chosen = a.parts or list(PARTS)
    for i, part in enumerate(chosen):
        show, take_down = PARTS[part]
        print(f"\n=== {part}: {show.__doc__}", flush=True)
        root = a.root / part
        try:
            show(root, a.port, a.net)
        finally:
            if a.keep and i == len(chosen) - 1:
                print(f"\n{part}'s hosts are still up. Try, for example:")
                print(f"  export FLEET_INVENTORY={root / 'inventory.yaml'} FLEET_KNOWN_HOSTS={root / 'known_hosts'}")
                print(f"  export FLEET_SSH_CONFIG={root / 'ssh_config'} FLEET_PLAYBOOKS={root / 'playbooks'}")
                print("  .venv/bin/fleet status")
            else:
                take_down(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
