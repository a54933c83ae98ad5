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

import fcntl
import json
import os
import re
import stat
import sys
import threading
import time
from typing import IO, Any, Dict, List, Optional, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    read_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.control.remote_container import cli_path, inspect
    from fleet.host_common import (
        LEARNED_FILE,
        base_url,
        deployment_dir,
        http_request,
        mark_unverified,
        read_record,
        release_lock,
        smoke_request,
        write_record,
    )

POLL_S = 0.02
HTTP_READY_EVERY_S = 1.0


class ClientGone(Exception):
    """fleet's end of the channel is closed: nobody reads what this watcher says any more."""


def emit(obj: Dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError) as exc:  # the pipe, or stdout already closed after it
        raise ClientGone() from exc


def alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def smoke(a: Dict[str, Any]) -> Dict[str, Any]:
    base = base_url(a["address"], a["port"])
    result = smoke_request(base, a["served_name"], a["smoke"], a["smoke"].get("timeout_s", 120))
    return {"e": "smoke", "ok": result["ok"], "status": result["status"], "text": result["text"]}


def lock_path(a: Dict[str, Any]) -> str:
    return os.path.join(deployment_dir(a["state_dir"], a["deployment"]), "lock.json")


def touch_lock(a: Dict[str, Any]) -> None:
    """Keep the run's lock fresh, naming this process as the one that holds it."""
    path = lock_path(a)
    try:
        lock = read_record(path) or {}
        if lock.get("run_id") == a["run_id"]:
            if lock.get("holder_pid") != os.getpid():
                lock["holder_pid"] = os.getpid()
                write_record(path, lock)
            else:
                os.utime(path)
    except (OSError, ValueError):
        pass


