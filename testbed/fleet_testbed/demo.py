"""`make demo`: the whole story on the local simulated fleet, with the real `fleet` command.

Brings up `blackwell` (8x RTX PRO 6000, SM120, SGLang 0.5.11) and `ct129` (2x RTX A6000) behind real
sshd on loopback, deploys the hand-written Qwen3.5-397B-NVFP4 command (two known crashes, fixed and
learned), deploys again (the running server is checked, not restarted), stops it and deploys once more
(one attempt, learned fixes), deploys fleet's own plan on the whole box, deploys Qwen3.6-27B, shares the
blackwell box between two deployments on their own GPUs (an overlapping third is refused), shows status,
stops all, and tears the fleet down (`--keep` leaves it up for you to try commands; `python -m fleet_testbed down`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from fleet_testbed import simhost
from fleet_testbed.__main__ import DEFAULT_ROOT

REPO = Path(__file__).resolve().parents[2]


def fleet(*args: str, env: dict[str, str], check: bool = True) -> int:
    print(f"\n$ fleet {shlex.join(args)}", flush=True)
    started = time.perf_counter()
    code = subprocess.run([str(Path(sys.executable).parent / "fleet"), *args], env=env, cwd=REPO).returncode
    print(f"[{time.perf_counter() - started:.2f} s, exit {code}]", flush=True)
    if check and code != 0:
        raise SystemExit(f"demo: `fleet {shlex.join(args)}` exited {code}")
    return code


def loopback_specs(net: int) -> list[simhost.HostSpec]:
    """blackwell and ct129 on 127.0.NET.2 and .3: beside another sandbox, addresses of their own."""
    return [
        replace(s, address=f"127.0.{net}.{s.address.rsplit('.', 1)[1]}") for s in (simhost.BLACKWELL, simhost.CT129)
    ]


def environment(sb: simhost.Sandbox, root: Path) -> dict[str, str]:
    """fleet's environment for a simulated fleet brought up under `root`."""
    return {
        **os.environ,
        **sb.env(),
        "FLEET_INVENTORY": str(sb.inventory),  # inventory/sandbox.yaml's content, for this root and port
        "FLEET_PLAYBOOKS": str(REPO / "playbooks"),
        "XDG_CACHE_HOME": str(root / "cache"),  # its own pool, never a pool of yours
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.demo")
    ap.add_argument("--keep", action="store_true", help="leave the simulated fleet running")
    # Beside another sandbox (or a second demo): its own directory, sshd port and loopback addresses, so
    # neither its sshd nor its engines' ports meet the other's.
    ap.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="its directory [env FLEET_SANDBOX]")
    ap.add_argument("--port", type=int, default=2222, help="the simulated hosts' sshd port")
    ap.add_argument("--net", type=int, default=0, choices=range(0, 256), metavar="N",
                    help="hosts on 127.0.N.2 and 127.0.N.3 (default 0)")  # fmt: skip
    a = ap.parse_args()
    os.environ.setdefault("SIM_SPEED", "1.0")
    specs = loopback_specs(a.net)
    print(
        f"Bringing up the simulated fleet (real sshd on {specs[0].address} and {specs[1].address}, port {a.port}) ...",
        flush=True,
    )
    sb = simhost.up(a.root, specs, a.port)
    env = environment(sb, a.root)
    try:
        for spec in sb.specs:
            simhost.reset_host(sb, spec)
        fleet("facts", "--host", "blackwell", env=env)
        print("\n# The command an engineer typed by hand. fleet's rules already know it will crash:")
        fleet("plan", "qwen35-nvfp4-handwritten", "--host", "blackwell", env=env)
        print("\n# Launch it as written (skipping the engine's own pre-flight check, to watch the crashes happen):")
        fleet("deploy", "qwen35-nvfp4-handwritten", "--host", "blackwell", "--no-engine-check", env=env)
        print("\n# Deploy again: the server already runs this plan, so it is checked, not restarted.")
        fleet("deploy", "qwen35-nvfp4-handwritten", "--host", "blackwell", env=env)
        print("\n# Stop it and deploy once more: the fixes were learned for this host x model x engine version.")
        fleet("stop", "--host", "blackwell", env=env)
        fleet("deploy", "qwen35-nvfp4-handwritten", "--host", "blackwell", env=env)
        print("\n# fleet's own plan for the same model takes the box's free GPUs: TP 8, one group for a MoE model")
        print("# (the hand-written one holds them: --replace stops it first); then Qwen3.6-27B on the A6000 box:")
        fleet("deploy", "qwen35-nvfp4", "--host", "blackwell", env=env, check=False)
        fleet("deploy", "qwen35-nvfp4", "--host", "blackwell", "--replace", env=env)
        fleet("deploy", "qwen36-27b", "--host", "ct129", env=env)
        print("\n# One box, two deployments: the big model on the four GPUs it needs (--gpus 4; gpus: fit in a")
        print("# playbook), the small one on the four left, each with its own ports, state and lock. A third on")
        print("# GPUs the first holds is refused; restarting one leaves the other serving:")
        fleet("deploy", "qwen35-nvfp4", "--host", "blackwell", "--gpus", "4", env=env)
        fleet("deploy", "qwen36-27b", "--host", "blackwell", env=env)
        fleet("deploy", "qwen36-27b", "--host", "blackwell", "--gpus", "2,3", "--name", "third", env=env, check=False)
        fleet("restart", "--host", "blackwell/qwen36-27b", env=env)
        fleet("facts", "--host", "blackwell", env=env)
        print("\n# Pre-flight refuses what cannot work, before touching the host:")
        fleet("plan", "qwen35-nvfp4", "--host", "ct129", env=env, check=False)
        fleet("status", env=env)
        fleet("logs", "--host", "ct129", "-n", "3", env=env)
        print("\n# cron's view: every host checked, a real prompt included. Then the same with the connections")
        print("# and a pre-imported fleet process kept between runs:")
        fleet("health", env=env)
        fleet("pool", "start", env=env)
        fleet("health", env=env)
        fleet("health", env=env)
        fleet("pool", "status", env=env)
        fleet("pool", "stop", env=env)
        fleet("stop", "--all", env=env)
    finally:
        if not a.keep:
            stop_pool = [str(Path(sys.executable).parent / "fleet"), "pool", "stop"]
            subprocess.run(stop_pool, env=env, capture_output=True, check=False)
            simhost.down(a.root)
            print("\nsimulated fleet down")
        else:
            print("\nThe simulated fleet is still up. Try, for example:")
            for k, v in sb.env().items():
                print(f"  export {k}={v}")
            print(f"  export FLEET_INVENTORY={sb.inventory} PYTHONPATH={REPO}/testbed")
            print("  .venv/bin/fleet status")
            print(f"and `PYTHONPATH=testbed .venv/bin/python -m fleet_testbed down --root {a.root}` when done.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
