"""Runs ON the host (sent as `python -c`): lock (remote_lock.py), engine pre-flight check, stop stale
servers, free the deployment's GPUs (remote_free.py; both sent before this file), launch detached,
record state -- one round trip. Prints one JSON document.

Stand-alone on purpose (standard library only, plus `pynvml` when the engine environment has it).
Safety rules it enforces itself, whatever the caller says:
  - it never signals pid 1, its own process group, sshd, a GPU daemon or tool (nvidia-persistenced, DCGM,
    a display server, an nvidia-smi query: they hold the device files, not the GPU's memory, and are
    left running, reported), or a process group holding non-engine processes (but fleet's own server's,
    the group its record names);
  - other foreign GPU holders (other users' processes, non-engine processes) are refused unless the
    kill policy is "force", and refused holders are reported before anything is stopped.
Secrets arrive on stdin as JSON and reach the engine through its launcher's stdin: never a file or argv.
"""

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

try:  # the shared host code is prepended when this script is sent to a host
    classify  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.control.remote_container import (
        CONTAINER_LAUNCHER,
        container_of,
        fleet_containers,
        inspect,
        recorded_cli,
        run_cli,
        stop_containers,
        stop_foreign_containers,
    )
    from fleet.control.remote_free import (
        all_gpu_indices,
        classify,
        expand,
        is_engine,
        nvml_pids_and_memory,
        recorded_group_is_ours,
        stop_targets,
        wait_memory_released,
    )
    from fleet.control.remote_lock import (
        forget,
        record_replaced,
        sibling_groups,
        take_lock,
        wait_for_steps_of_this_run,
    )
    from fleet.host_common import (
        LAUNCH_MARK,
        LEARNED_FILE,
        SECRET_ARGV,
        STATE_FILE,
        container_owner,
        deployment_dir,
        mark_unverified,
        read_record,
        release_lock,
        write_record,
    )
    from fleet.host_procs import boot_id, process_table, start_ticks
    from fleet.host_signals import hold_process
    from fleet.protocol import STOPPED, UNVERIFIED, ActResult, CheckResult, Launched

# fleet's launcher: runs the engine with the environment it reads from stdin (playbook env and secrets:
# never in a file or a command line), waits, stops what the engine left in its process group (workers, a
# resource tracker: they would keep GPU memory, and without its leader fleet cannot prove the group is its
# own), and records the exit status atomically: "exited" means nothing of the server runs. It is a Python of
# its own environment, so nothing the playbook sets (PATH, LD_PRELOAD, ...) changes how it runs.
LAUNCHER = (
    "import json, os, signal, subprocess, sys, time\n"
    + SECRET_ARGV
    + """
env = json.loads(sys.stdin.readline())
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
exit_file = sys.argv[2]
argv = secret_argv(sys.argv[3:], env)  # the secret's value (from stdin) in the engine's argv alone
try:
    code = 127 if argv is None else subprocess.call(argv, env=env, stdin=subprocess.DEVNULL)
except OSError as exc:
    sys.stderr.write("fleet launcher: cannot run %s: %s\\n" % (sys.argv[3], exc))
    code = 127
code = 128 - code if code < 0 else code
uid = os.getuid()
def rest(mine=True):
    # this group's members of fleet's user, as (pid, start ticks): another user's process that joined the
    # group is never signalled (a killpg as root would reach it); mine=False lists those
    me, out = os.getpid(), []
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
def send(pid, ticks, sig):
    # pinned to the process seen: a pidfd where Python has one, else its start time checked just before
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
if os.getpgid(0) == os.getpid() and rest():
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a stop meanwhile must not end this first
        signal.signal(sig, signal.SIG_IGN)
    left = rest()
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        for pid, ticks in rest():  # the group as it is now: children forked since included
            send(pid, ticks, sig)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            time.sleep(0.02)
            left = rest()
        if not left:
            break
    if left:
        sys.stderr.write("fleet launcher: still running after SIGKILL (uninterruptible?): pids %s\\n" % [p for p, _ in left])
    others = rest(mine=False)
    if others:
        sys.stderr.write("fleet launcher: left running, another user's: pids %s\\n" % [p for p, _ in others])
with open(exit_file + ".tmp", "w") as f:
    f.write("%d\\n" % code)
os.replace(exit_file + ".tmp", exit_file)
"""
)


