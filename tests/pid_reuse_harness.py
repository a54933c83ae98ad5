"""Run by tests/test_pid_reuse.py as pid 1 of a fresh pid namespace (`unshare --pid --fork --mount-proc`):
the kernel really hands an engine's pid to another user's process during fleet's drain window, and
fleet's own stop (fleet.host.free.stop_targets) runs through it. Prints one JSON line of what happened.

Inside the namespace only this harness forks, so setting ns_last_pid makes the newcomer's pid the
engine's exactly; no timing decides the order: the second engine holds the drain open until the
newcomer is running.

argv: MODE FLAG WHO, MODE "pidfd" (the kernel's pidfds) or "start-time" (the fallback for kernels without);
WHO "other-user" (the newcomer is nobody's) or "own-group" (fleet's user's, leading a new process group
with a child in it: the engine's group id names that group now, and the SIGKILL's look at the stopped
group as it is must find neither), or "own-group-leaderless" (the same, its leader gone once its child
runs: a group with no leader is no proof of being the one fleet read).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import fleet.host.signals
from fleet.host.free import stop_targets
from fleet.host.procs import process_table, uid_of

NOBODY = 65534
QUITS_AT_SIGTERM = "import time; print('up', flush=True); time.sleep(600)"
# Leads a group with a child in it, and says the child's pid; waits for it, or (argv[1] "leave") exits.
LEADS_A_GROUP = (
    "import subprocess, sys; c = subprocess.Popen(['sleep', '600']); print(c.pid, flush=True)\n"
    "if sys.argv[1:] != ['leave']: c.wait()\n"
)
# Ignores SIGTERM until the newcomer runs (the flag file), then exits: the drain is open meanwhile.
HOLDS_THE_DRAIN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: None)\n"
    "print('up', flush=True)\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
)


def started(code: str, *args: str) -> subprocess.Popen[bytes]:
    child = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
    )
    assert child.stdout is not None and child.stdout.readline() == b"up\n"
    return child


def main() -> None:
    mode, flag, who = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "start-time":
        fleet.host.signals._pidfd_open = lambda pid: None  # type: ignore[assignment]
    engine = started(QUITS_AT_SIGTERM)
    holder = started(HOLDS_THE_DRAIN, flag)
    newcomer: list[subprocess.Popen[bytes]] = []
    member: list[int] = []  # the newcomer's child, in its group

    def reuse_the_engines_pid() -> None:
        engine.wait()  # exited at fleet's SIGTERM, and reaped: its pid is free
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(engine.pid - 1))
        if who.startswith("own-group"):
            leave = ["leave"] if who == "own-group-leaderless" else []
            leader = subprocess.Popen(
                [sys.executable, "-c", LEADS_A_GROUP, *leave], start_new_session=True, stdout=subprocess.PIPE
            )
            assert leader.stdout is not None
            member.append(int(leader.stdout.readline()))
            if leave:
                leader.wait()  # gone: the group has no leader now, only the child
            newcomer.append(leader)
        else:
            newcomer.append(subprocess.Popen(["sleep", "600"], user=NOBODY, stdin=subprocess.DEVNULL))
        open(flag, "w").close()

    reuser = threading.Thread(target=reuse_the_engines_pid)
    reuser.start()
    procs = process_table()
    targets = {p.pid: dict(procs[p.pid], why="stale engine") for p in (engine, holder)}
    stopped, forced, left = stop_targets(targets, procs, drain_s=60)
    reuser.join()
    other = newcomer[0]
    owner = uid_of(other.pid)
    member_alive = bool(member) and (process_table().get(member[0]) or {}).get("state") not in (None, "Z")
    # Ended here with SIGTERM: its exit says which signal reached it first, fleet's SIGKILL or this one.
    other.terminate()
    ended_by = -other.wait()
    holder.wait()
    print(
        json.dumps(
            {
                "engine_pid": engine.pid,
                "newcomer_pid": other.pid,
                "newcomer_uid": owner,
                "member_alive": member_alive,
                "newcomer_ended_by": ended_by,
                "stops": {str(s["pid"]): s["stop"] for s in stopped},
                "forced": forced,
                "left": left,
            }
        )
    )


if __name__ == "__main__":
    main()
