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
import signal
import stat
import sys
import threading
import time
from typing import IO, Any, Dict, List, Optional, Set, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    read_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.control.remote_container import cli_path, inspect, run_cli
    from fleet.control.remote_startup import StartupWatch
    from fleet.host_common import (
        LEARNED_FILE,
        LOCK_FILE,
        STATE_FILE,
        base_url,
        deployment_dir,
        first_line_of_stdin,
        host_guard,
        http_request,
        mark_unverified,
        read_record,
        release_lock,
        smoke_request,
        write_record,
    )
    from fleet.host_signals import hold_group, release

POLL_S = 0.02
HTTP_READY_EVERY_S = 1.0
LINE_LIMIT = 16 << 10  # bytes of one log line sent (a 300 MB line of a config dump is cut, not carried)
OUT_LIMIT = 4 << 20  # bytes of log lines waiting for fleet to read them: past it, lines are dropped and counted
ATTEMPT_TERM_S = 5.0  # a frozen fleet's attempt: SIGTERM, this long, SIGKILL
STALLED_S = 30.0  # fleet read nothing for this long while output waited: it is frozen (stopped, swapped out)


class ClientGone(Exception):
    """fleet's end of the channel is closed: nobody reads what this watcher says any more."""


class Output:
    """This watcher's stdout, never blocking: a fleet that stops reading (frozen with SIGSTOP, a stalled
    connection) must not stop the watcher, which keeps the deadlines and the lock. Log lines beyond
    OUT_LIMIT waiting are dropped and counted (said in a `skipped` event); every other event is kept."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.lines_held = 0  # bytes of log lines in `pending`
        self.skipped = 0
        self.last_write = time.time()
        self.nonblocking = False

    def _nonblocking(self) -> None:
        if not self.nonblocking:
            try:
                fd = sys.stdout.fileno()
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
            except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
                pass
            self.nonblocking = True

    def emit(self, obj: Dict[str, Any]) -> None:
        self._nonblocking()
        line = obj.get("e") == "line"
        if line and self.lines_held > OUT_LIMIT:
            self.skipped += 1
            return
        if self.skipped and not line:
            self.pending += (json.dumps({"e": "skipped", "lines": self.skipped}) + "\n").encode()
            self.skipped = 0
        data = (json.dumps(obj) + "\n").encode()
        self.pending += data
        if line:
            self.lines_held += len(data)
        self.flush()

    def flush(self) -> None:
        try:
            fd = sys.stdout.fileno()
        except (ValueError, AttributeError):  # a test's capture: written through, no descriptor
            sys.stdout.write(self.pending.decode())
            sys.stdout.flush()
            self.pending, self.lines_held = bytearray(), 0
            return
        while self.pending:
            try:
                n = os.write(fd, bytes(self.pending[: 1 << 16]))
            except BlockingIOError:
                return
            except (BrokenPipeError, OSError) as exc:
                raise ClientGone() from exc
            del self.pending[:n]
            self.lines_held = max(0, self.lines_held - n)
            self.last_write = time.time()
        self.last_write = time.time()

    def stalled(self, after_s: float = STALLED_S) -> bool:
        """Output has waited `after_s` with nothing read: fleet is not listening, though it is connected."""
        return bool(self.pending) and time.time() - self.last_write > after_s

    def drain(self, timeout_s: float) -> bool:
        """Wait (up to timeout_s) until fleet has read everything; False when it did not."""
        deadline = time.time() + timeout_s
        while self.pending and time.time() < deadline:
            self.flush()
            time.sleep(0.05)
        return not self.pending


OUT = Output()


def emit(obj: Dict[str, Any]) -> None:
    OUT.emit(obj)


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
    result = smoke_request(base, a["served_name"], a["smoke"], a["smoke"].get("timeout_s", 120), a.get("_api_key"))
    return {"e": "smoke", "ok": result["ok"], "status": result["status"], "text": result["text"]}


def lock_path(a: Dict[str, Any]) -> str:
    return os.path.join(deployment_dir(a["state_dir"], a["deployment"]), LOCK_FILE)


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
    st_path = os.path.join(state_dir, STATE_FILE)
    st = read_record(st_path) or {}
    st.update(a["success_state"])
    st["ready_at"] = time.time()
    write_record(st_path, st)
    if a.get("learned_key") and a["learned"]:
        root = os.path.expanduser(a["state_dir"])
        # the host's, shared by its deployments: merged under the host's guard, never dropped (another
        # deployment of the same model may have just learned what this one started without)
        with host_guard(root):
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
    st_path = os.path.join(deployment_dir(a["state_dir"], a["deployment"]), STATE_FILE)
    st = read_record(st_path) or {}
    if st.get("run_id") == a["run_id"] and st.get("status") == "failed":  # the host gave up on this run
        return "the host stopped this run's server: %s" % st.get("reason", "failed")
    if lock is None:
        write_record(path, {"run_id": a["run_id"], "owner": a.get("owner"), "since": time.time(), "command": "deploy"})
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
        self.cut = 0  # bytes of the unterminated line past LINE_LIMIT, skipped
        self.inode: Optional[int] = None
        self.tail = b""
        self.redraws = 0  # carriage returns seen in the unterminated line (a progress bar redrawing itself)

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
                    self.offset, self.pending, self.tail, self.cut = 0, b"", b"", 0
                elif st.st_size < self.offset or not self._same_tail(f):
                    events.append({"e": "log_reset", "why": "truncated"})
                    self.offset, self.pending, self.tail, self.cut = 0, b"", b"", 0
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
        """Whole lines, each cut to LINE_LIMIT bytes; a line without an end is held only up to LINE_LIMIT
        (what comes after, to its end, is skipped: a 300 MB line costs no memory here or in fleet)."""
        self.tail = (self.tail + chunk)[-self.TAIL :]
        base = self.offset - len(self.pending) - self.cut
        self.offset += len(chunk)
        data = self.pending + chunk
        *whole, rest = data.split(b"\n")
        out = []
        for i, raw in enumerate(whole):
            size = len(raw) + (self.cut if i == 0 else 0)
            base += size + 1
            text = raw[:LINE_LIMIT].decode("utf-8", "replace")
            if size > LINE_LIMIT:
                text += " [fleet: %d more bytes of this line not shown]" % (size - LINE_LIMIT)
            out.append((min(base, self.offset), text))
        if whole:
            self.cut, self.redraws = 0, 0
        if len(rest) > LINE_LIMIT:
            self.cut += len(rest) - LINE_LIMIT
            rest = rest[:LINE_LIMIT]
        self.pending = rest
        if final and self.pending:
            out.append((self.offset, self.pending.decode("utf-8", "replace")))
            self.pending, self.cut = b"", 0
        return out

    def redrawn(self) -> Optional[str]:
        """The last whole redraw of a progress bar in the line not yet ended, when it redrew since the last
        call; else None. tqdm, writing to a file, ends its line only when the bar closes: a 5-minute load
        is one line, and without this the watcher would see neither its progress nor that it moves."""
        redraws = self.pending.count(b"\r")
        if redraws <= self.redraws:
            return None
        self.redraws = redraws
        whole = [part for part in self.pending.split(b"\r")[:-1] if part.strip()]  # the last may be half written
        return whole[-1].decode("utf-8", "replace") if whole else None

    def rest(self) -> List[Tuple[int, str]]:
        """Every line left, the unterminated last one included (the process has ended)."""
        lines, _ = self.read()
        return lines + self._lines(b"", final=True)


def main(a: Dict[str, Any]) -> None:
    ready_re = re.compile(a["ready_regex"])
    log = LogFollower(a["log"], a["offset"])
    start = time.time()
    startup = StartupWatch(a, start)  # phases, ETA and stalls, from the engine's own lines
    last_touch = last_http = 0.0
    last_progress = time.time()
    phase = "health" if a.get("ready_seen") else "starting"  # starting -> health -> done
    exit_file = a["exit_file"]
    health_deadline = time.time() + a["health_timeout_s"] if phase == "health" else None
    if a.get("key_on_stdin"):  # the engine's API key, for the smoke request: never on a command line
        a["_api_key"] = first_line_of_stdin().get("api_key")
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
        OUT.flush()
        stalled_s = float(a.get("stalled_s", STALLED_S))
        if OUT.stalled(stalled_s):  # connected, but reading nothing: fleet is frozen; the watcher keeps bounds
            return frozen_client(a, "fleet read nothing of this watcher's output for %gs" % stalled_s)
        if phase == "starting" and now - start > a["ready_timeout_s"]:  # also while a log floods
            startup.record("timeout", now)
            emit({"e": "timeout", "what": "ready", "after_s": now - start})
            return
        stall = startup.stalled(now) if phase == "starting" else None
        if stall is not None and stall["e"] == "stalled":  # the playbook waits through stalls: said only
            emit(stall)
        elif stall is not None:  # a phase quiet past its bound: the attempt ends now, not at the ready timeout
            startup.record("stalled", now)
            emit(stall)
            return
        lines, events = log.read()
        for ev in events:
            emit(ev)
        redrawn = log.redrawn()  # a bar redrawn in a line not yet ended (after the lines it follows)
        for end, text in lines:
            emit({"e": "line", "o": end, "t": text})
            said = startup.line(text, now) if phase == "starting" else None
            if said is not None:
                emit(said)
            if phase == "starting" and ready_re.search(text):
                startup.ready(now)
                emit({"e": "ready_line"})
                phase = "health"
                health_deadline = time.time() + a["health_timeout_s"]
        said = startup.line(redrawn, now) if redrawn is not None and phase == "starting" else None
        if said is not None:
            emit(said)
        if lines or redrawn is not None:  # progress: read on at once
            last_progress = now
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
            startup.record("exited", now)
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
                startup.ready(now)
                emit({"e": "ready_http"})
                phase = "health"
                health_deadline = time.time() + a["health_timeout_s"]
        if phase == "health":
            status, _, _ = http_request("GET", base_url(a["address"], a["port"]) + "/health", timeout=5)
            if status == 200:
                emit({"e": "health", "code": 200})
                if not a["smoke"]:  # a group's other rank: it answers /health only; rank 0 is asked
                    a["success_state"]["startup"] = startup.record("ready", now)
                    on_success(a)
                    emit({"e": "done"})
                    if a.get("hold"):
                        hold(a, client_gone)
                    return
                result = smoke(a)
                if not result["ok"]:
                    startup.record("smoke_failed", now)
                    time.sleep(a.get("settle_s", 1.0))  # a crash the request triggered reaches the log first
                    for end, text in log.read()[0]:
                        emit({"e": "line", "o": end, "t": text})
                    emit(result)
                    return
                for end, text in log.read()[0]:  # what the server logged up to its answer: its ready line
                    emit({"e": "line", "o": end, "t": text})
                emit(result)
                a["success_state"]["startup"] = startup.record("ready", now)
                on_success(a)
                emit({"e": "done"})
                if a.get("hold"):
                    hold(a, client_gone)
                return
            if health_deadline is not None and time.time() > health_deadline:
                startup.record("health_timeout", now)
                emit({"e": "timeout", "what": "health", "status": status})
                return
            time.sleep(0.2)
            continue
        if now - start > a["ready_timeout_s"]:
            startup.record("timeout", now)
            emit({"e": "timeout", "what": "ready", "after_s": now - start})
            return
        if now - last_progress > a["progress_timeout_s"]:
            startup.record("timeout", now)
            emit({"e": "timeout", "what": "progress", "after_s": now - last_progress})
            return
        time.sleep(POLL_S)


def frozen_client(a: Dict[str, Any], why: str) -> None:
    """fleet is connected but reads nothing (stopped with SIGSTOP, swapped out): waiting for it would hold
    the host's lock and leave an engine running that nobody proves. The attempt's server is stopped (its
    container through its runtime: a rootful engine is not fleet's user's to signal; its group, held member
    by member, this user's only), recorded as failed, and the lock released."""
    stopped = stop_container(a.get("container")) + stop_attempt_group(a["pgid"])
    try:
        st_path = os.path.join(deployment_dir(a["state_dir"], a["deployment"]), STATE_FILE)
        st = read_record(st_path) or {}
        if st.get("run_id") in (None, a["run_id"]):
            st.update(status="failed", reason="%s; its server was stopped (%s)" % (why, stopped or "nothing ran"))
            st["updated"] = time.time()
            write_record(st_path, st)
    except OSError:
        pass
    release_lock(deployment_dir(a["state_dir"], a["deployment"]), a["run_id"])


def stop_container(box: Any) -> str:
    """`stop` this attempt's container (fleet launched it: its id is the launch's), as words for the record."""
    if not isinstance(box, dict) or not box.get("id"):
        return ""
    cli = cli_path(str(box.get("cli")))
    if not cli:
        return ""
    code, _, err = run_cli([cli, "stop", "-t", "5", str(box["id"])], 60)
    return "container %s stopped; " % box.get("name") if code == 0 else "container stop failed: %s; " % err[-120:]


def stop_attempt_group(pgid: int) -> str:
    """SIGTERM, then SIGKILL after ATTEMPT_TERM_S, to the members of fleet's user in the attempt's group, listed
    again each round (a worker the engine forks while it stops is stopped too): how many there were."""
    seen: Set[int] = set()
    kill_at = time.time() + ATTEMPT_TERM_S
    while time.time() < kill_at + ATTEMPT_TERM_S:
        members = hold_group(pgid, os.getuid())
        try:
            running = dict((pid, h) for pid, h in members.items() if h.alive())
            if not running:
                break
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
    a = json.loads(sys.argv[1])
    try:
        main(a)
        if not OUT.drain(float(a.get("stalled_s", STALLED_S))) and OUT.pending:  # never read: fleet is frozen
            last = OUT.pending.decode("utf-8", "replace").rstrip().rsplit("\n", 1)[-1]
            if '"e": "timeout"' in last or '"e": "exit"' in last:
                frozen_client(a, "the attempt ended (%s) while fleet read nothing" % last[:80])
    except ClientGone:  # found by writing before the stdin watch saw it (a busy log)
        on_client_gone(a)
    except Exception as exc:
        try:
            emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, exc)})
        except ClientGone:
            on_client_gone(a)


if __name__ == "__main__":
    run()
