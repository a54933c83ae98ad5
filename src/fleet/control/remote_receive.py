"""Runs ON the host a model is pushed to (`fleet pull --from`, for hosts without internet): the receiving
side of `remote_send.py`, relayed by fleet. Everything comes on stdin:
  one JSON line   {"files": {name: {"size","mtime_ns"}}, "marker": the source's fleet marker or null}
  then frames     as remote_send.py writes them, ending with {"end": true}
Events, one JSON object per line (as the pull step's):
  {"e":"present","files":n,"bytes":n}     already there and whole: nothing is sent
  {"e":"planned","files":n,"bytes":n,"have":n,"free":n,"commit":sha|null}
  {"e":"need","need":[[name, offset, size], ...]}   what the source is to send (offset: resumed there)
  {"e":"progress","done":n,"total":n}     about once a second
  {"e":"pulled","files":n,"bytes":n,"sent":n,"checksums":n,"commit":..}
  {"e":"refused","kind":..,"why":..,"problems":[..],"stage":..}   kinds as the pull's, and "cut" (the
      stream ended early: what came whole is kept for the next push) and "source"
  {"e":"error","error":..}

As a pull, it writes into `<model>.fleet-partial/` and renames that to the model's path only once every
file is there with its listed size, each frame's sha256 matches what the source read, and the model's own
files (config.json, safetensors headers) account for it. `.fleet-push.json` in the partial records the
listing it was started for and the files already checked, so a push cut midway resumes each file from the
bytes it has, unless the source's file changed since (size or mtime): then it starts again.
"""

import errno
import hashlib
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Set

try:  # remote_pull (as a library) is prepended when this script is sent to a host
    MARKER  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.control.remote_pull import (
        DISK_MARGIN,
        MARKER,
        PARTIAL,
        PARTIAL_MARK,
        PROGRESS_EVERY_S,
        claim,
        emit,
        forget,
        free_bytes,
        ours,
        problems_in,
        refuse,
        seed,
        start_partial,
        swap_in,
        unsafe_names,
    )
    from fleet.facts.model_files import _json_file

PUSH_RECORD = ".fleet-push.json"
BLOCK = 1 << 20


class Cut(Exception):
    """The stream ended before the sender's end: fleet was stopped, or a connection was cut."""


def read_line(stdin: Any, limit: int) -> Dict[str, Any]:
    line = stdin.readline(limit)
    if not line.endswith(b"\n"):
        raise Cut()
    data = json.loads(line.decode())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object: %r" % line[:100])
    return data


def save_record(partial: str, files: Dict[str, Any], done: Set[str]) -> None:
    tmp = os.path.join(partial, PUSH_RECORD + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files, "done": sorted(done)}, f)
    os.replace(tmp, os.path.join(partial, PUSH_RECORD))


def drop_strays(partial: str, files: Dict[str, Any]) -> None:
    """Files of an earlier try that this listing does not name (another layout, another source): removed."""
    keep = set(files) | {PARTIAL_MARK, PUSH_RECORD}
    for where, _dirs, names in os.walk(partial, topdown=False):
        rel = os.path.relpath(where, partial)
        for name in names:
            key = name if rel == "." else rel.replace(os.sep, "/") + "/" + name
            if key not in keep:
                os.remove(os.path.join(where, name))
        if rel != "." and not os.listdir(where):
            os.rmdir(where)


def linked(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def plan(partial: str, target: str, files: Dict[str, Any], marker: Optional[Dict[str, Any]], commit: Any) -> Any:
    """What the source must send (name, offset, size), how many bytes are already here, and the files done."""
    record, _ = _json_file(os.path.join(partial, PUSH_RECORD))  # type: Any, Any
    record = record if isinstance(record, dict) else {}
    earlier = record.get("files")  # type: Any
    earlier = earlier if isinstance(earlier, dict) else {}
    done = set(n for n in record.get("done") or [] if isinstance(n, str) and earlier.get(n) == files.get(n))
    if marker is not None and commit and marker.get("commit") == commit:  # a repair: whole files kept
        broken = [p.split(":")[0] for p in problems_in(target, {n: {"size": f["size"]} for n, f in files.items()})[0]]
        seed(partial, target, files, broken)
        done |= set(n for n in files if n not in broken and linked(os.path.join(partial, n), os.path.join(target, n)))
    drop_strays(partial, files)
    need = []  # type: List[List[Any]]
    have = 0
    for name, want in sorted(files.items()):
        full = os.path.join(partial, name)
        st = os.lstat(full) if os.path.isfile(full) and not os.path.islink(full) else None
        size = st.st_size if st is not None else None
        if name in done and size == want["size"]:
            have += want["size"]
            continue
        done.discard(name)
        resumable = st is not None and st.st_nlink == 1  # never written into: a link shares the model's file
        offset = size if earlier.get(name) == want and resumable and size is not None and size < want["size"] else 0
        need.append([name, offset, want["size"]])
        have += offset
    return need, have, done


def inside(partial: str, name: str) -> str:
    full = os.path.join(partial, name)
    parent = os.path.dirname(full)
    os.makedirs(parent, exist_ok=True)
    if not (os.path.realpath(parent) + os.sep).startswith(os.path.realpath(partial) + os.sep):
        raise ValueError("%s: a link inside the partial copy leads out of it" % name)
    return full


def receive(stdin: Any, partial: str, files: Dict[str, Any], need: List[List[Any]], done: Set[str], have: int) -> Any:
    """Frames to files, each checked against its sha256; returns (bytes received, frames checked)."""
    expected = dict((n, (off, size)) for n, off, size in need)
    total = sum(f["size"] for f in files.values())
    received = checked = 0
    last = time.monotonic()
    while True:
        head = read_line(stdin, 1 << 16)
        if head.get("end"):
            return received, checked
        if "error" in head:
            raise LookupError("the source: %s" % head["error"])
        name, offset, size = head.get("name"), head.get("offset"), head.get("size")
        if not isinstance(name, str) or not isinstance(offset, int) or not isinstance(size, int):
            raise LookupError("the source sent a frame fleet cannot read: %r" % str(head)[:200])
        if expected.get(name) != (offset, offset + size):
            raise LookupError("the source sent %r at %d, which was not asked for" % (name, offset))
        full = inside(partial, name)
        if offset == 0 and os.path.lexists(full):  # a new file, never the old one rewritten: it may be a link
            os.remove(full)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if offset == 0 else 0), 0o644)
        try:
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
            h = hashlib.sha256()
            left = size
            while left > 0:
                block = stdin.read(min(BLOCK, left))
                if not block:
                    raise Cut()
                h.update(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view) :]
                left -= len(block)
                received += len(block)
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    emit({"e": "progress", "done": min(total, have + received), "total": total})
            os.fsync(fd)
        finally:
            os.close(fd)
        trailer = read_line(stdin, 1 << 10)
        if trailer.get("sha256") != h.hexdigest():
            os.remove(full)
            raise LookupError("%s: the bytes written are not the bytes the source read (sha256)" % name)
        checked += 1
        del expected[name]
        done.add(name)
        save_record(partial, files, done)


