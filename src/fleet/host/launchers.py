# (Comments, not docstrings, here: this file is sent with every act step, and comment lines are not.)
#
# fleet's launchers: the programs that start an engine on a host, each run as `python -c SOURCE fleet-launch
# EXIT_FILE ...` (the mark is how fleet knows its own launcher in a process table: host_common.LAUNCH_MARK).
#
# - `process_main`: a server as a process. Its environment (the playbook's and the secrets) arrives on
#   stdin, never in a file or a command line. It runs under a Python of its own environment, so nothing the
#   playbook sets (PATH, LD_PRELOAD) changes how it runs. Once the engine exits, it stops what the engine
#   left in its process group (workers, a resource tracker: they would keep GPU memory, and without its
#   leader fleet could not prove the group its own), each member held by a pidfd, never another user's.
# - `container_main`: a container's PID 1. It sends the engine's output to fleet's log (a file on the host
#   through the mounted log directory) and reads its secrets from a 0600 file it deletes at once. It passes
#   signals on: `stop -t` sends SIGTERM to PID 1, which the kernel does not act on by default.
#
# Both put a secret's value in the engine's argv only after --api-key and start nothing without it. Both
# write the engine's exit status to EXIT_FILE atomically: once it is there, nothing of the server runs.
# Standard library only, Python 3.8: sent as text with the act step (fleet.hostscripts.TEXTS) and started
# by fleet.host.launch.launcher_source with SECRET_WORD defined first and the mode's call last.

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Set, Tuple

try:  # launcher_source defines it before this text
    SECRET_WORD  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.words import SECRET_WORD


def secret_argv(words: Sequence[str], env: Dict[str, str]) -> Optional[List[str]]:
    # The engine's argv with the secret's value in place of SECRET_WORD + NAME where it follows --api-key,
    # and only there (no other word of a playbook is a secret's place); None when the secret is missing:
    # an engine started with the word, or with no key, would serve without the key the playbook asked for.
    out = []
    for i, word in enumerate(words):
        if i and words[i - 1] == "--api-key" and word.startswith(SECRET_WORD):
            name = word[len(SECRET_WORD) :]
            if not env.get(name):
                sys.stderr.write("fleet launcher: the secret %s was not given: no engine without it\n" % name)
                return None
            word = env[name]
        out.append(word)
    return out


def write_exit(exit_file: str, code: int) -> None:
    with open(exit_file + ".tmp", "w") as f:
        f.write("%d\n" % code)
    os.replace(exit_file + ".tmp", exit_file)


def group_members(mine: bool = True) -> List[Tuple[int, str]]:
    # This launcher's process group, as (pid, start ticks), of fleet's user (`mine`) or of others: a
    # process of another user that joined the group is never signalled (a killpg as root would reach it).
    me, uid, out = os.getpid(), os.getuid(), []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != me:
            try:
                with open("/proc/" + d + "/stat") as f:
                    st = f.read().rsplit(")", 1)[1].split()
                with open("/proc/" + d + "/status") as f:  # its real uid (/proc/PID is root's if non-dumpable)
                    owner = int([x for x in f if x.startswith("Uid:")][0].split()[1])
            except (OSError, IndexError):
                continue
            if int(st[2]) == me and st[0] not in "ZX" and (owner == uid) == mine:
                out.append((int(d), st[19]))
    return out


