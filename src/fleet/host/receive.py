"""Runs ON the host a model is pushed to (`fleet pull --from`, for hosts without internet): the receiving
side of `host/send.py`, relayed by fleet. Everything comes on stdin:
  one JSON line   {"files": {name: {"size","mtime_ns","mode"}}, "marker": the source's fleet marker or null}
  then frames     as host/send.py writes them, ending with {"end": true}
Events, one JSON object per line (as the pull step's):
  {"e":"present","files":n,"bytes":n,"ours":bool}   already there: nothing is sent (ours: false, a
      directory fleet did not make, whose files have the source's sizes; it is never changed)
  {"e":"planned","files":n,"bytes":n,"have":n,"free":n,"commit":sha|null}
  {"e":"need","need":[[name, offset, size, mtime_ns], ...]}   what the source is to send (from offset)
  {"e":"progress","done":n,"total":n}     about once a second
  {"e":"pulled","files":n,"bytes":n,"sent":n,"checksums":n,"commit":..}
  {"e":"refused","kind":..,"why":..,"problems":[..],"stage":..}   kinds as the pull's, and "cut" (the
      stream ended early: what came whole is kept for the next push) and "source"
  {"e":"error","error":..}

As a pull, it writes into `<model>.fleet-partial/` and renames that to the model's path only once every
file has its listed size and the sha256 of the whole file the source read (the bytes an earlier push
left included), and the model's own files (config.json, safetensors headers) account for it.
`.fleet-push.json` in the partial holds the listing it was started for, `.fleet-push-done` the files
already proved, one name a line: a push cut midway resumes each file from the bytes it has, unless the
source's file changed since (size or mtime), which is then sent again from its start. A model fleet
pushed is "present" only while it holds the source's files as listed now, each as the source had it
when it was pushed (size and mtime, kept in its marker) and as fleet left it here (its own size and
mtime: a file changed in place since is sent again). Received files take the source's mtime, so a copy
pushed on from this host is known as the same. A Hub commit the source's marker names is kept as its
word only, never as this model's commit.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional, Set, Tuple, cast

try:  # host/pull.py (as a library) is prepended when this script is sent to a host
    MARKER  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.model_files import _json_file
    from fleet.host.pull import (
        DISK_MARGIN,
        MARKER,
        PARTIAL,
        PROGRESS_EVERY_S,
        PUSH_DONE,
        PUSH_RECORD,
        claim,
        drop_strays,
        emit,
        forget,
        free_bytes,
        ours,
        problems_in,
        refuse,
        seed,
        stamp,
        start_partial,
        swap_in,
        unsafe_names,
    )
    from fleet.transfer_protocol import CopyRequest, ListedFile

BLOCK = 1 << 20


class Cut(Exception):
    """The stream ended before the sender's end: fleet was stopped, or a connection was cut."""


def read_line(stdin: Any, limit: int) -> Dict[str, Any]:
    line = stdin.readline(limit)
    if len(line) >= limit and not line.endswith(b"\n"):
        raise LookupError("the source sent a line of more than %d bytes where a frame's header goes" % limit)
    if not line.endswith(b"\n"):
        raise Cut()
    data = json.loads(line.decode())
    if not isinstance(data, dict):
        raise ValueError("not a JSON object: %r" % line[:100])
    return data


def save_record(partial: str, files: Dict[str, ListedFile], done: Set[str]) -> None:
    """The listing (once per push) and the files already proved (appended to as each is: not rewritten)."""
    tmp = os.path.join(partial, PUSH_RECORD + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"files": files}, f)
    os.replace(tmp, os.path.join(partial, PUSH_RECORD))
    with open(os.path.join(partial, PUSH_DONE), "w") as f:
        f.writelines(json.dumps(n) + "\n" for n in sorted(done))


def mark_done(partial: str, name: str) -> None:
    with open(os.path.join(partial, PUSH_DONE), "a") as f:
        f.write(json.dumps(name) + "\n")


def read_done(partial: str) -> Set[str]:
    try:
        with open(os.path.join(partial, PUSH_DONE)) as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    done = set()
    for line in lines:
        try:
            name = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash: that file is proved again
        if isinstance(name, str):
            done.add(name)
    return done


