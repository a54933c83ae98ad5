"""On the host, in the act step: a server launched under fleet's launcher (or in its container), recorded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

try:  # the shared host code is prepended when this script is sent to a host
    read_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.check import program_text
    from fleet.host.common import LAUNCH_MARK
    from fleet.host.container import inspect, made_container, run_cli
    from fleet.host.free import (
        expand,
    )
    from fleet.host.procs import boot_id, start_ticks
    from fleet.host.records import STATE_FILE, read_record, write_record
    from fleet.host.weight_cache import (
        WAIT_ENV,
        cache_dir,
        clear_dir,
        daemon_entry,
        daemon_secrets,
        running_daemon,
        template_env,
        wait_spec,
    )
    from fleet.host.words import SECRET_WORD, UNVERIFIED
    from fleet.protocol import ActRequest, ActResult, Launched, LaunchRequest, WeightCacheEntry


def launcher_source(mode: str) -> str:
    """The source of one of fleet's launchers (fleet/launchers.py, sent as text: it runs under a Python of
    its own environment), started in `mode`: "process" or "container"."""
    return "SECRET_WORD = %r\n%s%s_main(sys.argv)\n" % (  # sys: the launcher's own import
        SECRET_WORD,
        program_text("host/launchers.py"),
        mode,
    )


# A daemon's logs are NAME~weight-cache-*: `~` is in no deployment's name, so none shares them or its link
DAEMON_LOG_SUFFIX = "~weight-cache"
LAUNCHER = launcher_source("process")
CONTAINER_LAUNCHER = launcher_source("container")


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
) -> Union[LaunchRequest, str]:
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
    a: ActRequest, secrets: Dict[str, str], state_dir: str, previous: Optional[Dict[str, Any]], out: ActResult
) -> None:
    """Record the new attempt, launch it, record its process. A write that fails here (the disk filled up
    after the check) must not leave the host without a server: the previous one is relaunched."""
    st_path = os.path.join(state_dir, STATE_FILE)
    daemon: Optional[WeightCacheEntry] = None
    fresh = False
    try:
        # the daemon first, and in the record before the engine starts: one never runs unrecorded
        daemon, fresh = weight_cache_for(a["launch"], secrets, state_dir, previous, out)
        if a["state_update"]:
            write_record(st_path, dict(a["state_update"], weight_cache=daemon))
        out["launched"] = launch(a["launch"], secrets)
        st = read_record(st_path) or {}
        st["weight_cache"] = daemon
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
        # launched but unrecorded (or its server is not): fleet could not stop it safely later
        for unrecorded in (launched, daemon if fresh else None):
            if unrecorded and unrecorded["pgid"] > 1:
                try:
                    os.killpg(unrecorded["pgid"], signal.SIGKILL)
                except OSError:
                    pass
        box = launched["container"] if launched else None
        if box and box.get("id"):  # unrecorded, nothing would prove it fleet's later: removed by its run's id
            run_cli([box["cli"], "rm", "-f", box["id"]], 60)
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
        rec.update((k, out["rolled_back"][k]) for k in ("pid", "pgid", "log", "exit_file", "start_ticks", "container"))
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


def weight_cache_for(
    req: LaunchRequest,
    secrets: Dict[str, str],
    state_dir: str,
    previous: Optional[Mapping[str, object]],
    out: ActResult,
) -> Tuple[Optional[WeightCacheEntry], bool]:
    """The weight cache daemon the engine of `req` maps its weights from (None: it loads them itself), and
    whether it was started now: the one kept (host/weight_cache.py keep_or_stop), else one started under
    fleet's launcher with the engine's environment and a log of its own. The engine's launcher is told to
    wait for it; both find its sockets in the deployment's own directory."""
    want = req.get("weight_cache")
    if not want:
        return None, False
    said = out.setdefault("weight_cache", {"kept": False, "why": "no daemon of this deployment runs"})
    directory = cache_dir(state_dir)
    templates = template_env(directory)
    daemon = running_daemon(previous) if said.get("kept") else None
    fresh = daemon is None
    if daemon is None:
        clear_dir(directory)
        cache_req: LaunchRequest = {
            "name": req["name"] + DAEMON_LOG_SUFFIX,
            "attempt": req["attempt"],
            "argv": want["argv"],
            "env": dict(req["env"], **templates),
            "log_dir": req["log_dir"],
        }
        daemon = daemon_entry(launch(cache_req, daemon_secrets(secrets, req["argv"])), want)
        said.update(started=True, pid=daemon["pid"], log=daemon["log"])
    wait = wait_spec(daemon, directory, want["ranks"], fresh)
    req["env"] = dict(req["env"], **templates, **{WAIT_ENV: wait})
    return daemon, fresh


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


def launch(a: LaunchRequest, secrets: Dict[str, str]) -> Launched:
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


def launch_container(a: LaunchRequest, secrets: Dict[str, str], log_path: str, exit_path: str) -> Launched:
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
    # the runtime writes the id of the container this `run` made, once it made it: all that fleet removes
    # when the run fails (the name is not proof: another fleet's container can take it after fleet looked).
    # In a directory of fleet's own, made now: a log directory another user may write to could hold a
    # file by that name, naming their choice of container
    own = tempfile.mkdtemp(prefix="fleet-run-")
    argv = [c["cli"], "run", "-d", "--cidfile", os.path.join(own, "cid")] + c["options"]
    argv += ["--entrypoint", c["python"], c["image"]] + launcher + a["argv"]
    try:
        # started in the attempt's log directory: podman's conmon writes a file `oom` into the directory
        # `run` was started in when the kernel kills the container at its memory limit (podman 4.3)
        code, out, err = run_cli(argv, 300, cwd=os.path.dirname(log_path))
        made = made_container(os.path.join(own, "cid"))
    finally:
        shutil.rmtree(own, ignore_errors=True)
    state = inspect(c["cli"], made) if code == 0 and made else None
    pid = int(state["pid"]) if state and state["pid"] else -1
    deadline = time.time() + 10
    while pid > 0 and os.path.exists(secret_file) and time.time() < deadline:  # read by the launcher
        time.sleep(0.05)
    try:
        os.unlink(secret_file)
    except OSError:
        pass
    if code != 0 or pid <= 0:  # never started, or ended at once: what the runtime said is the log
        said = err.strip() if code != 0 or not made else run_cli([c["cli"], "logs", made])[2].strip()
        if made:  # created, or half-started by a run that timed out
            run_cli([c["cli"], "rm", "-f", made])
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
        "container": {"cli": c["cli"], "name": c["name"], "id": made if pid > 0 else None},
    }