def main_receive(a: Dict[str, Any]) -> None:
    stdin = sys.stdin.buffer
    target = os.path.expanduser(a["path"]).rstrip("/")
    partial = target + PARTIAL
    offer = read_line(stdin, 256 << 20)
    files = offer.get("files")  # type: Any
    source_marker = offer.get("marker")  # type: Any
    files = files if isinstance(files, dict) else {}
    source_marker = source_marker if isinstance(source_marker, dict) else {}
    bad = unsafe_names(files) + [
        n for n, f in files.items() if not isinstance(f, dict) or not isinstance(f.get("size"), int)
    ]
    if bad:
        return refuse(
            "listing", "the source lists files fleet will not write (outside the model, or no size)", bad[:20]
        )
    if not files:
        return refuse("source", "the source has no files for this model")
    commit = source_marker.get("commit")
    total = sum(f["size"] for f in files.values())
    guard = claim(target)
    if guard is None:
        return
    marker = ours(target)
    if os.path.isdir(target):
        problems, _ = problems_in(target, {n: {"size": f["size"]} for n, f in files.items()})
        if not problems and (marker is None or not commit or marker.get("commit") == commit):
            emit({"e": "present", "files": len(files), "bytes": total, "commit": marker and marker.get("commit")})
            return
        if marker is None:
            why = "%s is there but not whole, and fleet did not make it (no %s in it): it is left as it is"
            return refuse("foreign", why % (target, MARKER), problems)
    start_partial(partial)
    need, have, done = plan(partial, target, files, marker, commit)
    save_record(partial, files, done)
    free = free_bytes(partial)
    emit({"e": "planned", "files": len(files), "bytes": total, "have": have, "free": free, "commit": commit})
    if total - have + DISK_MARGIN > free:
        why = "not enough disk: %d bytes to send, %d free at %s (and %d kept free); nothing sent"
        return refuse("disk", why % (total - have, free, os.path.dirname(target), DISK_MARGIN))
    emit({"e": "need", "need": need})
    try:
        received, checked = receive(stdin, partial, files, need, done, have)
    except Cut:
        why = "the stream from the source ended midway; the files that came whole are kept for the next push"
        return refuse("cut", why, stage="download")
    except LookupError as exc:
        return refuse("source", str(exc), stage="download")
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            return refuse("disk", "the disk filled at %s: %s" % (partial, exc.strerror), stage="download")
        raise
    problems, _ = problems_in(partial, {n: {"size": f["size"]} for n, f in files.items()})
    if problems:
        forget(partial, [p.split(":")[0] for p in problems if p.split(":")[0] in files])
        return refuse("download", "what was received is not whole; it is not used", problems, stage="download")
    os.remove(os.path.join(partial, PUSH_RECORD))
    pushed = {k: source_marker.get(k) for k in ("repo", "revision", "commit") if source_marker.get(k)}
    swap_in(target, partial, dict(pushed, pushed_from=str(a.get("from") or ""), pushed_at=time.time()), False)
    emit({"e": "pulled", "files": len(files), "bytes": total, "sent": received, "checksums": checked, "commit": commit})


if __name__ == "__main__":
    try:
        main_receive(json.loads(sys.argv[1]))
    except Cut:  # fleet went before it sent its listing
        os._exit(3)
    except Exception as exc:  # the step always answers in its own words
        emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, str(exc)[:600])})
