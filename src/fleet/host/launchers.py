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
import signal
import stat
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

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


RELAY_LIMIT = 16 << 20  # of a weight cache daemon's log copied into the attempt's log


def process_alive(pid: int, ticks: object = None) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return st[0] not in "ZX" and (ticks is None or st[19] == str(ticks))


def ready_ranks(directory: str) -> int:
    # The daemon's ranks that wrote their .ready file ("pid=N" first, after binding the socket:
    # weight_cache/daemon.py serve) and still run.
    count = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if name.endswith(".ready"):
            try:
                with open(os.path.join(directory, name)) as f:
                    first = f.readline(64).strip()
            except OSError:
                continue
            pid = first[4:] if first.startswith("pid=") else ""
            count += pid.isdigit() and process_alive(int(pid))
    return count


def relay(log: object, offset: int, budget: int) -> int:
    # New bytes of the daemon's log (a regular file only: never a FIFO, a device or a link) to this
    # attempt's log, at most `budget` in all; the new offset.
    if not isinstance(log, str) or budget <= 0:
        return offset
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return offset
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return offset
        os.lseek(fd, offset, 0)
        chunk = os.read(fd, min(1 << 20, budget))
    finally:
        os.close(fd)
    if chunk:
        os.write(1, chunk)
    return offset + len(chunk)


def await_weight_cache(spec: Dict[str, object]) -> Optional[str]:
    # Until every rank of the deployment's weight cache daemon is ready, copying a daemon started for this
    # attempt's new lines into the attempt's log; None then, else why the engine is not started (the
    # daemon ended, or never got ready).
    directory, ranks = str(spec["dir"]), int(str(spec["ranks"]))
    pid, ticks, exit_file = int(str(spec["pid"])), spec.get("start_ticks"), str(spec["exit_file"])
    deadline = time.monotonic() + float(str(spec["timeout_s"]))
    offset = 0
    while True:
        offset = relay(spec.get("log"), offset, RELAY_LIMIT - offset)
        if ready_ranks(directory) >= max(1, ranks):
            return None
        if not process_alive(pid, ticks) or os.path.exists(exit_file):
            relay(spec.get("log"), offset, RELAY_LIMIT - offset)  # its last words
            return "the weight cache daemon (pid %d) ended before it was ready: see %s" % (pid, spec.get("log"))
        if time.monotonic() > deadline:
            return "the weight cache daemon was not ready within %s s" % spec["timeout_s"]
        time.sleep(0.2)


def process_main(args: List[str]) -> None:
    # args: [-c, fleet-launch, EXIT_FILE, ENGINE ARGV...]; the environment is stdin's first line.
    env = json.loads(sys.stdin.readline())
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    exit_file = args[2]
    argv = secret_argv(args[3:], env)
    wait = env.pop("FLEET_WEIGHT_CACHE_WAIT", None)  # host/weight_cache.py wait_spec
    try:
        not_ready = await_weight_cache(json.loads(wait)) if wait and argv is not None else None
    except (ValueError, TypeError, KeyError, OSError) as exc:  # never an engine without the daemon it needs
        not_ready = "the weight cache daemon could not be waited for (%s)" % exc
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