def send(pid: int, ticks: str, sig: int) -> None:
    # Signal the process seen, not its pid's next owner: held by a pidfd where Python has one, else its
    # start time checked just before.
    try:
        if hasattr(os, "pidfd_open"):
            fd = os.pidfd_open(pid)
            try:
                with open("/proc/%d/stat" % pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[19] == ticks:
                        signal.pidfd_send_signal(fd, sig)
            finally:
                os.close(fd)
        else:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[19] == ticks:
                    os.kill(pid, sig)
    except (OSError, IndexError):
        pass


def stop_what_the_engine_left() -> None:
    # The rest of this launcher's group, stopped (SIGTERM, then SIGKILL), before the exit is written.
    if os.getpgid(0) != os.getpid() or not group_members():
        return
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a stop meanwhile must not end this first
        signal.signal(sig, signal.SIG_IGN)
    left = group_members()
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        for pid, ticks in group_members():  # the group as it is now: children forked since included
            send(pid, ticks, sig)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = group_members()
        if not left:
            break
    if left:
        sys.stderr.write(
            "fleet launcher: still running after SIGKILL (uninterruptible?): pids %s\n" % [p for p, _ in left]
        )
    others = group_members(mine=False)
    if others:
        sys.stderr.write("fleet launcher: left running, another user's: pids %s\n" % [p for p, _ in others])


LISTENING = re.compile(rb"\[WeightCacheDaemon gpu=(\d+)\] Listening on ")
RELAY_LIMIT = 16 << 20  # of a weight cache daemon's log copied into the attempt's log


def process_alive(pid: int, ticks: object) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return st[0] not in "ZX" and (ticks is None or st[19] == str(ticks))


def await_weight_cache(spec: Dict[str, object]) -> Optional[str]:
    # Until every rank of the deployment's weight cache daemon listens (each logs "[WeightCacheDaemon gpu=G]
    # Listening on SOCKET" once its weights are loaded and its .ready file written: weight_cache/daemon.py
    # serve), copying the daemon's new lines into this attempt's log; None then, else why the engine is not
    # started (the daemon ended, or never got ready).
    log, ranks = str(spec["log"]), int(str(spec["ranks"]))
    relay_from, deadline = int(str(spec["relay_from"])), time.monotonic() + float(str(spec["timeout_s"]))
    listening: Set[bytes] = set()
    offset, tail, relayed = 0, b"", 0
    while True:
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                chunk = f.read(1 << 20)
        except OSError:
            chunk = b""
        if relayed < RELAY_LIMIT and offset + len(chunk) > relay_from:
            shown = chunk[max(0, relay_from - offset) :][: RELAY_LIMIT - relayed]
            os.write(1, shown)
            relayed += len(shown)
        offset += len(chunk)
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()[-65536:]
        listening.update(m.group(1) for m in (LISTENING.search(x) for x in lines) if m)
        if len(listening) >= ranks:
            return None
        if chunk:
            continue
        if not process_alive(int(str(spec["pid"])), spec.get("start_ticks")) or os.path.exists(str(spec["exit_file"])):
            return "the weight cache daemon (pid %s) ended before it was ready: see %s" % (spec["pid"], log)
        if time.monotonic() > deadline:
            return "the weight cache daemon was not ready within %s s: see %s" % (spec["timeout_s"], log)
        time.sleep(0.2)


def process_main(args: List[str]) -> None:
    # args: [-c, fleet-launch, EXIT_FILE, ENGINE ARGV...]; the environment is stdin's first line.
    env = json.loads(sys.stdin.readline())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    exit_file = args[2]
    argv = secret_argv(args[3:], env)
    wait = env.pop("FLEET_WEIGHT_CACHE_WAIT", None)  # host/weight_cache.py wait_spec
    not_ready = await_weight_cache(json.loads(wait)) if wait and argv is not None else None
    if not_ready:
        sys.stderr.write("fleet launcher: %s\n" % not_ready)
        sys.stderr.flush()
    try:
        if not_ready:
            code = 1
        else:
            code = 127 if argv is None else subprocess.call(argv, env=env, stdin=subprocess.DEVNULL)
    except OSError as exc:
        sys.stderr.write("fleet launcher: cannot run %s: %s\n" % (args[3], exc))
        code = 127
    code = 128 - code if code < 0 else code
    stop_what_the_engine_left()
    write_exit(exit_file, code)


def container_main(args: List[str]) -> None:
    # args: [-c, fleet-launch, EXIT_FILE, LOG, SECRETS_FILE, ENGINE ARGV...].
    exit_file, log, secret_file = args[2:5]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    env = dict(os.environ)
    try:
        with open(secret_file) as f:
            env.update(json.load(f))
        os.unlink(secret_file)
    except (OSError, ValueError) as exc:
        sys.stderr.write(
            "fleet launcher: the secrets file %s could not be read (%s): starting without them\n" % (secret_file, exc)
        )
    argv = secret_argv(args[5:], env)
    try:
        if argv is None:
            raise OSError("a secret it needs was not given")
        child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
    except OSError as exc:
        sys.stderr.write("fleet launcher: cannot run %s: %s\n" % (args[5], exc))
        code = 127
    else:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, frame: child.send_signal(signum))
        code = child.wait()
    code = 128 - code if code < 0 else code
    write_exit(exit_file, code)
    sys.exit(code)
