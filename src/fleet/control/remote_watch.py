"""Runs ON the host (sent as `python -c`): follow one launch attempt and report as JSON lines.

Streams the attempt's log from a byte offset as it is written (no re-reading, no fixed sleeps),
follows the process, and once the ready line appears proves the server: `/health` 200, then a real
generation of the smoke prompt whose answer must match. Events, one JSON object per line:
  {"e":"line","o":<offset after>,"t":<text>}   {"e":"ready_line"}   {"e":"health","code":200}
  {"e":"smoke","ok":bool,"status":..,"text":..}   {"e":"exit","code":..}   {"e":"timeout","what":..}
  {"e":"done"}
On success it writes the deployment state and learned fixes fleet handed it, and releases the lock,
so a successful deploy needs no further round trip. While it runs it keeps the lock's lease fresh.
"""

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

try:  # the shared host code is prepended when this script is sent to a host
    read_record  # noqa: B018
except NameError:  # imported as a module (fleet's own tests)
    from fleet.host_common import read_record

POLL_S = 0.02


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def alive_group(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def http(method, url, body=None, timeout=10.0, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers=dict({"Content-Type": "application/json"}, **(headers or {}))
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except Exception as e:  # connection refused/reset, timeout
        return None, "%s: %s" % (type(e).__name__, e)


def smoke(a):
    s = a["smoke"]
    base = "http://%s:%d" % (a["address"], a["port"])
    status, text = http(
        "POST",
        base + "/v1/chat/completions",
        {
            "model": a["served_name"],
            "messages": [{"role": "user", "content": s["prompt"]}],
            "max_tokens": s["max_tokens"],
            "temperature": 0,
        },
        timeout=s.get("timeout_s", 120),
    )
    answer = None
    if status == 200:
        try:
            answer = json.loads(text)["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            answer = None
    ok = answer is not None and re.search(s["expect"], answer) is not None
    return {"e": "smoke", "ok": ok, "status": status, "text": (answer if answer is not None else text)[:500]}


def touch_lock(a):
    """Keep the run's lock fresh, naming this process as the one that holds it."""
    path = os.path.join(os.path.expanduser(a["state_dir"]), "lock.json")
    try:
        lock = read_record(path) or {}
        if lock.get("run_id") == a["run_id"]:
            if lock.get("holder_pid") != os.getpid():
                lock["holder_pid"] = os.getpid()
                write_json(path, lock)
            else:
                os.utime(path)
    except (OSError, ValueError):
        pass


def write_json(path, data):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def on_success(a):
    state_dir = os.path.expanduser(a["state_dir"])
    st_path = os.path.join(state_dir, "state.json")
    st = read_record(st_path) or {}
    st.update(a["success_state"])
    st["ready_at"] = time.time()
    write_json(st_path, st)
    if a.get("learned_key"):
        lpath = os.path.join(state_dir, "learned.json")
        learned = read_record(lpath) or {}
        if a["learned"]:
            learned[a["learned_key"]] = a["learned"]
        else:
            learned.pop(a["learned_key"], None)
        write_json(lpath, learned)
    lock = os.path.join(state_dir, "lock.json")
    try:
        if (read_record(lock) or {}).get("run_id") == a["run_id"]:
            os.unlink(lock)
    except OSError:
        pass


def main():
    a = json.loads(sys.argv[1])
    ready_re = re.compile(a["ready_regex"])
    offset = a["offset"]
    start = time.time()
    last_progress = time.time()
    last_touch = 0.0
    pending = b""
    phase = "health" if a.get("ready_seen") else "starting"  # starting -> health -> done
    exit_file = a["exit_file"]
    health_deadline = time.time() + a["health_timeout_s"] if phase == "health" else None
    while True:
        now = time.time()
        if now - last_touch > 2:
            touch_lock(a)
            last_touch = now
        try:
            with open(a["log"], "rb") as f:
                f.seek(offset)
                chunk = f.read(1 << 20)
        except OSError:
            chunk = b""
        if chunk:
            last_progress = now
            pending += chunk
            offset += len(chunk)
            *lines, pending = pending.split(b"\n")
            consumed = offset - len(pending)
            for raw in lines:
                text = raw.decode("utf-8", "replace")
                emit({"e": "line", "o": consumed, "t": text})
                if phase == "starting" and ready_re.search(text):
                    emit({"e": "ready_line"})
                    phase = "health"
                    health_deadline = time.time() + a["health_timeout_s"]
            continue
        if os.path.exists(exit_file) or not alive_group(a["pgid"]):
            time.sleep(0.05)  # let the last lines land
            try:
                with open(a["log"], "rb") as f:
                    f.seek(offset)
                    rest = pending + f.read()
            except OSError:
                rest = pending
            for raw in rest.split(b"\n"):
                if raw:
                    offset += len(raw) + 1
                    emit({"e": "line", "o": offset, "t": raw.decode("utf-8", "replace")})
            code = None
            try:
                with open(exit_file) as f:
                    code = int(f.read().strip() or -1)
            except (OSError, ValueError):
                pass
            emit({"e": "exit", "code": code})
            return
        if phase == "health":
            status, _ = http("GET", "http://%s:%d/health" % (a["address"], a["port"]), timeout=5)
            if status == 200:
                emit({"e": "health", "code": 200})
                result = smoke(a)
                if not result["ok"]:
                    time.sleep(a.get("settle_s", 1.0))  # a crash the request triggered reaches the log first
                    try:
                        with open(a["log"], "rb") as f:
                            f.seek(offset)
                            tail = f.read()
                    except OSError:
                        tail = b""
                    for raw in tail.split(b"\n"):
                        if raw:
                            offset += len(raw) + 1
                            emit({"e": "line", "o": offset, "t": raw.decode("utf-8", "replace")})
                    emit(result)
                    return
                emit(result)
                on_success(a)
                emit({"e": "done"})
                return
            if time.time() > health_deadline:
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


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:
        emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, exc)})