# --- engine pre-flight check ---------------------------------------------------------------------------


def fleet_text(path: str) -> str:
    """A program this step runs under the engine's Python: sent with the step (hostscripts.TEXTS), or read
    beside this file where the step is imported as a module."""
    texts = globals().get("FLEET_TEXTS")
    if texts:
        return str(texts[path])
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), path)) as f:
        return f.read()


CHECKS = {
    # the engine's argument check, then the architecture as its model loader resolves it
    "sglang": fleet_text("control/remote_check_sglang.py"),
    # its argument parser, its parser registries, then its engine configuration (no weights loaded)
    "vllm": fleet_text("control/remote_check_vllm.py"),
}


def client_gone(a: Dict[str, Any]) -> bool:
    """Whether fleet has gone away (its end of stdin closed: Ctrl-C, kill -9, a cut connection). Only
    asked when fleet said it holds stdin open while it waits for this step."""
    if not a.get("client_on_stdin"):
        return False
    try:
        if not select.select([0], [], [], 0)[0]:
            return False
        return os.read(0, 4096) == b""
    except (OSError, ValueError):
        return True


def marked_json(out: str, mark: str, longest: int) -> Dict[str, Any]:
    """The last `MARK {...}` line of the check's output as a JSON object (the engine's own output before it
    cannot stand for it: the last line wins); {} for anything else."""
    marks = re.findall(r"^%s (\{.{0,%d}\})$" % (re.escape(mark), longest), out, re.M)
    try:
        said = json.loads(marks[-1]) if marks else {}
    except (ValueError, RecursionError):
        return {}
    return said if isinstance(said, dict) else {}


def resolved_of(engine: str, out: str) -> Dict[str, str]:
    """The engine check's FLEET-RESOLVED line (remote_check_sglang.py, remote_check_vllm.py): what the
    engine resolved, kept to short strings."""
    said = marked_json(out, "FLEET-RESOLVED", 4000) if engine in CHECKS else {}
    return dict(
        (str(k)[:40], str(v)[:80]) for k, v in list(said.items())[:16] if isinstance(v, (str, int, float, bool))
    )


def picks_of(out: str) -> Dict[str, str]:
    """remote_check_sglang.py's FLEET-PICKS line: what SGLang picked with fleet's keyed flags left out (or
    why it refused that), kept to short strings."""
    said = marked_json(out, "FLEET-PICKS", 2000)
    return dict((str(k)[:40], str(v)[:300]) for k, v in list(said.items())[:8] if isinstance(v, str))


def picks_differ(told: Dict[str, str], expect: Dict[str, List[str]]) -> Dict[str, str]:
    """The engine's picks the plan does not stand on (empty: it stands). An engine that refuses the command
    line without fleet's flags for a setting ("refused: ...") confirms that they are needed."""
    return dict((k, v) for k, v in told.items() if k in expect and v not in expect[k] and not v.startswith("refused"))


