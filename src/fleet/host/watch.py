"""Runs ON the host (sent as `python -c`): follow one launch attempt and report as JSON lines.

Streams the attempt's log from a byte offset as it is written (no re-reading, no fixed sleeps),
follows the process, and proves the server once it says it is ready -- its ready line, or `/health`
200 (asked every second, so a deleted log or a changed ready line cannot hide a working server):
`/health` 200, then a real generation of the smoke prompt whose answer must match. Events, one JSON
object per line:
  {"e":"line","o":<offset after this line>,"t":<text>}   {"e":"log_reset","why":..}
  {"e":"ready_line"}   {"e":"ready_http"}   {"e":"health","code":200}
  {"e":"smoke","ok":bool,"status":..,"text":..}   {"e":"exit","code":..}   {"e":"timeout","what":..}
  {"e":"done"}   {"e":"lost_lock","why":..}
A group's rank other than 0 (no smoke prompt given) is done once its `/health` answers 200. With `hold`, a
rank that is done keeps its lock, saying {"e":"held"} every second, until fleet closes stdin.
On success it writes the deployment state and learned fixes fleet handed it, and releases the lock,
so a successful deploy needs no further round trip. While it runs it keeps the lock's lease fresh.
fleet keeps this command's stdin open while it listens: when it ends (fleet killed, Ctrl-C, the
connection cut) the watcher records the server as unverified, releases the lock and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Dict, Mapping, Optional, Set, cast

try:  # the shared host code is prepended when this script is sent to a host
    read_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host.common import base_url, first_line_of_stdin, http_request
    from fleet.host.container import cli_path, inspect, run_cli
    from fleet.host.follow import LINE_LIMIT, OUT, OUT_LIMIT, STALLED_S, ClientGone, LogFollower, emit  # noqa: F401
    from fleet.host.procs import started_as
    from fleet.host.records import (
        LEARNED_FILE,
        LOCK_FILE,
        STATE_FILE,
        RecordTooNew,
        RunLock,
        change_status,
        deployment_dir,
        host_guard,
        mark_unverified,
        read_record,
        write_record,
    )
    from fleet.host.signals import hold_same_group, release
    from fleet.host.smoke import smoke_request
    from fleet.host.startup import StartupWatch
    from fleet.host.words import FAILED, READY, STARTING, UNVERIFIED
    from fleet.protocol import WatchRequest

POLL_S = 0.02
HTTP_READY_EVERY_S = 1.0
READ_BEFORE_READY = 16  # reads of up to 1 MiB each before a /health answer makes the start ready
LAST_LINES_S = 0.5  # the longest an ended attempt's group is given to finish its log (one that lingers)
ATTEMPT_TERM_S = 5.0  # a frozen fleet's attempt: SIGTERM, this long, SIGKILL


def alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def smoke(a: WatchRequest) -> Dict[str, Any]:
    base = base_url(a["address"], a["port"])
    result = smoke_request(base, a["served_name"], a["smoke"], a["smoke"].get("timeout_s", 120), a.get("_api_key"))
    return {"e": "smoke", "ok": result["ok"], "status": result["status"], "text": result["text"]}


def lock_path(a: WatchRequest) -> str:
    return os.path.join(deployment_dir(a["state_dir"], a["deployment"]), LOCK_FILE)


def touch_lock(a: WatchRequest) -> None:
    """Keep the run's lock fresh, naming this process as the one that holds it. Under the host's guard, as
    a release is: read before a release and written after it, the lock came back with no run behind it."""
    path = lock_path(a)
    try:
        with host_guard(os.path.expanduser(a["state_dir"])):
            lock = read_record(path) or {}
            if lock.get("run_id") == a["run_id"]:
                if lock.get("holder_pid") != os.getpid():
                    lock["holder_pid"] = os.getpid()
                    lock["holder_start"] = started_as(os.getpid())  # as host.lock takes it
                    write_record(path, lock)
                else:
                    os.utime(path)
    except (OSError, ValueError):
        pass


def run_lock(a: WatchRequest) -> RunLock:
    """The lock this run took in its act step: kept across the watch (a failed attempt's relaunch needs it)
    unless the run ends here."""
    root = os.path.expanduser(a["state_dir"])
    return RunLock(deployment_dir(root, a["deployment"]), a["run_id"], release=False, guard_root=root)


def on_success(a: WatchRequest, lock: RunLock) -> None:
    state_dir = deployment_dir(a["state_dir"], a["deployment"])
    st_path = os.path.join(state_dir, STATE_FILE)
    proven = dict(a["success_state"])
    proven["ready_at"] = time.time()
    change_status(st_path, str(proven.pop("status", READY)), proven, a["run_id"])
    if a.get("learned_key") and a["learned"]:
        with contextlib.suppress(RecordTooNew):  # a newer fleet keeps the host's fixes: they stay its own
            learn(a)
    if not a.get("hold"):  # a group's rank keeps its lock until the whole group is proven (see hold)
        lock.release_now()


def learn(a: WatchRequest) -> None:
    """The fixes this run applied, merged into the host's learned fixes."""
    root = os.path.expanduser(a["state_dir"])
    # the host's, shared by its deployments: merged under the host's guard, never dropped (another
    # deployment of the same model may have just learned what this one started without)
    with host_guard(root):
        lpath = os.path.join(root, LEARNED_FILE)
        fixes = (read_record(lpath) or {}).get("fixes")
        learned = fixes if isinstance(fixes, dict) else {}
        kept = learned.get(a["learned_key"])
        entries = [e for e in kept if isinstance(e, dict)] if isinstance(kept, list) else []
        # what the engine said it picks itself is replaced by what it says now; fixes are kept
        told = [e for e in a["learned"] if e.get("signature") == "engine-picks"]
        entries = [e for e in entries if not (told and e.get("signature") == "engine-picks")]
        known = set(e.get("signature") for e in entries)
        learned[a["learned_key"]] = entries + [e for e in a["learned"] if e.get("signature") not in known]
        write_record(lpath, {"fixes": learned})


def hold(a: WatchRequest, client_gone: threading.Event, lock: RunLock) -> None:
    """A group's rank, proven: keep its lock (touched, so it stays live) until fleet, having proven every
    rank, closes this command's stdin; say so every second, which is when fleet can end the stream."""
    try:
        while not client_gone.wait(1.0):
            touch_lock(a)
            emit({"e": "held"})
    except ClientGone:
        pass
    lock.release_now()


def reclaim(a: WatchRequest) -> Optional[str]:
    """On a resumed watch (its connection was cut, so the last watcher let go): take the lock and the
    record back for this run; None, or why not (another run took the host meanwhile)."""
    path = lock_path(a)
    lock = read_record(path)
    if lock is not None and lock.get("run_id") != a["run_id"]:
        return "another fleet run (%s, %s) took the host while the connection was down" % (
            lock.get("owner"),
            lock.get("command"),
        )
    st_path = os.path.join(deployment_dir(a["state_dir"], a["deployment"]), STATE_FILE)
    st = read_record(st_path) or {}
    if st.get("run_id") == a["run_id"] and st.get("status") == FAILED:  # the host gave up on this run
        return "the host stopped this run's server: %s" % st.get("reason", "failed")
    if lock is None:
        write_record(path, {"run_id": a["run_id"], "owner": a.get("owner"), "since": time.time(), "command": "deploy"})
    if st.get("run_id") == a["run_id"] and st.get("status") == UNVERIFIED:
        change_status(st_path, STARTING, {"reason": None}, a["run_id"])
    return None


def on_client_gone(a: WatchRequest, lock: RunLock) -> None:
    """fleet stopped listening before the server was proven: say so in the record, free the host."""
    try:
        mark_unverified(deployment_dir(a["state_dir"], a["deployment"]), a["run_id"])
    except OSError:
        pass
    lock.release_now()


def watch_client(a: WatchRequest) -> threading.Event:
    """An event set when fleet's end of this command's stdin closes (only when fleet holds it open)."""
    gone = threading.Event()
    if not a.get("client_on_stdin"):
        return gone

    def wait_for_eof() -> None:
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        gone.set()

    threading.Thread(target=wait_for_eof, name="client-watch", daemon=True).start()
    return gone


def main(a: WatchRequest, lock: RunLock) -> None:
    AttemptWatch(a, lock).run()


class AttemptWatch:
    """One attempt followed to its end: its log read and said, its start-up phases and stalls, its bounds
    (ready timeout, no progress, health), its server proved; each way it can end says its last event and
    keeps its start in the host's history (`end`)."""

    def __init__(self, a: WatchRequest, lock: RunLock) -> None:
        self.a, self.lock = a, lock
        self.ready_re = re.compile(a["ready_regex"])
        self.log = LogFollower(a["log"], a["offset"])
        self.start = time.time()
        self.startup = StartupWatch(a, self.start)  # phases, ETA and stalls, from the engine's own lines
        self.last_touch = self.last_http = 0.0
        self.last_progress = self.start
        self.phase = "health" if a.get("ready_seen") else STARTING  # starting -> health -> done
        self.health_deadline = self.start + a["health_timeout_s"] if self.phase == "health" else None
        self.client_gone = threading.Event()

    def run(self) -> None:
        a = self.a
        if a.get("key_on_stdin"):  # the engine's API key, for the smoke request: never on a command line
            a["_api_key"] = first_line_of_stdin().get("api_key")
        self.client_gone = watch_client(a)
        if a["offset"] or a.get("ready_seen"):
            lost = reclaim(a)
            if lost:
                emit({"e": "lost_lock", "why": lost})
                return
        while not self.step(time.time()):
            pass

    def end(self, event: Mapping[str, object], outcome: Optional[str], now: float) -> bool:
        """Say the attempt's last event, its start kept in the host's history as `outcome` (None: kept
        already, or not a start's end); the watch is over."""
        if outcome is not None:
            self.startup.record(outcome, now)
        emit(event)
        return True

    def step(self, now: float) -> bool:
        """One round of the watch; True when it is over."""
        a = self.a
        if self.client_gone.is_set():
            on_client_gone(a, self.lock)
            return True
        if now - self.last_touch > 2:
            touch_lock(a)
            self.last_touch = now
        OUT.flush()
        stalled_s = float(a.get("stalled_s", STALLED_S))
        if OUT.stalled(stalled_s):  # connected, but reading nothing: fleet is frozen; the watcher keeps bounds
            frozen_client(a, "fleet read nothing of this watcher's output for %gs" % stalled_s, self.lock)
            return True
        if self.phase == STARTING and now - self.start > a["ready_timeout_s"]:  # also while a log floods
            return self.end({"e": "timeout", "what": READY, "after_s": now - self.start}, "timeout", now)
        stall = self.startup.stalled(now) if self.phase == STARTING else None
        if stall is not None and stall["e"] == "stalled":  # the playbook waits through stalls: said only
            emit(stall)
        elif stall is not None:  # a phase quiet past its bound: the attempt ends now, not at the ready timeout
            return self.end(stall, "stalled", now)
        if self.read_log(now):
            return False  # progress: read on at once
        if os.path.exists(a["exit_file"]) or not alive_group(a["pgid"]):
            return self.end(self.exited(), "exited", now)
        if self.phase == STARTING and now - self.last_http >= HTTP_READY_EVERY_S:
            self.last_http = now
            status, _, _ = http_request("GET", base_url(a["address"], a["port"]) + "/health", timeout=2)
            if status == 200:  # both engines answer 503 until they can serve (engines.md 3.2, 6.3)
                # what the log gained since it was read is the start's (its phases, maybe its ready line):
                # read first, or a start faster than this check's round trip would go unsaid
                for _ in range(READ_BEFORE_READY):
                    if not self.read_log(now) or self.phase != STARTING:
                        break
                if self.phase == STARTING:
                    self.now_ready(now, {"e": "ready_http"})
        if self.phase == "health":
            return self.prove(now)
        if now - self.start > a["ready_timeout_s"]:
            return self.end({"e": "timeout", "what": READY, "after_s": now - self.start}, "timeout", now)
        if now - self.last_progress > a["progress_timeout_s"]:
            after = now - self.last_progress
            return self.end({"e": "timeout", "what": "progress", "after_s": after}, "timeout", now)
        time.sleep(POLL_S)
        return False

    def read_log(self, now: float) -> bool:
        """Say what the log gained (its lines, a bar's redraw, the phases they show); True if it moved."""
        lines, events = self.log.read()
        for ev in events:
            emit(ev)
        redrawn = self.log.redrawn()  # a bar redrawn in a line not yet ended (after the lines it follows)
        for end, text in lines:
            emit({"e": "line", "o": end, "t": text})
            self.said_phase(text, now)
            if self.phase == STARTING and self.ready_re.search(text):
                self.now_ready(now, {"e": "ready_line"})
        if redrawn is not None:
            self.said_phase(redrawn, now)
        if lines or redrawn is not None:
            self.last_progress = now
            return True
        return False

    def said_phase(self, text: str, now: float) -> None:
        said = self.startup.line(text, now) if self.phase == STARTING else None
        if said is not None:
            emit(said)

    def now_ready(self, now: float, event: Mapping[str, object]) -> None:
        self.startup.ready(now)
        emit(event)
        self.phase = "health"
        self.health_deadline = time.time() + self.a["health_timeout_s"]

    def exited(self) -> Dict[str, Any]:
        """The attempt's process ended: the log's last lines said, and how it ended."""
        # Its group's other processes (the launcher writing the exit file, an engine's workers) may still
        # add lines: once the group is gone every line is in the file; a group that lingers gets a bound.
        until = time.monotonic() + LAST_LINES_S
        while alive_group(self.a["pgid"]) and time.monotonic() < until:
            time.sleep(0.005)
        for end, text in self.log.rest():
            emit({"e": "line", "o": end, "t": text})
        code = None
        try:
            with open(self.a["exit_file"]) as f:
                code = int(f.read().strip() or -1)
        except (OSError, ValueError):
            pass
        ended: Dict[str, Any] = {"e": "exit", "code": code}
        box = self.a.get("container")
        if box:  # what the runtime saw: a container's memory limit kills without a word in the log
            cli = cli_path(str(box.get("cli")))
            seen = inspect(cli, str(box["id"])) if cli and box.get("id") else None  # never by name: another's
            if seen and seen.get("oom_killed"):
                ended["oom_killed"] = True
        return ended

    def prove(self, now: float) -> bool:
        """The server says it is ready: /health, then (rank 0) the smoke prompt; True when that decided."""
        a = self.a
        status, _, _ = http_request("GET", base_url(a["address"], a["port"]) + "/health", timeout=5)
        if status != 200:
            if self.health_deadline is not None and time.time() > self.health_deadline:
                return self.end({"e": "timeout", "what": "health", "status": status}, "health_timeout", now)
            time.sleep(0.2)
            return False
        emit({"e": "health", "code": 200})
        if a["smoke"]:  # a group's other rank has none: it answers /health only; rank 0 is asked
            result = smoke(a)
            if not result["ok"]:
                self.startup.record("smoke_failed", now)
                time.sleep(a.get("settle_s", 1.0))  # a crash the request triggered reaches the log first
            for end, text in self.log.read()[0]:  # what the server logged up to its answer (its ready line)
                emit({"e": "line", "o": end, "t": text})
            if not result["ok"]:
                return self.end(result, None, now)
            emit(result)
        a["success_state"]["startup"] = self.startup.record(READY, now)
        on_success(a, self.lock)
        emit({"e": "done"})
        if a.get("hold"):
            hold(a, self.client_gone, self.lock)
        return True


def frozen_client(a: WatchRequest, why: str, lock: RunLock) -> None:
    """fleet is connected but reads nothing (stopped with SIGSTOP, swapped out): waiting for it would hold
    the host's lock and leave an engine running that nobody proves. The attempt's server is stopped (its
    container through its runtime: a rootful engine is not fleet's user's to signal; its group, held member
    by member, this user's only), recorded as failed, and the lock released."""
    stopped = stop_container(a.get("container")) + stop_attempt_group(a["pgid"], a.get("start_ticks"))
    try:
        st_path = os.path.join(deployment_dir(a["state_dir"], a["deployment"]), STATE_FILE)
        recorded = (read_record(st_path) or {}).get("run_id")
        if recorded in (None, a["run_id"]):
            reason = "%s; its server was stopped (%s)" % (why, stopped or "nothing ran")
            change_status(st_path, FAILED, {"reason": reason}, recorded)
    except OSError:
        pass
    lock.release_now()


def stop_container(box: Any) -> str:
    """`stop` this attempt's container (fleet launched it: its id is the launch's), as words for the record."""
    if not isinstance(box, dict) or not box.get("id"):
        return ""
    cli = cli_path(str(box.get("cli")))
    if not cli:
        return ""
    code, _, err = run_cli([cli, "stop", "-t", "5", str(box["id"])], 60)
    return "container %s stopped; " % box.get("name") if code == 0 else "container stop failed: %s; " % err[-120:]


def stop_attempt_group(pgid: int, leader_ticks: Optional[int]) -> str:
    """SIGTERM, then SIGKILL after ATTEMPT_TERM_S, to the members of fleet's user in the attempt's group, listed
    again each round (a worker the engine forks while it stops is stopped too): how many there were.

    Only while the group is still the attempt's: a group's id is a pid, and once the attempt's group has
    ended (fleet frozen for 30 s after its exit) a new process may have it. What proves it is still the
    attempt's (signals.hold_same_group): its leader as launched (`leader_ticks`), then any member this
    stop held before; with its leader gone before the first round, nothing is stopped."""
    seen: Set[int] = set()
    read: Dict[int, Optional[int]] = {pgid: leader_ticks}
    kill_at = time.time() + ATTEMPT_TERM_S
    while time.time() < kill_at + ATTEMPT_TERM_S:
        members = hold_same_group(pgid, read, os.getuid())
        try:
            running = dict((pid, h) for pid, h in members.items() if h.alive())
            if not running:
                break
            read.update((pid, h.ticks) for pid, h in running.items())  # each proves the group's id next round
            late = time.time() >= kill_at
            for pid, h in running.items():
                if late or pid not in seen:
                    h.send(signal.SIGKILL if late else signal.SIGTERM)
                seen.add(pid)
        finally:
            release(members)
        time.sleep(0.1)
    return "%d processes" % len(seen)


def run() -> None:
    a = cast("WatchRequest", json.loads(sys.argv[1]))
    with run_lock(a) as lock:
        try:
            main(a, lock)
            if not OUT.drain(float(a.get("stalled_s", STALLED_S))) and OUT.pending:  # never read: fleet is frozen
                last = OUT.pending.decode("utf-8", "replace").rstrip().rsplit("\n", 1)[-1]
                if '"e": "timeout"' in last or '"e": "exit"' in last:
                    frozen_client(a, "the attempt ended (%s) while fleet read nothing" % last[:80], lock)
        except ClientGone:  # found by writing before the stdin watch saw it (a busy log)
            on_client_gone(a, lock)
        except Exception as exc:
            try:
                emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, exc)})
            except ClientGone:
                on_client_gone(a, lock)


if __name__ == "__main__":
    run()
