"""Runs ON the host that has the model (or on the control machine, for a local directory): the source side
of a push (`fleet pull --from`). Two uses, by `a["op"]`:

  list  prints one JSON document: every file of the model (size, mtime, mode), whether it is whole (the
        same checks a pull makes, read from its own files, and no link that leads nowhere or to a
        directory), and fleet's marker if fleet made it.
  send  reads from stdin one JSON line, {"need": [[name, offset, size, mtime_ns], ...]} (what the receiver
        lacks, and the file as it was listed), and writes the frames that `host/receive.py` reads,
        verbatim, to stdout:
          {"name":..,"offset":n,"size":n}\\n <size bytes> {"sha256":..}\\n   one per file still needed
          {"error":..}\\n                                                 at a frame's end: it changed
          {"end":true}\\n
        The sha256 is of the whole file as read now (its first `offset` bytes too, read here and not
        sent), so the receiver proves the whole file it holds, including bytes an earlier push left.
        A file whose size or mtime is not the listed one, before or after it is read, is an error: the
        receiver never keeps a copy the source never held. Anything going wrong midway goes to stderr
        and ends the step: the receiver sees the stream end, never text among a file's bytes.

A file that is a symlink (a Hugging Face cache snapshot is made of them) is sent with its target's
content only when the target lies inside the model: the directory itself or, for a snapshot of the
Hugging Face cache (`models--ORG--NAME/snapshots/REV`), that repository's folder (its `blobs/`). A link
that leads anywhere else (an SSH key, a 0600 file of the operator's) is refused, not read. A link to a
directory is not followed (it could lead anywhere, or to itself), and fleet's own files in the model
directory (its marker, the client's `.cache/`) are not sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from typing import Any, Dict, List, Mapping, Tuple, cast

try:  # host/pull.py (as a library) is prepended when this script is sent to a host
    FLEET_FILES  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.pull import FLEET_FILES, ours, problems_in
    from fleet.transfer_protocol import CopyRequest, ListedFile

SKIPPED = FLEET_FILES  # fleet's own files in a model directory: never sent
BLOCK = 1 << 20


def model_roots(path: str) -> List[str]:
    """Where a link of the model may lead: the directory, and a cache snapshot's repository folder."""
    real = os.path.realpath(path)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots" and os.path.basename(os.path.dirname(parent)).startswith("models--"):
        roots.append(os.path.dirname(parent))
    return roots


def inside(target: str, roots: List[str]) -> bool:
    return any(target == r or target.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def model_files(path: str) -> Tuple[Dict[str, ListedFile], List[str]]:
    """Every file, by its name under `path`; and what keeps the directory from being sent as it is."""
    files = {}  # type: Dict[str, ListedFile]
    problems = []  # type: List[str]
    roots = model_roots(path)
    for where, dirs, names in os.walk(path):
        rel = os.path.relpath(where, path)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in SKIPPED]
            names = [n for n in names if n not in SKIPPED]
        for d in dirs:
            if os.path.islink(os.path.join(where, d)):
                problems.append("%s%s: a link to a directory; fleet does not follow it" % (prefix, d))
        for name in names:
            full = os.path.join(where, name)
            try:
                st = os.stat(full)
            except OSError:
                problems.append("%s%s: a link to nothing" % (prefix, name))
                continue
            if os.path.islink(full) and not inside(os.path.realpath(full), roots):
                problems.append(
                    "%s%s: a link leading out of the model directory; fleet does not follow it" % (prefix, name)
                )
                continue
            if stat.S_ISREG(st.st_mode):
                files[prefix + name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "mode": st.st_mode & 0o777}
            elif not stat.S_ISDIR(st.st_mode):
                problems.append("%s%s: not a regular file" % (prefix, name))
    return files, problems


def listing(path: str) -> Dict[str, Any]:
    if not os.path.isdir(path):
        return {"missing": True}
    files, problems = model_files(path)
    if files:
        problems += problems_in(path, {n: {"size": f["size"]} for n, f in files.items()})[0]
    return {"files": files, "problems": problems[:20], "marker": ours(path)}


def as_listed(f: Any, size: int, mtime_ns: int) -> bool:
    st = os.fstat(f.fileno())
    return st.st_size == size and st.st_mtime_ns == mtime_ns


def read_into(f: Any, h: Any, count: int, out: Any) -> None:
    """`count` bytes of `f` into the hash (and to `out`, when given)."""
    while count > 0:
        block = f.read(min(BLOCK, count))
        if not block:
            raise OSError("%s: cut short while it was read" % f.name)
        h.update(block)
        if out is not None:
            out.write(block)
        count -= len(block)


def say(out: Any, line: Mapping[str, object]) -> None:
    """One line of the stream between frames' bytes: a header, a trailer, an error, the end."""
    out.write(json.dumps(line).encode() + b"\n")


def send(path: str, need: List[List[Any]]) -> None:
    out = sys.stdout.buffer
    mine = model_files(path)[0]  # only what this side lists is ever read: the receiver's word is not enough
    for name, offset, size, mtime_ns in need:
        if name not in mine:
            say(out, {"error": "%r is not a file of this model" % str(name)[:200]})
            return
        if not inside(os.path.realpath(os.path.join(path, name)), model_roots(path)):  # a link swapped since
            say(out, {"error": "%r now leads out of the model directory" % str(name)[:200]})
            return
        try:
            f = open(os.path.join(path, name), "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            say(out, {"error": "%s: %s" % (name, exc.strerror)})
            return
        with f:
            if not as_listed(f, size, mtime_ns):
                say(out, {"error": "%s: changed since it was listed" % name})
                return
            h = hashlib.sha256()
            read_into(f, h, offset, None)  # the bytes the receiver kept: hashed here, not sent
            say(out, {"name": name, "offset": offset, "size": size - offset})
            read_into(f, h, size - offset, out)
            ok = as_listed(f, size, mtime_ns)
        trailer = {"sha256": h.hexdigest()} if ok else {"error": "%s: changed while it was read" % name}
        say(out, trailer)
        if not ok:
            return
    say(out, {"end": True})
    out.flush()


def main_send(a: CopyRequest) -> None:
    path = os.path.expanduser(a["path"]).rstrip("/")
    if a["op"] == "list":
        sys.stdout.write(json.dumps(listing(path)))
        return
    line = sys.stdin.buffer.readline()
    send(path, json.loads(line.decode())["need"])


if __name__ == "__main__":
    try:
        main_send(cast("CopyRequest", json.loads(sys.argv[1])))
    except BrokenPipeError:  # the receiver or fleet went away: nothing to tell
        os._exit(3)
    except Exception as exc:  # noqa: BLE001 - never on stdout: it may be in the middle of a file's bytes
        sys.stderr.write("%s: %s\n" % (type(exc).__name__, str(exc)[:600]))
        sys.stderr.flush()
        os._exit(4)
