"""Runs ON the router's host (sent as `python -c` with the router's Python): a service's SGLang router --
started, asked, changed, stopped -- and the service's own record. One step runs a list of actions in
order and answers {"results": [...]}, stopping at the first that fails.

Actions: ensure (the router running with this command line), workers (what it routes to), add and
remove (a worker, waiting until the router says it is done), ask (the smoke prompt through the router),
stop, remember and recall (the service's record: each replica's last good state record, for --rollback).

Layout: state_dir/services/NAME/router.json (the router process: pid, start ticks, boot id, argv),
state_dir/services/NAME/service.json (the service's record), log_dir/router-NAME.log.
The router is recognised only by that exact identity: a process that merely has its pid is never
signalled. Host code: standard library only, Python 3.8.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Set, cast

try:  # the shared host code is prepended when this script is sent to a host
    http_request  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.common import http_request
    from fleet.host.procs import alive, boot_id, port_holders, process, start_ticks
    from fleet.host.records import (
        ROUTER_FILE,
        SERVICE_FILE,
        load_record,
        not_ours_alone,
        open_appending,
        read_record,
        unsafe_state_dir,
        write_record,
    )
    from fleet.host.smoke import smoke_request
    from fleet.protocol import RouterRecord, RouterRequest


def _dir(a: RouterRequest, create: bool = True) -> str:
    """state_dir/services/NAME; made only by the actions that write there (status and health change nothing)."""
    path = os.path.join(os.path.expanduser(a["state_dir"]), "services", a["service"])
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _base(a: RouterRequest) -> str:
    bind = a["bind"] if a["bind"] not in ("0.0.0.0", "::") else "127.0.0.1"
    return "http://%s:%d" % ("[%s]" % bind if ":" in bind else bind, a["port"])


def circuits_open(a: RouterRequest) -> Set[str]:
    """Workers whose circuit the router does not hold closed (open: it answers 503 "no available workers"
    rather than send them requests, for a minute after ten failures, even while their /health is fine,
    sglang #13894; half-open: it lets a few trial requests through and refuses the rest), from its
    metrics exporter: smg_worker_cb_state{worker="URL"} 0 is closed (measured: 1 after ten failures)."""
    bind = a["bind"] if a["bind"] not in ("0.0.0.0", "::") else "127.0.0.1"
    url = "http://%s:%d/metrics" % ("[%s]" % bind if ":" in bind else bind, a["metrics_port"])
    status, text, _ = http_request("GET", url, timeout=5, limit=8 << 20)
    if status != 200:
        return set()
    found = set()
    for line in text.splitlines():
        if line.startswith("smg_worker_cb_state{") and line.rsplit(None, 1)[-1] not in ("0", "0.0"):
            found.add(line.split('worker="', 1)[-1].split('"', 1)[0])
    return found


def _foreign(rec: Optional[Dict[str, Any]], a: RouterRequest) -> Optional[Dict[str, Any]]:
    """An error when the recorded router was started from another service file of the same name."""
    source = (rec or {}).get("source")
    if source and source != a["source"]:
        return {
            "error": "service %s's router here was started from %s, not %s" % (a["service"], source, a["source"]),
            "foreign": source,
        }
    return None


def running_router(a: RouterRequest) -> Optional[RouterRecord]:
    """The service's recorded router when that exact process still runs (same boot, pid and start time).
    Read only: a record that cannot be read is left as it is (status and health change nothing)."""
    rec, _ = load_record(os.path.join(_dir(a, create=False), ROUTER_FILE))
    if not rec or rec.get("boot_id") != boot_id():
        return None
    pid = rec.get("pid")
    if not isinstance(pid, int) or not alive(pid) or start_ticks(pid) != rec.get("start_ticks"):
        return None
    return cast("RouterRecord", rec)


def _stop(rec: RouterRecord, grace_s: float = 10.0) -> None:
    pid = int(rec["pid"])
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGTERM)  # launched as the leader of its own session and group
    deadline = time.time() + grace_s
    while time.time() < deadline and alive(pid) and start_ticks(pid) == rec.get("start_ticks"):
        time.sleep(0.1)
    if alive(pid) and start_ticks(pid) == rec.get("start_ticks"):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def _log_tail(path: str, lines: int = 30) -> List[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 16384))
            return f.read().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return []


def ensure(a: RouterRequest) -> Dict[str, Any]:
    """The router running with exactly `argv`: left alone when it is, else started and waited for. One
    running with other options is replaced only when `replace` says so (a new router knows no workers:
    requests fail until fleet registers them again), and only after its new ports proved free."""
    directory = _dir(a)
    rec = running_router(a)
    if rec is not None and (rec.get("argv") == a["argv"] or not a.get("replace")):
        return {"router": "running", "pid": rec["pid"], "log": rec.get("log"), "differs": rec.get("argv") != a["argv"]}
    own = set([rec["pid"]]) if rec is not None else set()  # the old router's ports are about to be freed
    for port, key in ((a["port"], "port"), (a["metrics_port"], "metrics_port")):
        holders, hidden = port_holders(port, a["bind"])
        if (holders - own) or hidden:
            who = [process(p) or {"pid": p} for p in sorted(holders - own)]
            return {"error": "%s %d is in use" % (key, port), "holders": who, "hidden_holder": hidden}
    replaced = None
    if rec is not None:  # its options changed: the new one starts with no workers; fleet registers them again
        _stop(rec)
        replaced = rec["pid"]
    log_dir = os.path.expanduser(a["log_dir"])
    os.makedirs(log_dir, mode=0o700, exist_ok=True)
    log_path = os.path.join(log_dir, "router-%s.log" % a["service"])
    argv = [os.path.expanduser(a["argv"][0])] + a["argv"][1:]
    with open_appending(log_path) as log:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True, cwd=log_dir
        )
    started: RouterRecord = {
        "pid": child.pid,
        "start_ticks": start_ticks(child.pid),
        "boot_id": boot_id(),
        "argv": a["argv"],
        "log": log_path,
        "started": time.time(),
        "source": a["source"],
    }
    write_record(os.path.join(directory, ROUTER_FILE), started)
    deadline = time.time() + a.get("wait_s", 60)
    while time.time() < deadline:
        if child.poll() is not None:
            return {"error": "the router exited (code %s)" % child.returncode, "log_tail": _log_tail(log_path)}
        status, _, _ = http_request("GET", _base(a) + "/health", timeout=2)
        if status == 200:
            return {"router": "started", "pid": child.pid, "log": log_path, "replaced": replaced}
        time.sleep(0.2)
    return {
        "error": "the router did not answer /health within %ss" % a.get("wait_s", 60),
        "log_tail": _log_tail(log_path),
    }


def workers(a: RouterRequest) -> Dict[str, Any]:
    status, text, _ = http_request("GET", _base(a) + "/workers", timeout=10)
    if status != 200:
        return {"error": "the router's /workers answered %s: %s" % (status, text[:200])}
    try:
        listed = json.loads(text).get("workers")
    except (ValueError, AttributeError):
        return {"error": "the router's /workers answer is not a JSON object: %r" % text[:200]}
    if not isinstance(listed, list):  # {"workers": 5}, {"workers": {...}}: no list of workers to read
        return {"error": "the router's /workers answer has no list of workers: %r" % text[:200]}
    keep = ("id", "url", "is_healthy", "load")
    # whether the router sends a worker requests at all: one truth for status, health and the roll
    tripped = circuits_open(a) if a.get("metrics_port") else set()
    return {
        "workers": [
            dict([(k, w.get(k)) for k in keep] + [("circuit_open", w["url"] in tripped)])
            for w in listed
            if isinstance(w, dict) and isinstance(w.get("url"), str)
        ]
    }


def workers_or_raise(a: RouterRequest) -> List[Dict[str, Any]]:
    found = workers(a)
    if "error" in found:
        raise RuntimeError(found["error"])
    listed: List[Dict[str, Any]] = found["workers"]
    return listed


def _listed(a: RouterRequest, url: str) -> List[Dict[str, Any]]:
    return [w for w in workers_or_raise(a) if w.get("url") == url]


def add(a: RouterRequest) -> Dict[str, Any]:
    """Register `url` (unless it is) and wait until the router lists it healthy."""
    url = a["url"]
    if not _listed(a, url):
        status, text, _ = http_request("POST", _base(a) + "/workers", {"url": url}, timeout=10)
        if status not in (200, 201, 202):
            return {"error": "the router refused worker %s: %s %s" % (url, status, text[:200])}
    deadline = time.time() + a.get("wait_s", 60)
    while time.time() < deadline:
        listed = _listed(a, url)
        if listed and all(w.get("is_healthy") for w in listed):
            return {"added": url, "id": listed[0].get("id")}
        time.sleep(0.2)
    return {"error": "the router did not list %s as healthy within %ss" % (url, a.get("wait_s", 60))}


def remove(a: RouterRequest) -> Dict[str, Any]:
    """Deregister `url` and wait until the router no longer lists it (removal is asynchronous in 0.3.2)."""
    url = a["url"]
    if a.get("keep_one_healthy"):  # checked here, by the router's own view at this moment
        refused = _last_available(a, url)
        if refused:
            return {"refused": refused}
    deadline = time.time() + a.get("wait_s", 30)
    asked: Set[Any] = set()
    while time.time() < deadline:
        listed = _listed(a, url)
        if not listed:
            return {"removed": url, "was_listed": bool(asked)}
        for w in listed:
            if w.get("id") not in asked:
                status, text, _ = http_request("DELETE", _base(a) + "/workers/%s" % w.get("id"), timeout=10)
                if status not in (200, 202, 204, 404):
                    return {"error": "the router refused to remove %s: %s %s" % (url, status, text[:200])}
                asked.add(w.get("id"))
        time.sleep(0.2)
    return {"error": "the router still lists %s after %ss" % (url, a.get("wait_s", 30))}


def _last_available(a: RouterRequest, url: str) -> Optional[str]:
    """Why `url` may not leave the router: no other worker it lists is healthy with its circuit closed.
    Open circuits close by themselves (after 60 s by default): waited for, up to `circuit_wait_s`."""
    deadline = time.time() + a.get("circuit_wait_s", 90)
    while True:
        listed = [w for w in workers_or_raise(a) if w.get("url") != url]
        healthy = [w for w in listed if w.get("is_healthy")]
        tripped = circuits_open(a) if healthy else set()
        if any(w.get("url") not in tripped for w in healthy):
            return None
        if not healthy or time.time() > deadline:
            why = (
                "no other healthy worker"
                if not healthy
                else "every other worker's circuit open (%s)" % (", ".join(sorted(tripped)))
            )
            return "the router has %s: taking %s out would leave it nothing to send requests to" % (why, url)
        time.sleep(1)


def ask(a: RouterRequest) -> Dict[str, Any]:
    return {"answer": smoke_request(_base(a), a["served_name"], a["smoke"], a.get("timeout_s", 60))}


def health(a: RouterRequest) -> Dict[str, Any]:
    """The router's /health, whether fleet's recorded router runs, and whether the service is up at all
    (a router record exists from `fleet up` and no `fleet down` removed it). An answer counts only from
    fleet's own router: another process on its port (another user's, once fleet's router died) is named,
    never taken for it."""
    status, text, _ = http_request("GET", _base(a) + "/health", timeout=5)
    recorded = os.path.lexists(os.path.join(_dir(a, create=False), ROUTER_FILE))
    running = running_router(a) is not None
    if status is not None and not running:
        status, text = None, "port %d answers, but not from fleet's router: %s" % (a["port"], _holders(a))
    return {"router_running": running, "health": status, "text": text[:300], "up": recorded}


def _holders(a: RouterRequest) -> str:
    holders, hidden = port_holders(a["port"], a["bind"])
    said = []
    for pid in sorted(holders):
        p = process(pid)
        said.append("pid %d (%s)" % (pid, p["user"]) if p else "pid %d" % pid)
    return ", ".join(said + (["a process of another user"] if hidden else [])) or "a process fleet cannot see"


def stop(a: RouterRequest) -> Dict[str, Any]:
    """Stop the recorded router, and forget it whether or not it still ran: the service is down (a router
    that died before `fleet down` left its record, and health went on reporting the service as up)."""
    path = os.path.join(_dir(a, create=False), ROUTER_FILE)
    rec = running_router(a)
    if rec is None:
        _, unreadable = load_record(path)
        holders, hidden = port_holders(a["port"], a["bind"])
        if unreadable and (holders or hidden):  # it may be fleet's router: fleet cannot tell, so says so
            why = "the router's record cannot be read (%s), and port %d is held by %s: fleet cannot tell"
            why += " whether that is its router; stop it by hand if it is, then run this again"
            return {"error": why % (unreadable, a["port"], _holders(a))}
    if rec is not None:
        _stop(rec)
    with contextlib.suppress(OSError):
        os.unlink(path)
    return {"ended_pid": rec["pid"] if rec is not None else None}


def remember(a: RouterRequest) -> Dict[str, Any]:
    """Merge `replicas` (deployment -> what to remember of it) into the service's record."""
    path = os.path.join(_dir(a), SERVICE_FILE)
    rec = read_record(path) or {}
    found = rec.get("replicas")
    replicas: Dict[str, Any] = found if isinstance(found, dict) else {}
    for name, value in a["replicas"].items():
        replicas[name] = dict(replicas.get(name) or {}, **value)
    rec.update(replicas=replicas, updated=time.time())
    write_record(path, rec)
    return {"remembered": sorted(a["replicas"])}


def recall(a: RouterRequest) -> Dict[str, Any]:
    return {"record": load_record(os.path.join(_dir(a, create=False), SERVICE_FILE))[0] or {}}


def lease(a: RouterRequest) -> Dict[str, Any]:
    """The service's own lock: one command that changes it (up, a roll, down) at a time. A lease the
    holder keeps touching; one left untouched for `ttl_s` (its fleet killed, its machine gone) is stale
    and taken over. `peek`: only say who holds it; `release`: give it up (if it is this run's)."""
    directory = _dir(a, create=not a.get("peek"))
    if not os.path.isdir(directory):
        return {"held": False}
    path = os.path.join(directory, "lease.json")
    with open_appending(os.path.join(directory, "lease.guard")) as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        held = read_record(path) or {}
        now = time.time()
        live = bool(held) and now - float(held.get("touched") or 0) < float(a["ttl_s"])
        if held and live and held.get("run_id") != a["run_id"]:
            return {
                "held": True,
                "owner": held.get("owner"),
                "command": held.get("command"),
                "since": held.get("since"),
            }
        if a.get("peek"):
            return {"held": False}
        if a.get("release"):
            if held and held.get("run_id") == a["run_id"]:
                os.unlink(path)
            return {"held": False, "released": True}
        mine = held if held and held.get("run_id") == a["run_id"] else None
        write_record(
            path,
            {
                "run_id": a["run_id"],
                "owner": a.get("owner"),
                "command": a.get("command"),
                "since": (mine or {}).get("since") or now,
                "touched": now,
            },
        )
        return {"held": False, "taken_over": dict(held) if held and not mine else None}


def unsafe_directory(a: RouterRequest) -> Optional[str]:
    """Why the service's records cannot be kept in the state directory, or None (records.unsafe_state_dir,
    and the services directories as they are made)."""
    root = os.path.expanduser(a["state_dir"])
    services = os.path.join(root, "services")
    problem = unsafe_state_dir(root)
    for path in (services, os.path.join(services, a["service"])):
        problem = problem or (not_ours_alone(path) if os.path.lexists(path) else None)
    return problem


ACTIONS = {
    "lease": lease,
    "ensure": ensure,
    "workers": workers,
    "add": add,
    "remove": remove,
    "ask": ask,
    "health": health,
    "stop": stop,
    "remember": remember,
    "recall": recall,
}


def main() -> None:
    common = cast("RouterRequest", json.loads(sys.argv[1]))
    results = []  # type: List[Dict[str, Any]]
    unsafe = unsafe_directory(common)
    if unsafe:  # another user could plant the records, the lease or the log fleet then trusts or writes
        sys.stdout.write(json.dumps({"results": [{"error": unsafe, "do": common["actions"][0]["do"]}]}))
        return
    foreign = _foreign(load_record(os.path.join(_dir(common, create=False), ROUTER_FILE))[0], common)
    if foreign:  # another service file of the same name runs here: none of its records are touched
        sys.stdout.write(json.dumps({"results": [dict(foreign, do=common["actions"][0]["do"])]}))
        return
    for action in common.pop("actions"):
        a = cast("RouterRequest", dict(common, **action))
        try:
            result = ACTIONS[a["do"]](a)
        except Exception as exc:  # the router not answering, a record that cannot be written
            result = {"error": "%s: %s" % (type(exc).__name__, exc)}
        results.append(dict(result, do=a["do"]))
        if "error" in result:
            break
    sys.stdout.write(json.dumps({"results": results}))


if __name__ == "__main__":
    main()