def on_success(a: Dict[str, Any]) -> None:
    state_dir = deployment_dir(a["state_dir"], a["deployment"])
    st_path = os.path.join(state_dir, "state.json")
    st = read_record(st_path) or {}
    st.update(a["success_state"])
    st["ready_at"] = time.time()
    write_record(st_path, st)
    if a.get("learned_key") and a["learned"]:
        root = os.path.expanduser(a["state_dir"])
        # the host's, shared by its deployments: merged under the host's guard, never dropped (another
        # deployment of the same model may have just learned what this one started without)
        with open(os.path.join(root, "lock.guard"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            lpath = os.path.join(root, LEARNED_FILE)
            learned = read_record(lpath) or {}
            kept = learned.get(a["learned_key"])
            entries = [e for e in kept if isinstance(e, dict)] if isinstance(kept, list) else []
            # what the engine said it picks itself is replaced by what it says now; fixes are kept
            told = [e for e in a["learned"] if e.get("signature") == "engine-picks"]
            entries = [e for e in entries if not (told and e.get("signature") == "engine-picks")]
            known = set(e.get("signature") for e in entries)
            learned[a["learned_key"]] = entries + [e for e in a["learned"] if e.get("signature") not in known]
            write_record(lpath, learned)
    if not a.get("hold"):  # a group's rank keeps its lock until the whole group is proven (see hold)
        release_lock(deployment_dir(a["state_dir"], a["deployment"]), a["run_id"])


def hold(a: Dict[str, Any], client_gone: threading.Event) -> None:
    """A group's rank, proven: keep its lock (touched, so it stays live) until fleet, having proven every
    rank, closes this command's stdin; say so every second, which is when fleet can end the stream."""
    try:
        while not client_gone.wait(1.0):
            touch_lock(a)
            emit({"e": "held"})
    except ClientGone:
        pass
    release_lock(deployment_dir(a["state_dir"], a["deployment"]), a["run_id"])


def reclaim(a: Dict[str, Any]) -> Optional[str]:
    """On a resumed watch (its connection was cut, so the last watcher let go): take the lock and the
    record back for this run; None, or why not (another run took the host meanwhile)."""
    path = lock_path(a)
    lock = read_record(path)
    if lock is not None and lock.get("run_id") != a["run_id"]:
        return "another fleet run (%s, %s) took the host while the connection was down" % (
            lock.get("owner"),
            lock.get("command"),
        )
    if lock is None:
        write_record(path, {"run_id": a["run_id"], "owner": a.get("owner"), "since": time.time(), "command": "deploy"})
    st_path = os.path.join(deployment_dir(a["state_dir"], a["deployment"]), "state.json")
    st = read_record(st_path) or {}
    if st.get("run_id") == a["run_id"] and st.get("status") == "unverified":
        st.update(status="starting", updated=time.time())
        st.pop("reason", None)
        write_record(st_path, st)
    return None


def on_client_gone(a: Dict[str, Any]) -> None:
    """fleet stopped listening before the server was proven: say so in the record, free the host."""
    try:
        mark_unverified(deployment_dir(a["state_dir"], a["deployment"]), a["run_id"])
    except OSError:
        pass
    release_lock(deployment_dir(a["state_dir"], a["deployment"]), a["run_id"])


def watch_client(a: Dict[str, Any]) -> threading.Event:
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


class LogFollower:
    """Reads new lines of the attempt's log from a byte offset; a log that is truncated, replaced or
    deleted is followed (offset reset, reported) instead of silently read from the wrong place."""

    TAIL = 64  # bytes before the offset remembered: a log cut and written again past the offset differs there

    def __init__(self, path: str, offset: int) -> None:
        self.path, self.offset, self.pending, self.missing = path, offset, b"", False
        self.inode: Optional[int] = None
        self.tail = b""

    def read(self) -> Tuple[List[Tuple[int, str]], List[Dict[str, Any]]]:
        """(complete lines as (end offset, text), events about the file)."""
        events: List[Dict[str, Any]] = []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO put in its place must not block
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode):
                    raise OSError("not a regular file")
                if self.inode is not None and st.st_ino != self.inode:
                    events.append({"e": "log_reset", "why": "replaced"})
                    self.offset, self.pending, self.tail = 0, b"", b""
                elif st.st_size < self.offset or not self._same_tail(f):
                    events.append({"e": "log_reset", "why": "truncated"})
                    self.offset, self.pending, self.tail = 0, b"", b""
                self.inode, self.missing = st.st_ino, False
                f.seek(self.offset)
                chunk = f.read(1 << 20)
        except OSError as exc:
            if not self.missing:
                why = "deleted" if isinstance(exc, FileNotFoundError) else "made unreadable (%s)" % exc
                events.append({"e": "log_reset", "why": why})
                self.missing = True
            return [], events
        return self._lines(chunk), events

    def _same_tail(self, f: IO[bytes]) -> bool:
        """Whether the bytes just before the offset are still those read there (a truncated log that was
        already written past the old offset again is longer, not shorter)."""
        if not self.tail:
            return True
        f.seek(self.offset - len(self.tail))
        return f.read(len(self.tail)) == self.tail

    def _lines(self, chunk: bytes, final: bool = False) -> List[Tuple[int, str]]:
        self.tail = (self.tail + chunk)[-self.TAIL :]
        base = self.offset - len(self.pending)
        self.offset += len(chunk)
        data = self.pending + chunk
        *whole, self.pending = data.split(b"\n")
        if final and self.pending:
            whole.append(self.pending)
            self.pending = b""
        out = []
        for raw in whole:
            base += len(raw) + 1
            out.append((min(base, self.offset), raw.decode("utf-8", "replace")))
        return out

    def rest(self) -> List[Tuple[int, str]]:
        """Every line left, the unterminated last one included (the process has ended)."""
        lines, _ = self.read()
        return lines + self._lines(b"", final=True)


def main(a: Dict[str, Any]) -> None:
    ready_re = re.compile(a["ready_regex"])
    log = LogFollower(a["log"], a["offset"])
    start = time.time()
    last_touch = last_http = 0.0
    last_progress = time.time()
    phase = "health" if a.get("ready_seen") else "starting"  # starting -> health -> done
    exit_file = a["exit_file"]
    health_deadline = time.time() + a["health_timeout_s"] if phase == "health" else None
    client_gone = watch_client(a)
    if a["offset"] or a.get("ready_seen"):
        lost = reclaim(a)
        if lost:
            emit({"e": "lost_lock", "why": lost})
            return
    while True:
        now = time.time()
        if client_gone.is_set():
            on_client_gone(a)
            return
        if now - last_touch > 2:
            touch_lock(a)
            last_touch = now
        lines, events = log.read()
        for ev in events:
            emit(ev)
        if lines:
            last_progress = now
            for end, text in lines:
                emit({"e": "line", "o": end, "t": text})
                if phase == "starting" and ready_re.search(text):
                    emit({"e": "ready_line"})
                    phase = "health"
                    health_deadline = time.time() + a["health_timeout_s"]
            continue
        if os.path.exists(exit_file) or not alive_group(a["pgid"]):
            time.sleep(0.05)  # let the last lines land
            for end, text in log.rest():
                emit({"e": "line", "o": end, "t": text})
            code = None
            try:
                with open(exit_file) as f:
                    code = int(f.read().strip() or -1)
            except (OSError, ValueError):
                pass
            ended: Dict[str, Any] = {"e": "exit", "code": code}
            box = a.get("container")
            if box:  # what the runtime saw: a container's memory limit kills without a word in the log
                cli = cli_path(str(box.get("cli")))
                seen = inspect(cli, str(box.get("id") or box.get("name"))) if cli else None
                if seen and seen.get("oom_killed"):
                    ended["oom_killed"] = True
            emit(ended)
            return
        if phase == "starting" and now - last_http >= HTTP_READY_EVERY_S:
            last_http = now
            status, _, _ = http_request("GET", base_url(a["address"], a["port"]) + "/health", timeout=2)
            if status == 200:  # both engines answer 503 until they can serve (engines.md 3.2, 6.3)
                emit({"e": "ready_http"})
                phase = "health"
                health_deadline = time.time() + a["health_timeout_s"]
        if phase == "health":
            status, _, _ = http_request("GET", base_url(a["address"], a["port"]) + "/health", timeout=5)
            if status == 200:
                emit({"e": "health", "code": 200})
                if not a["smoke"]:  # a group's other rank: it answers /health only; rank 0 is asked
                    on_success(a)
                    emit({"e": "done"})
                    if a.get("hold"):
                        hold(a, client_gone)
                    return
                result = smoke(a)
                if not result["ok"]:
                    time.sleep(a.get("settle_s", 1.0))  # a crash the request triggered reaches the log first
                    for end, text in log.read()[0]:
                        emit({"e": "line", "o": end, "t": text})
                    emit(result)
                    return
                for end, text in log.read()[0]:  # what the server logged up to its answer: its ready line
                    emit({"e": "line", "o": end, "t": text})
                emit(result)
                on_success(a)
                emit({"e": "done"})
                if a.get("hold"):
                    hold(a, client_gone)
                return
            if health_deadline is not None and time.time() > health_deadline:
                emit({"e": "timeout", "what": "health", "status": status})
                return
            time.sleep(0.2)
            continue
        if now - start > a["ready_timeout_s"]:
            emit({"e": "timeout", "what": "ready", "after_s": now - start})
            return
        if now - last_progress > a["progress_timeout_s"]:
            emit({"e": "timeout", "what": "progress", "after_s": now - last_progress})
            return
        time.sleep(POLL_S)


def run() -> None:
    a = json.loads(sys.argv[1])
    try:
        main(a)
    except ClientGone:  # found by writing before the stdin watch saw it (a busy log)
        on_client_gone(a)
    except Exception as exc:
        try:
            emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, exc)})
        except ClientGone:
            on_client_gone(a)


if __name__ == "__main__":
    run()