def engine_check(c: Dict[str, Any], gone: Callable[[], bool]) -> CheckResult:
    code = CHECKS.get(c["engine"])
    if not code:
        return {"verdict": "could_not_check", "output": "no check for engine %s" % c["engine"]}
    code = c.get("prelude", "") + code  # fleet engine audit, on a machine without the GPU: a stand-in for it
    env = dict(os.environ, **c.get("env", {}))
    asked = (c.get("picks") or {}).get("drop")
    if asked is not None:  # also say what the engine picks by itself for the settings fleet's keyed rules decide
        env["FLEET_PICKS"] = json.dumps({"drop": asked})
    deadline = time.time() + c.get("timeout_s", 180)
    cont = c.get("container")
    argv = [expand(c["python"]), "-c", code] + c["args"]
    if cont:  # the check runs in the same image as the server, with its mounts and environment
        argv = [cont["cli"], "run", "--rm", "--name", cont["name"], "--network", "host"] + cont["options"]
        if asked is not None:
            argv += ["-e", "FLEET_PICKS=" + env["FLEET_PICKS"]]
        argv += ["--entrypoint", c["python"], cont["image"], "-c", code] + c["args"]
    with tempfile.TemporaryFile() as output:  # a file, not a pipe: a long traceback cannot block the check
        try:
            p = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            return {"verdict": "could_not_check", "output": str(exc)}
        while p.poll() is None:
            if gone() or time.time() > deadline:
                p.kill()
                p.wait()
                if cont:  # the client is gone; its container is not
                    run_cli([cont["cli"], "rm", "-f", cont["name"]])
                if time.time() > deadline:
                    return {"verdict": "could_not_check", "output": "the check timed out"}
                return {"verdict": "client_gone", "output": ""}
            time.sleep(0.05)
        output.seek(0)
        out = output.read().decode("utf-8", "replace")[-20000:]
    if p.returncode == 0:
        result = {"verdict": "accepted", "output": out[-2000:], "resolved": resolved_of(c["engine"], out)}  # type: CheckResult
        if asked is not None:
            result["picks"] = picks_of(out)
        return result
    if p.returncode == 2 and "error:" in out:
        return {"verdict": "rejected", "output": out}
    if re.search(r"^(AssertionError|ValueError|NotImplementedError)\b", out, re.M):
        return {"verdict": "rejected", "output": out}
    return {"verdict": "could_not_check", "output": out}


# --- launch --------------------------------------------------------------------------------------------


