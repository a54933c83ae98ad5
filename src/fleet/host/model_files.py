"""Runs ON the host, before the probe and the pull/push steps: whether a model directory is whole, read
from its own files (config.json, the safetensors index and each file's header) without reading the
weights. Standard library only, Python >= 3.8: shipped as text with the shared host code."""

from __future__ import annotations

import json
import os
import stat
from typing import Any, List, Optional, Tuple

try:  # the shared host code is prepended when this script is sent to a host
    read_text  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.procs import read_text


def _json_file(path: str, limit: int = 4 << 20) -> Tuple[Any, Optional[str]]:
    text = read_text(path, limit)
    if text is None:
        return None, None
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, "%s: %s" % (path, exc)


SAFETENSORS_MAX_HEADER = 100 << 20  # the format's own limit on its JSON header


def _damage(path: str, weight_map: Any) -> List[str]:
    """What is not whole in a model directory, file by file, without reading the weights: a weight file the
    index names that is missing, a safetensors file shorter (or longer) than its own header says -- a cut
    download or a disk that filled -- and a download left unfinished (*.incomplete)."""
    names = set(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if isinstance(weight_map, dict):
        names |= set(v for v in weight_map.values() if isinstance(v, str))
    out = []  # type: List[str]
    for name in sorted(names):
        if os.path.isabs(name) or ".." in name.split("/"):
            out.append("%s: named by the index outside the model directory" % name)
            continue
        problem = _safetensors_problem(os.path.join(path, name))
        if problem:
            out.append("%s: %s" % (name, problem))
        if len(out) >= 20:
            break
    for where, _dirs, files in os.walk(path):
        if where.count(os.sep) - path.count(os.sep) > 4:
            continue
        for name in files:
            if name.endswith(".incomplete"):
                out.append("%s: an unfinished download" % os.path.relpath(os.path.join(where, name), path))
    return out[:20]


def _safetensors_problem(file_path: str) -> Optional[str]:
    """What is wrong with one safetensors file, or None. Only a regular file is read, never waiting (a FIFO
    named like a shard would hang the step), and nothing read from it is quoted: a link to another file (a
    secret) must not show its first bytes as a "header length"."""
    try:
        with os.fdopen(os.open(file_path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return "not a regular file"
            size = st.st_size
            head = f.read(8)
            if len(head) < 8:
                return "truncated: %d bytes, not even a header" % size
            n = int.from_bytes(head, "little")
            if n > SAFETENSORS_MAX_HEADER or 8 + n > size:
                return "truncated or not safetensors: its header is longer than the %d-byte file" % size
            header = json.loads(f.read(n).decode("utf-8"))
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return "unreadable: %s" % exc.strerror
    except ValueError:  # UnicodeDecodeError too; their messages quote the bytes
        return "unreadable: its header is not JSON"
    if not isinstance(header, dict):
        return "unreadable: its header is not a JSON object"
    ends = [
        t["data_offsets"][1]
        for k, t in header.items()
        if k != "__metadata__" and isinstance(t, dict) and isinstance(t.get("data_offsets"), list)
    ]
    want = 8 + n + max(ends or [0])
    if size < want:
        return "truncated: %d of %d bytes" % (size, want)
    if size > want:
        return "%d bytes, %d more than its header accounts for" % (size, size - want)
    return None


def literal_patterns(names: List[str]) -> List[str]:
    """fnmatch patterns that match exactly these names (the Hub's client filters by pattern)."""
    return ["".join("[%s]" % c if c in "*?[" else c for c in name) for name in names]
