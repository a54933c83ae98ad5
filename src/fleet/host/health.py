"""Runs ON the host, appended to the facts probe's text (`collect` comes from there): everything
`fleet health` needs in one round trip. Prints one JSON document.

Adds to the facts, for every deployment: its recorded server's process and command line, its HTTP
checks (/health, /v1/models, a real generation unless skipped or traffic was served since the last
check), its new server-log lines; and for the host: new `NVRM: Xid` and OOM-killer lines from the
kernel log. Keeps its own bookkeeping (offsets, counters) in state_dir/health.json.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple, cast

try:  # prepended when sent: the probe (collect) and the shared host code
    collect  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.common import api_key_name, base_url, first_line_of_stdin, http_request
    from fleet.host.container import cli_path, inspect
    from fleet.host.probe import _lock_live, collect
    from fleet.host.procs import argv_at, still_runs, uid_of
    from fleet.host.records import (
        HEALTH_FILE,
        LOCK_FILE,
        STATE_FILE,
        RecordTooNew,
        change_status,
        deployment_dir,
        host_guard,
        read_record,
        write_record,
    )
    from fleet.host.smoke import smoke_request
    from fleet.host.words import LIVE, READY, STOPPED, UNVERIFIED, log_lines
    from fleet.protocol import HealthRequest, ServerAnswer, SmokeSpec, StateRecord

HEALTH_LOG_LINES = 2000
# Under traffic the smoke prompt is still sent this often: traffic proves requests were answered, not that
# the answers are right (a server answering garbage to every client stayed OK indefinitely).
GENERATION_PROOF_EVERY_S = 900


def _read_new(path: str, offset: int, limit: int = 1 << 20, follow: bool = False) -> Tuple[str, int]:
    """Bytes appended to `path` since `offset` (from the start if the file shrank: rotated), at most
    `limit` of its end. Only a regular file is read, opened without blocking (a FIFO put in its place
    must not hang the probe; /dev/zero must not fill the host's memory); a link only where `follow`
    (an operator's kernel log, not a server log fleet wrote as a file)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError:
        return "", 0
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return "", 0
    with os.fdopen(fd, "rb") as f:
        size = st.st_size
        start = max(0 if offset > size else offset, size - limit)
        f.seek(start)
        data = f.read(size - start)  # bounded, however much it grew since
    return data.decode("utf-8", "replace"), size


def _kernel_lines(source: str, offset: int) -> Tuple[str, int]:
    if source and source != "dmesg":
        return _read_new(os.path.expanduser(source), offset, follow=True)
    try:
        out = subprocess.run(["dmesg"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=5).stdout
    except Exception:
        return "", offset
    text = out.decode("utf-8", "replace")
    return text[offset:] if offset <= len(text) else text, len(text)


def _metric_total(text: str) -> Optional[float]:
    total = None
    for line in text.splitlines():
        if line.startswith(("sglang:num_requests_total", "vllm:request_success_total")):
            try:
                total = (total or 0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


def check_server(
    st: Mapping[str, Any], servers: List[Dict[str, Any]], book: Dict[str, Any], args: HealthRequest
) -> Dict[str, Any]:
    """One deployment's server: its process, its HTTP answers, its new log lines. `book` is its part of
    the bookkeeping, updated in place."""
    out: Dict[str, Any] = {"server": None, "http": {}, "log_lines": []}
    http = out["http"]
    pid = st.get("pid")
    if isinstance(pid, int) and st.get("status") in LIVE:
        # the recorded process itself: not a zombie nobody reaped (a container without an init), not a
        # later process given the same pid (the record's boot and start time, when it has them; this
        # user's, always: another user's process is never fleet's server)
        running = still_runs(pid, [st.get("boot_id"), st.get("start_ticks")]) and uid_of(pid) == os.getuid()
        cmd: List[str] = (argv_at(pid) or []) if running else []
        recorded = (st.get("plan") or {}).get("argv") or []
        drift = running and recorded and [w for w in cmd if w][-len(recorded) :] != recorded
        group = [p for p in servers if p["pgid"] == st.get("pgid")]
        ports = sorted(set(q["port"] for p in group for q in p.get("ports", [])))
        out["server"] = {
            "pid": pid,
            "alive": running,
            "drift": bool(drift),
            "ports": ports,
            "port": st.get("port"),
            "group_pids": [p["pid"] for p in group],
        }
    container = _container_state(st.get("container"), st.get("status"))
    if container is not None:
        out["container"] = dict(container)
    answering = False
    if out["server"] and out["server"]["alive"]:
        base = base_url(st.get("check_address", "127.0.0.1"), int(st.get("port", 0)))
        code, body, secs = http_request("GET", base + "/health", timeout=args["http_timeout_s"])
        http["health"] = {"status": code, "seconds": secs}
        # no answer at all (a frozen engine): asking it three more things would cost the host's other
        # deployments their share of the check's deadline
        answering = code is not None
        if not answering:
            http["generation"] = {"skipped": "its /health did not answer"}
    if answering:
        key_name = api_key_name((st.get("plan") or {}).get("argv") if isinstance(st.get("plan"), dict) else None)
        key = (args.get("_keys") or {}).get(key_name) if key_name else None
        keyed = {"Authorization": "Bearer %s" % key} if key else None  # an engine with --api-key guards /v1/*
        code, body, secs = http_request("GET", base + "/v1/models", timeout=args["http_timeout_s"], headers=keyed)
        try:
            ids = [m.get("id") for m in json.loads(body).get("data", [])] if code == 200 else []
        except (ValueError, AttributeError):
            ids = []
        http["models"] = {"status": code, "ids": ids}
        code, body, secs = http_request("GET", base + "/metrics", timeout=args["http_timeout_s"])
        served = _metric_total(body) if code == 200 else None
        http["metrics"] = {"status": code, "requests_total": served}
        traffic = served is not None and book.get("requests_total") is not None and served > book["requests_total"]
        smoke = cast("SmokeSpec", st.get("smoke") or {})
        if args["skip_generation"]:
            http["generation"] = {"skipped": "--skip-generation"}
        elif traffic and _proved_recently(book.get("generation_proved_at")):
            http["generation"] = {"skipped": "served traffic since the last check", "serving": True}
        elif smoke.get("prompt") and key_name and key_name not in (args.get("_keys") or {}):
            http["generation"] = {"needs_key": key_name}  # fleet asks again with it, if it has it
        elif smoke.get("prompt"):
            result = smoke_request(base, str(st.get("served_name") or ""), smoke, args["generation_timeout_s"], key)
            http["generation"] = dict(result, text=result["text"][:300])
            if result.get("ok"):
                book["generation_proved_at"] = time.time()
            if served is not None:
                served += 1  # our own request is not traffic
        book["requests_total"] = served
    log = st.get("log") if st.get("status") != STOPPED else None  # a stopped server's log is history
    if log and not args.get("generation_only"):  # asked again for the prompt alone: the log was read
        text, size = _read_new(log, book.get("log_offset", 0) if book.get("log") == log else 0)
        out["log_lines"] = log_lines(text)[-HEALTH_LOG_LINES:]
        book["log"], book["log_offset"] = log, size
    return out


def prove_unverified(root: str, name: str, st: StateRecord, checked: ServerAnswer) -> bool:
    """A deployment recorded unverified (fleet's run ended before it proved its server) whose recorded
    process runs its recorded command line, holds its port and has just answered the prompt right is
    proven now: its record says ready, as the run would have written, and cron stops warning about it.
    Under the host's guard and only while no run holds its lock (a run takes its lock under that guard,
    then writes a new record). A group's rank is left to a deploy: its prompt proves the group, not this
    host's record alone."""
    server = checked.get("server") or {}
    answer = checked.get("http", {}).get("generation") or {}
    if st.get("status") != UNVERIFIED:
        return False
    if st.get("group") or not server.get("alive") or server.get("drift") or answer.get("ok") is not True:
        return False
    if server.get("port") not in server.get("ports", []):  # whoever answered, it was not the recorded server
        return False
    try:
        return _record_proven(deployment_dir(root, name), root, st)
    except (OSError, RecordTooNew):  # its record could not be written: proven next time, or by a deploy
        return False


def _record_proven(directory: str, root: str, st: StateRecord) -> bool:
    with host_guard(root):
        if _lock_live(os.path.join(directory, LOCK_FILE), read_record(os.path.join(directory, LOCK_FILE))):
            return False
        path = os.path.join(directory, STATE_FILE)
        now = read_record(path) or {}
        if now.get("status") != UNVERIFIED or now.get("pid") != st.get("pid"):
            return False  # changed since the probe read it
        why = "proven by fleet health: the recorded server answered the prompt after fleet's run had ended"
        return change_status(path, READY, {"reason": why, "ready_at": time.time()}, str(st.get("run_id")))


def _container_state(box: object, status: object) -> Optional[Mapping[str, Any]]:
    """What the runtime says of a live deployment's container `box` as recorded (running, restarts,
    OOM-killed); None: none."""
    if not (isinstance(box, dict) and box.get("cli") in ("docker", "podman") and status in LIVE):
        return None
    cli = cli_path(str(box["cli"]))
    # by the id fleet's run made, never by the name: another's container can hold that name now
    found = (inspect(cli, str(box["id"])) if cli and box.get("id") else None) or {"missing": True}
    return dict(found, name=box.get("name"))


def _proved_recently(proved_at: Any) -> bool:
    """A right answer was seen less than GENERATION_PROOF_EVERY_S ago. A stamp in the future (the clock was
    stepped back) proves nothing: it is not trusted to skip."""
    if not isinstance(proved_at, (int, float)) or isinstance(proved_at, bool):
        return False
    return 0 <= time.time() - proved_at < GENERATION_PROOF_EVERY_S


def health_main() -> None:
    args = cast("HealthRequest", json.loads(sys.argv[1]))
    if args.get("keys_on_stdin"):  # engines' API keys fleet was asked for: never on a command line
        args["_keys"] = first_line_of_stdin().get("keys") or {}
    facts = collect(args)
    state_dir = os.path.expanduser(args.get("state_dir", "~/.fleet/state"))
    book_path = os.path.join(state_dir, HEALTH_FILE)
    try:
        book, newer = read_record(book_path) or {}, None
    except RecordTooNew as exc:  # a newer fleet keeps this host's book: read as empty, left as it is
        book, newer = {}, str(exc)
    kept = book.get("deployments")
    books: Dict[str, Dict[str, Any]] = kept if isinstance(kept, dict) else {}
    out: Dict[str, Any] = {"facts": facts, "deployments": {}, "kernel": [], "since": book.get("time")}
    # asked again for some deployments' prompts alone (with their API keys): the rest, the log and kernel
    # lines were read by the probe just before, and their offsets stay where it left them
    again = args.get("generation_only")
    recorded = ((facts.get("state") or {}).get("deployments") or {}).items()
    for name, records in sorted(recorded):
        if again is not None and name not in again:
            continue
        st = records.get("state") if isinstance(records.get("state"), dict) else {}
        mine = books.get(name)
        if not isinstance(mine, dict):
            mine = {}
        try:
            checked = out["deployments"][name] = check_server(st, facts["servers"], mine, args)
            if not records.get("legacy") and prove_unverified(
                state_dir, name, cast("StateRecord", st), cast("ServerAnswer", checked)
            ):
                checked["proven"] = True
        except Exception as exc:  # one record edited or cut short: that deployment, not the whole host
            out["deployments"][name] = {"server": None, "http": {}, "log_lines": [], "error": _said(exc)}
        books[name] = mine
    if again is None:
        book["deployments"] = dict((n, b) for n, b in books.items() if n in out["deployments"])
        text, pos = _kernel_lines(args.get("kernel_log") or "dmesg", book.get("kernel_offset", 0))
        out["kernel"] = [
            line
            for line in log_lines(text)
            if "NVRM: Xid" in line or "Out of memory: Killed" in line or "oom-kill" in line
        ][-200:]
        book["kernel_offset"] = pos
        book["time"] = time.time()
    else:
        book["deployments"] = books
    if newer is not None:
        out["bookkeeping_error"] = newer
    else:
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            write_record(book_path, book)
        except OSError as exc:
            out["bookkeeping_error"] = str(exc)
    sys.stdout.write(json.dumps(out))


def _said(exc: BaseException) -> str:
    return ("%s: %s" % (type(exc).__name__, exc))[:300]


try:
    health_main()
except Exception as exc:  # always answer with JSON
    sys.stdout.write(json.dumps({"probe_error": _said(exc)}))