def unwritable_dir(path: str) -> Optional[Dict[str, Any]]:
    """None if files can be created in `path` (made if missing), else why not: tried, since root passes
    every access check yet cannot write on a read-only mount or into an immutable directory."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        probe = os.path.join(path, ".fleet-write-check-%d" % os.getpid())
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.unlink(probe)
    except OSError as exc:
        return {"path": path, "error": exc.strerror or str(exc)}
    return None


MIN_FREE_INODES = 64  # a launch creates a log, an exit file, temporary records: a handful, with room


def short_of_space(needs: List[List[Any]]) -> Optional[Dict[str, Any]]:
    """The first directory fleet will write with less free space than it needs, or None: checked before
    anything is stopped, so a full disk refuses the deploy instead of leaving the host with no server."""
    for setting, path, need in needs:
        path = expand(path)
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        try:
            st = os.statvfs(probe or "/")
        except OSError:
            continue
        free = st.f_bavail * st.f_frsize
        if st.f_blocks and free < need:  # no blocks at all: /proc and the like, not a disk
            return {"setting": setting, "path": path, "short": "only %d MiB free" % (free >> 20), "need": need}
        if st.f_files and st.f_favail < MIN_FREE_INODES:  # bytes to spare, but no file can be created
            return {"setting": setting, "path": path, "short": "only %d free inodes" % st.f_favail, "need": need}
    return None


def previous_launch(
    previous: Optional[Dict[str, Any]], log_dir: str, secrets: Dict[str, str]
) -> Union[Dict[str, Any], str]:
    """The launch arguments of the server a record describes (to roll back to it), or why there are none:
    without the secrets it ran with it would start, but not as it was."""
    plan = previous.get("plan") if isinstance(previous, dict) else None
    if not isinstance(plan, dict) or not plan.get("argv"):
        return "there was no previous server to relaunch"
    if plan.get("container"):
        return "the previous server ran in a container, which only a deploy starts again"
    missing = sorted(set(plan.get("secret_env") or []) - set(secrets))
    if missing:
        return "the previous server needs secrets this run does not carry (%s)" % ", ".join(missing)
    env = dict((e["name"], e["value"]) for e in plan.get("env") or [] if isinstance(e, dict) and "name" in e)
    name = (previous or {}).get("playbook") or "rollback"
    return {"name": name, "attempt": 0, "argv": plan["argv"], "env": env, "log_dir": log_dir}


def launch_and_record(
    a: Dict[str, Any], secrets: Dict[str, str], state_dir: str, previous: Optional[Dict[str, Any]], out: ActResult
) -> None:
    """Record the new attempt, launch it, record its process. A write that fails here (the disk filled up
    after the check) must not leave the host without a server: the previous one is relaunched."""
    st_path = os.path.join(state_dir, STATE_FILE)
    try:
        if a["state_update"]:
            write_record(st_path, a["state_update"])
        out["launched"] = launch(a["launch"], secrets)
        st = read_record(st_path) or {}
        st.update(
            {
                "pid": out["launched"]["pid"],
                "pgid": out["launched"]["pgid"],
                "log": out["launched"]["log"],
                "exit_file": out["launched"]["exit_file"],
                "started": out["launched"]["started"],
                "start_ticks": out["launched"]["start_ticks"],
                "boot_id": boot_id(),
                "container": out["launched"].get("container"),
            }
        )
        write_record(st_path, st)
    except OSError as exc:
        out["write_failed"] = {"path": exc.filename or state_dir, "error": exc.strerror or str(exc)}
        launched = out.pop("launched", None)
        if launched and launched["pgid"] > 1:  # launched but unrecorded: fleet could not stop it safely later
            try:
                os.killpg(launched["pgid"], signal.SIGKILL)
            except OSError:
                pass
        if not out.get("ended"):
            return
        back = previous_launch(previous, a["launch"]["log_dir"], secrets)
        if isinstance(back, str):
            out["rollback_failed"] = back
            return
        try:
            out["rolled_back"] = launch(back, secrets)
        except OSError as again:
            out["rollback_failed"] = again.strerror or str(again)
            return
        rec = dict(previous or {}, status=UNVERIFIED, reason="relaunched by fleet's rollback, not checked")
        rec.update((k, out["rolled_back"][k]) for k in ("pid", "pgid", "log", "exit_file", "start_ticks"))
        rec["boot_id"] = boot_id()
        try:
            write_record(st_path, rec)
        except OSError:  # no room for a new file: rewrite the old one in place (its blocks are there)
            try:
                with open(st_path, "r+") as f:
                    f.write(json.dumps(rec, sort_keys=True))
                    f.truncate()
            except OSError:
                out["rollback_unrecorded"] = True


def new_log(log_dir: str, name: str, attempt: int) -> Tuple[int, str, str]:
    """(log path, exit file path) of a new attempt, never an earlier one's: two launches within one
    second (a restart right after a failure) once shared a log and the earlier attempt's exit file."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(100):
        base = os.path.join(log_dir, "%s-%s-attempt%d%s" % (name, stamp, attempt, ".%d" % n if n else ""))
        try:
            fd = os.open(base + ".log", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        except FileExistsError:
            continue
        return fd, base + ".log", base + ".exit"
    raise OSError("no free log name in %s" % log_dir)


def link_latest(log_dir: str, name: str, log_path: str) -> None:
    """NAME.latest.log -> the attempt's log (what `fleet logs` and people on the host read)."""
    latest = os.path.join(log_dir, "%s.latest.log" % name)
    try:  # a convenience for people on the host; a full disk or a squatted name must not fail the launch
        if os.path.islink(latest):
            os.unlink(latest)
        os.symlink(os.path.basename(log_path), latest)
    except OSError:
        pass


def launch(a: Dict[str, Any], secrets: Dict[str, str]) -> Launched:
    log_dir = expand(a["log_dir"])
    os.makedirs(log_dir, mode=0o700, exist_ok=True)
    log_fd, log_path, exit_path = new_log(log_dir, a["name"], a["attempt"])
    link_latest(log_dir, a["name"], log_path)
    if a.get("container"):
        os.close(log_fd)
        return launch_container(a, secrets, log_path, exit_path)
    env = dict(os.environ)
    env.update(a["env"])
    env.update(secrets)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, LAUNCH_MARK, exit_path] + [expand(a["argv"][0])] + a["argv"][1:],
            stdin=subprocess.PIPE,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            close_fds=True,
            cwd=log_dir,
        )
    finally:
        os.close(log_fd)
    try:
        assert child.stdin is not None
        child.stdin.write((json.dumps(env) + "\n").encode())
        child.stdin.close()
    except BaseException:  # started but not given its environment: it must not run unrecorded
        os.killpg(child.pid, signal.SIGKILL)
        raise
    return {
        "pid": child.pid,
        "pgid": child.pid,
        "log": log_path,
        "exit_file": exit_path,
        "started": time.time(),
        "start_ticks": start_ticks(child.pid),
        "container": None,
    }


