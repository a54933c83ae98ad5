"""Runs ON the host that has the model (or on the control machine, for a local directory): the source side
of a push (`fleet pull --from`). Two uses, by `a["op"]`:

  list  prints one JSON document: every file of the model (size, mtime), whether it is whole (the same
        checks a pull makes, read from its own files), and fleet's marker if fleet made it.
  send  reads from stdin one JSON line, {"need": [[name, offset, size], ...]} (what the receiver lacks, and
        the size listed), and
        writes the frames that `remote_receive.py` reads, verbatim, to stdout:
          {"name":..,"offset":n,"size":n}\\n <size bytes> {"sha256":..}\\n    one per file still needed
          {"error":..}\\n                                                  a file changed since it was listed
          {"end":true}\\n
        The sha256 is of the bytes of that frame, so the receiver checks what it wrote against what was read.

Symlinks (a Hugging Face cache snapshot is made of them) are followed: the files' content is what is sent.
fleet's own files in the model directory (its marker, the client's `.cache/`) are not.
"""

import hashlib
import json
import os
import sys
from typing import Any, Dict, List

try:  # remote_pull (as a library) is prepended when this script is sent to a host
    MARKER  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.control.remote_pull import MARKER, ours, problems_in

SKIPPED = (MARKER, ".cache", ".fleet-partial-of-fleet", ".fleet-push.json")
BLOCK = 1 << 20


def model_files(path: str) -> Dict[str, Dict[str, Any]]:
    files = {}  # type: Dict[str, Dict[str, Any]]
    for where, dirs, names in os.walk(path, followlinks=True):
        rel = os.path.relpath(where, path)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in SKIPPED]
            names = [n for n in names if n not in SKIPPED]
        for name in names:
            full = os.path.join(where, name)
            try:
                st = os.stat(full)
            except OSError:
                continue  # a dangling link: not part of the model
            if os.path.isfile(full):
                key = name if rel == "." else rel.replace(os.sep, "/") + "/" + name
                files[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return files


def listing(path: str) -> Dict[str, Any]:
    if not os.path.isdir(path):
        return {"missing": True}
    files = model_files(path)
    problems, _ = problems_in(path, {n: {"size": f["size"]} for n, f in files.items()})
    return {"files": files, "problems": problems, "marker": ours(path)}


def send(path: str, need: List[List[Any]]) -> None:
    out = sys.stdout.buffer
    for name, offset, listed in need:
        full = os.path.join(path, name)
        try:
            f = open(full, "rb")  # noqa: SIM115 - closed below
        except OSError as exc:
            out.write(json.dumps({"error": "%s: %s" % (name, exc.strerror)}).encode() + b"\n")
            return
        with f:
            size = os.fstat(f.fileno()).st_size - offset
            if size + offset != listed:
                out.write(json.dumps({"error": "%s: changed since it was listed" % name}).encode() + b"\n")
                return
            out.write(json.dumps({"name": name, "offset": offset, "size": size}).encode() + b"\n")
            f.seek(offset)
            h = hashlib.sha256()
            left = size
            while left > 0:
                block = f.read(min(BLOCK, left))
                if not block:  # cut short while being read: the receiver sees the frame end early
                    sys.exit(4)
                h.update(block)
                out.write(block)
                left -= len(block)
            out.write(json.dumps({"sha256": h.hexdigest()}).encode() + b"\n")
    out.write(b'{"end": true}\n')
    out.flush()


def main_send(a: Dict[str, Any]) -> None:
    path = os.path.expanduser(a["path"]).rstrip("/")
    if a["op"] == "list":
        sys.stdout.write(json.dumps(listing(path)))
        return
    line = sys.stdin.buffer.readline()
    send(path, json.loads(line.decode())["need"])


if __name__ == "__main__":
    try:
        main_send(json.loads(sys.argv[1]))
    except BrokenPipeError:  # the receiver or fleet went away: nothing to tell
        os._exit(3)
    except Exception as exc:  # the step always answers in its own words
        sys.stdout.write(json.dumps({"error": "%s: %s" % (type(exc).__name__, str(exc)[:600])}) + "\n")