def linked(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def named_in(problems: List[str], files: Dict[str, ListedFile]) -> List[str]:
    """The files a list of "NAME: what is wrong" lines names (a name may hold a colon)."""
    return [n for n in files if any(p.startswith(n + ": ") for p in problems)]


def unchanged_since(marker: Optional[Dict[str, Any]], files: Dict[str, ListedFile], target: str) -> Set[str]:
    """Files of fleet's model at `target` that may be kept: the source has them as it had them when fleet
    pushed them (size and mtime, kept in the marker), and they are here as fleet left them (their own size
    and mtime: a file changed in place since is sent again)."""
    then = (marker or {}).get("source_files")
    left = (marker or {}).get("verified")
    if not isinstance(then, dict) or not isinstance(left, dict):
        return set()
    out = set()
    for n, f in files.items():
        try:
            here = stamp(os.path.join(target, n))
        except OSError:
            continue
        if then.get(n) == [f["size"], f["mtime_ns"]] and left.get(n) == here:
            out.add(n)
    return out


def same_model(marker: Optional[Dict[str, Any]], files: Dict[str, ListedFile], target: str) -> bool:
    """fleet's model at `target` is the source's as listed now: the same files, none changed on either side."""
    then = (marker or {}).get("source_files")
    return isinstance(then, dict) and set(then) == set(files) and unchanged_since(marker, files, target) == set(files)


def plan(
    partial: str, target: str, files: Dict[str, ListedFile], marker: Optional[Dict[str, Any]], broken: List[str]
) -> Any:
    """What the source must send (name, offset, size, mtime), how many bytes are already here, and the
    files already proved. `broken`: files of fleet's model at `target` that are not whole (never kept).
    Every file to be sent from its start is removed here, before the new listing is recorded: no older
    bytes can later pass for its beginning."""
    record, _ = _json_file(os.path.join(partial, PUSH_RECORD))  # type: Any, Any
    earlier = record.get("files") if isinstance(record, dict) else None  # type: Any
    earlier = earlier if isinstance(earlier, dict) else {}
    done = set(n for n in read_done(partial) if earlier.get(n) == files.get(n))
    drop_strays(partial, files)
    if marker is not None:  # fleet's own copy there: what is whole and unchanged on both sides is kept
        kept = dict((n, files[n]) for n in unchanged_since(marker, files, target) if n not in broken)
        seed(partial, target, kept, [])
        done |= set(n for n in kept if linked(os.path.join(partial, n), os.path.join(target, n)))
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
        if earlier.get(name) == want and resumable and size is not None and size < want["size"]:
            offset = size
        else:
            offset = 0
            if os.path.lexists(full):
                os.remove(full)
        need.append([name, offset, want["size"], want["mtime_ns"]])
        have += offset
    return need, have, done


def inside(partial: str, name: str) -> str:
    """The path of `name` in the partial copy, its directories made; never through a link."""
    where = partial
    for part in name.split("/")[:-1]:
        where = os.path.join(where, part)
        if os.path.islink(where):
            raise LookupError("%s: a link inside the partial copy; fleet does not write through it" % name)
        if not os.path.isdir(where):
            os.mkdir(where)
    return os.path.join(partial, name)


def open_for(full: str, offset: int, mode: int) -> Tuple[int, Any]:
    """The file to write from `offset`, and a hash of its first `offset` bytes (kept from an earlier push):
    a new file is made (never an old one written into: it may be a link); a resumed one must still be
    there with those bytes."""
    h = hashlib.sha256()
    if offset == 0:
        if os.path.lexists(full):
            os.remove(full)
        return os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode), h
    try:
        fd = os.open(full, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        raise LookupError(
            "%s: the bytes kept from an earlier push are gone; push again" % os.path.basename(full)
        ) from None
    if os.fstat(fd).st_size < offset:
        os.close(fd)
        raise LookupError("%s: the bytes kept from an earlier push changed; push again" % os.path.basename(full))
    left = offset
    while left > 0:
        block = os.read(fd, min(BLOCK, left))
        if not block:  # cut shorter since it was measured
            os.close(fd)
            raise LookupError("%s: the bytes kept from an earlier push changed; push again" % os.path.basename(full))
        h.update(block)
        left -= len(block)
    os.ftruncate(fd, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return fd, h


def receive(stdin: Any, partial: str, files: Dict[str, ListedFile], need: List[List[Any]], have: int) -> Any:
    """Frames to files, each whole file checked against the source's sha256; (bytes received, files proved)."""
    expected = dict((n, (off, size)) for n, off, size, _ in need)
    total = sum(f["size"] for f in files.values())
    received = checked = 0
    last = time.monotonic()
    while True:
        head = read_line(stdin, 1 << 16)
        if head.get("end"):
            if expected:
                raise LookupError("the source ended without sending %s" % ", ".join(sorted(expected)[:5]))
            return received, checked
        if "error" in head:
            raise LookupError("the source: %s" % head["error"])
        name, offset, size = head.get("name"), head.get("offset"), head.get("size")
        if not isinstance(name, str) or not isinstance(offset, int) or not isinstance(size, int):
            raise LookupError("the source sent a frame fleet cannot read: %r" % str(head)[:200])
        if expected.get(name) != (offset, offset + size):
            raise LookupError("the source sent %r at %d, which was not asked for" % (name, offset))
        full = inside(partial, name)
        fd, h = open_for(full, offset, int(files[name].get("mode") or 0o644) & 0o666)
        try:
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
        mtime = files[name]["mtime_ns"]  # the source's: a copy pushed on from here is known as the same
        os.utime(full, ns=(mtime, mtime), follow_symlinks=False)
        trailer = read_line(stdin, 1 << 10)
        if trailer.get("sha256") != h.hexdigest():
            os.remove(full)  # sent again, whole, by the next push
            if "error" in trailer:  # it changed at the source while it was read
                raise LookupError(str(trailer["error"]))
            raise LookupError("%s: the file here is not the file the source read (sha256)" % name)
        checked += 1
        del expected[name]
        mark_done(partial, name)


def described(f: Any) -> bool:
    return isinstance(f, dict) and all(isinstance(f.get(k), int) and f[k] >= 0 for k in ("size", "mtime_ns"))


def main_receive(a: CopyRequest) -> None:
    stdin = sys.stdin.buffer
    target = os.path.expanduser(a["path"]).rstrip("/")
    partial = target + PARTIAL
    offer = read_line(stdin, 256 << 20)
    files = offer.get("files")  # type: Any
    source_marker = offer.get("marker")  # type: Any
    files = files if isinstance(files, dict) else {}
    source_marker = source_marker if isinstance(source_marker, dict) else {}
    unwritable = unsafe_names(files)
    if unwritable:
        why = "the source has files whose names fleet will not write (outside the model, a control character in them, or one of fleet's own)"
        return refuse("listing", why, unwritable[:20])
    undescribed = [n for n, f in files.items() if not described(f)]
    if undescribed:
        return refuse("listing", "the source lists files without a size and mtime", undescribed[:20])
    if not files:
        return refuse("source", "the source has no files for this model")
    commit = source_marker.get("commit")
    total = sum(f["size"] for f in files.values())
    guard = claim(target)
    if guard is None:
        return
    marker = ours(target)
    problems = []  # type: List[str]
    if os.path.isdir(target):
        problems, _ = problems_in(target, {n: {"size": f["size"]} for n, f in files.items()})
        if not problems and (marker is None or same_model(marker, files, target)):
            emit({"e": "present", "files": len(files), "bytes": total, "ours": marker is not None, "commit": commit})
            return
        if marker is None:
            why = "%s is there but not whole, and fleet did not make it (no %s in it): it is left as it is"
            return refuse("foreign", why % (target, MARKER), problems)
    start_partial(partial)
    need, have, done = plan(partial, target, files, marker, named_in(problems, files))
    save_record(partial, files, done)
    free = free_bytes(partial)
    emit({"e": "planned", "files": len(files), "bytes": total, "have": have, "free": free, "commit": commit})
    if total - have + DISK_MARGIN > free:
        why = "not enough disk: %d bytes to send, %d free at %s (and %d kept free); nothing sent"
        return refuse("disk", why % (total - have, free, os.path.dirname(target), DISK_MARGIN))
    emit({"e": "need", "need": need})
    try:
        received, checked = receive(stdin, partial, files, need, have)
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
        forget(partial, named_in(problems, files))
        return refuse("download", "what was received is not whole; it is not used", problems, stage="download")
    for name in (PUSH_RECORD, PUSH_DONE):
        os.remove(os.path.join(partial, name))
    # The source's Hub commit is its word only (its files may have changed since): kept as information,
    # never as this model's commit, which `fleet pull` would trust.
    said = {k: source_marker.get(k) for k in ("repo", "revision", "commit") if source_marker.get(k)}
    pushed = {
        "pushed_from": str(a.get("from") or ""),
        "pushed_at": time.time(),
        "source": said,
        "source_files": {n: [f["size"], f["mtime_ns"]] for n, f in files.items()},
        "verified": {n: stamp(os.path.join(partial, n)) for n in files},  # as fleet leaves them
    }
    swap_in(target, partial, pushed, False)
    emit({"e": "pulled", "files": len(files), "bytes": total, "sent": received, "checksums": checked, "commit": commit})


if __name__ == "__main__":
    try:
        main_receive(cast("CopyRequest", json.loads(sys.argv[1])))
    except Cut:  # fleet went before it sent its listing
        os._exit(3)
    except Exception as exc:  # the step always answers in its own words
        emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, str(exc)[:600])})