def launch_container(a: Dict[str, Any], secrets: Dict[str, str], log_path: str, exit_path: str) -> Launched:
    """`run -d` the engine in its container through fleet's launcher (its PID 1); the secrets go in a 0600
    file the launcher deletes, never in the options `inspect` shows. A `run` that fails (no GPU runtime,
    a CUDA requirement, a name in use) is written to the attempt's log with its exit code, to be diagnosed
    like a crash."""
    c = a["container"]
    os.makedirs(c["secrets_dir"], mode=0o700, exist_ok=True)
    for old in os.listdir(c["secrets_dir"]):  # left by a step that was killed between writing and deleting
        if old.startswith("env-") and old.endswith(".json"):
            try:
                os.unlink(os.path.join(c["secrets_dir"], old))
            except OSError:
                pass
    secret_name = "env-%s-%d.json" % (a["name"], a["attempt"])
    secret_file = os.path.join(c["secrets_dir"], secret_name)
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(secrets, f)
    launcher = ["-c", CONTAINER_LAUNCHER, LAUNCH_MARK, exit_path, log_path, c["secrets_mount"] + "/" + secret_name]
    argv = [c["cli"], "run", "-d"] + c["options"] + ["--entrypoint", c["python"], c["image"]] + launcher + a["argv"]
    code, out, err = run_cli(argv, 300)
    state = inspect(c["cli"], c["name"]) if code == 0 else None
    pid = int(state["pid"]) if state and state["pid"] else -1
    deadline = time.time() + 10
    while pid > 0 and os.path.exists(secret_file) and time.time() < deadline:  # read by the launcher
        time.sleep(0.05)
    try:
        os.unlink(secret_file)
    except OSError:
        pass
    if code != 0 or pid <= 0:  # never started, or ended at once: what the runtime said is the log
        said = err.strip() if code != 0 else run_cli([c["cli"], "logs", c["name"]])[2].strip()
        run_cli([c["cli"], "rm", "-f", c["name"]])  # created, or half-started by a run that timed out
        with open(log_path, "a") as f:
            f.write("[fleet] %s run: %s\n" % (c["cli"], said or "exited at once"))
        if not os.path.exists(exit_path):
            with open(exit_path, "w") as f:
                f.write("%d\n" % (code if code != 0 else (state or {}).get("exit_code") or 1))
    return {
        "pid": pid,
        "pgid": pid,  # the container's PID 1 leads its own session and group
        "log": log_path,
        "exit_file": exit_path,
        "started": time.time(),
        "start_ticks": start_ticks(pid) if pid > 0 else None,
        "container": {"cli": c["cli"], "name": c["name"], "id": (state or {}).get("id") or out.strip()[:64]},
    }


def recorded_group(st: Dict[str, Any]) -> Optional[int]:
    """The process group a deployment's record names, when it is exactly the one fleet launched (a group
    id is a pid, and pids are reused)."""
    pgid = st.get("pgid")
    return pgid if type(pgid) is int and pgid > 1 and recorded_group_is_ours(pgid, st) else None


def sweep_stopped_groups(stopped_groups: Set[int], siblings: Dict[int, str]) -> None:
    """Engine processes that outlived their parent in a group fleet just stopped (JIT workers): SIGKILLed,
    each held first. Only those groups: never an engine-looking process elsewhere on the host, which may
    be another container's or a tool's (a sweep by name killed a foreign container's server)."""
    me, own = os.getuid(), os.getpgid(0)
    for _sweep in range(3):
        left = [
            hold_process(p["pid"], p["start_ticks"], me)
            for p in process_table().values()
            if p["pgid"] in stopped_groups
            and p["pgid"] not in (own, *siblings)
            and p["uid"] == me
            and p.get("state") != "Z"
            and is_engine(p)
            and not container_of(p["pid"])
        ]
        if not any(left):
            break
        for h in left:
            if h is not None:
                h.send(signal.SIGKILL)
                h.close()
        time.sleep(0.1)


def main() -> ActResult:
    a = json.loads(sys.argv[1])
    # the first line: fleet may hold stdin open after it (client_on_stdin), its end meaning fleet is gone
    secrets = json.loads(sys.stdin.readline() or "{}")
    out: ActResult = {"host": socket.gethostname()}
    if a.get("check_only"):  # an upgrade preview: the engine's own verdict; nothing locked, nothing changed
        out["check"] = engine_check(a["check"], lambda: client_gone(a))
        return out
    if a.get("abandon"):
        wait_for_steps_of_this_run(a["lock"], a["abandon"]["wait_s"])
    lock = take_lock(a["lock"])
    out["lock"] = lock
    if lock["status"] != "taken":  # held by another run, or no state directory to hold it in
        return out
    root = expand(a["lock"]["state_dir"])
    state_dir = deployment_dir(root, a["lock"]["deployment"])
    for path in (os.path.join(state_dir, STATE_FILE), os.path.join(root, LEARNED_FILE)):
        read_record(path)  # a damaged record is set aside before it is written over
    if (
        a["lock"].get("command") == "heal"
        and (read_record(os.path.join(state_dir, STATE_FILE)) or {}).get("status") == STOPPED
    ):  # stopped by an operator after the health check saw it down: a heal must not undo that
        release_lock(state_dir, a["lock"]["run_id"])
        out["stopped_since"] = True
        return out
    if a.get("forget"):  # fleet forget: the records of a deployment that no longer runs, nothing else
        out["forget"] = forget(state_dir, a["lock"]["run_id"])
        return out
    if a.get("release_lock_only"):
        if a.get("abandon"):  # interrupted between steps: a server launched and not yet checked says so
            mark_unverified(state_dir, a["lock"]["run_id"])
        release_lock(state_dir, a["lock"]["run_id"])
        return out

    def gone() -> bool:
        return client_gone(a)

    container = (a.get("launch") or {}).get("container")
    if a.get("check"):
        out["check"] = engine_check(a["check"], gone)
        if out["check"]["verdict"] == "rejected":
            return out
        differ = picks_differ(out["check"].get("picks") or {}, (a["check"].get("picks") or {}).get("expect") or {})
        if differ:  # the plan stood on picks the engine does not make here: fleet plans again, nothing stopped
            release_lock(state_dir, a["lock"]["run_id"])
            out["picks_differ"] = differ
            return out
    if a.get("launch"):
        unwritable = unwritable_dir(expand(a["launch"]["log_dir"]))
        if unwritable:  # found out after stopping the old server, the host would be left with none
            release_lock(state_dir, a["lock"]["run_id"])
            out["log_dir_unwritable"] = unwritable
            return out
        short = short_of_space(a.get("space") or [])
        if short:
            release_lock(state_dir, a["lock"]["run_id"])
            out["short_of_space"] = short
            return out
    previous = read_record(os.path.join(state_dir, STATE_FILE))
    procs = process_table()
    # the group this deployment's record names is fleet's own: the server of an earlier run, or of this
    # run's last attempt (crashed, timed out or answering garbage), whatever it holds or not
    free = dict(a["free"], recorded_pgid=recorded_group(previous or {}))
    every = all_gpu_indices(expand(free["gpu_devices"]))
    siblings, replaced, sibling_gpus = sibling_groups(
        root, a["lock"]["deployment"], a["lock"].get("replace") or [], every
    )
    if free.get("gpus") is None and sibling_gpus and every is not None:  # all GPUs, but the siblings'
        free = dict(free, gpus=[i for i in every if i not in sibling_gpus])
    # a sibling's server is left running: for a launch it is in the way (refused), for a stop it is not
    free["launching"] = bool(a.get("launch"))
    # fleet's containers of this deployment (and those it replaces): stopped by name, not by signal
    replaced_names = list(a["lock"].get("replace") or [])
    clis = [(container or {}).get("cli"), recorded_cli(previous)]
    for other in replaced_names:
        clis.append(recorded_cli(read_record(os.path.join(deployment_dir(root, other), STATE_FILE))))
    named = [str(c) for c in clis if c]
    ours: List[Dict[str, Any]] = []
    refused_containers: List[Dict[str, Any]] = []
    # Asking the runtimes (~70 ms for `podman ps`) is needed only when a record or this launch names one, or
    # some process runs in a container: with neither, no container of fleet's can hold anything.
    if named or any(container_of(pid) for pid in procs):
        owner = container_owner(os.getuid(), root)
        ours, refused_containers = fleet_containers(
            named, [a["lock"]["deployment"]] + replaced_names, container["name"] if container else None, owner
        )
    free = dict(free, siblings=siblings, replaced=sorted(replaced), replaced_names=replaced)
    free["own_containers"] = [c["id"] for c in ours]
    targets, refused, out["left"] = classify(free, procs)
    refused = refused_containers + refused
    out["refused"] = refused
    if refused and a.get("launch"):  # a launch needs the GPUs free; a stop still stops what is fleet's
        return out
    if a.get("prepare_only"):  # a group's first step on each host: locked and checked, nothing stopped yet
        return out
    if gone():  # nobody would watch what happens next: change nothing, free the host
        release_lock(state_dir, a["lock"]["run_id"])
        out["client_gone"] = True
        return out
    gpus = free.get("gpus")
    # the memory waited for is this deployment's: never that of a sibling left running on the same GPUs
    wait_gpus = gpus if gpus is None or not sibling_gpus else [i for i in gpus if i not in sibling_gpus]
    before = nvml_pids_and_memory(wait_gpus)[1]
    stopped_containers = stop_containers(ours, a["free"]["drain_s"]) + stop_foreign_containers(
        targets, a["free"]["drain_s"]
    )
    out["ended"], out["forced"], left_in_groups = stop_targets(targets, procs, a["free"]["drain_s"])
    out["ended"] = stopped_containers + out["ended"]
    out["left"] = out["left"] + left_in_groups
    before, after, waited = wait_memory_released(before, a["free"]["memory_wait_s"], a["free"]["idle_mib"], wait_gpus)
    out["memory"] = {"before_mib": before, "after_mib": after, "waited_s": waited}
    record_replaced(root, replaced, a["lock"]["deployment"])
    sweep_stopped_groups(set(t["pgid"] for t in targets.values()), siblings)
    if a.get("launch"):
        launch_and_record(a, secrets, state_dir, previous, out)
        if "write_failed" in out:
            release_lock(state_dir, a["lock"]["run_id"])
            return out
        if gone():  # gone after the stop: the launch stands, recorded as never checked
            mark_unverified(state_dir, a["lock"]["run_id"])
            release_lock(state_dir, a["lock"]["run_id"])
            out["client_gone"] = True
            return out
    elif a.get("state_update") is not None:  # a status change (failed, stopped) keeps what the record knew
        st_path = os.path.join(state_dir, STATE_FILE)
        st = read_record(st_path) or {}
        st.update(a["state_update"])
        write_record(st_path, st)
    if a.get("release_lock"):
        release_lock(state_dir, a["lock"]["run_id"])
    return out


if __name__ == "__main__":
    try:
        result = main()
    except Exception as exc:
        import traceback

        result = {"error": "%s: %s" % (type(exc).__name__, exc), "traceback": traceback.format_exc()[-3000:]}
    sys.stdout.write(json.dumps(result))
