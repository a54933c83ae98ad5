"""Runs ON the host (sent as `python -c`, with the engine's Python): put a playbook's model onto the host
from the Hugging Face Hub with the engine's own client (`huggingface_hub.snapshot_download`), and prove it
whole before it counts as present. Events, one JSON object per line:
  {"e":"present","files":n,"bytes":n}            already there and whole: nothing downloaded
  {"e":"planned","files":n,"bytes":n,"have":n,"free":n,"commit":sha}
  {"e":"progress","done":n,"total":n}            about once a second
  {"e":"pulled","files":n,"bytes":n,"checksums":n,"commit":sha}
  {"e":"refused","kind":..,"why":..,"problems":[..]}   nothing counts as present (the reason, file by file);
      kind: disk, busy, client, listing, foreign (a directory fleet did not make), download (after it began)
  {"e":"error","error":..}

The download goes into `<model>.fleet-partial/` (fleet's own) and is renamed to the model's path only once every file has the size the Hub lists, the checksum it lists, a safetensors header that
accounts for the file, and a config.json that parses: a cut, a Ctrl-C or a full disk leaves no directory
at the model's path that a deploy would take as complete. A model directory fleet did not make (no
`.fleet-pulled.json` in it) is never changed: damaged, it is reported and left. The token comes on stdin
(one JSON line), never in argv; when stdin then ends, fleet is gone and the pull stops where it is.
The next pull keeps every file already whole and fetches the rest (a cut connection within one pull is
resumed by the client itself, from the bytes it has).
"""

import fcntl
import hashlib
import json
import os
import select
import shutil
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

try:  # the probe (as a library) is prepended when this script is sent to a host
    _damage  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.facts.probe import _damage, _json_file

MARKER = ".fleet-pulled.json"  # in a model directory fleet made: what it pulled, from where, and when
PARTIAL = ".fleet-partial"
HF_META = os.path.join(".cache", "huggingface")  # the client's own resume records inside local_dir
DISK_MARGIN = 64 << 20  # left free beyond the checkpoint: logs and the client's metadata need room too
PROGRESS_EVERY_S = 1.0


def emit(obj: Dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # fleet is gone: nobody to tell, nothing left half-counted
        os._exit(3)


def stdin_closed() -> bool:
    try:
        return bool(select.select([0], [], [], 0)[0]) and os.read(0, 4096) == b""
    except (OSError, ValueError):
        return True


def read_secret() -> Dict[str, Any]:
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            break
        line += chunk
    try:
        data = json.loads(line.decode() or "{}")
    except ValueError:
        data = {}
    return data if isinstance(data, dict) else {}


def listing(api: Any, repo: str, revision: str) -> Tuple[str, Dict[str, Dict[str, Any]]]:
    """The commit the revision names now, and every file in it: size and (for LFS files) sha256."""
    commit = api.repo_info(repo_id=repo, revision=revision).sha
    files = {}  # type: Dict[str, Dict[str, Any]]
    for f in api.list_repo_tree(repo_id=repo, revision=commit, recursive=True):
        if getattr(f, "size", None) is None or not hasattr(f, "blob_id"):
            continue  # a folder
        lfs = getattr(f, "lfs", None)
        files[f.path] = {"size": int(f.size), "sha256": getattr(lfs, "sha256", None) if lfs else None}
    return commit, files


def bytes_under(path: str) -> int:
    total = 0
    for where, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(where, name)).st_size
            except OSError:
                pass
    return total


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stamp(path: str) -> List[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def problems_in(
    path: str, files: Optional[Dict[str, Dict[str, Any]]], verified: Optional[Dict[str, Any]] = None
) -> Tuple[List[str], int]:
    """What keeps `path` from being the whole model, file by file (at most 20), and how many checksums
    were compared. `files`: what the Hub lists (None when it was not asked: the model's own files only).
    `verified`: the size and mtime each file had when fleet last checked its checksum (the marker's): a
    file unchanged since is not read again, any other file the Hub gives a sha256 for is."""
    out = []  # type: List[str]
    checked = 0
    verified = verified or {}
    for name, want in sorted((files or {}).items()):
        if os.path.isabs(name) or ".." in name.split("/"):
            out.append("%s: listed outside the model directory" % name)
            continue
        full = os.path.join(path, name)
        try:
            size = os.path.getsize(full)
        except OSError:
            out.append("%s: missing" % name)
            continue
        if size != want["size"]:
            out.append("%s: %d bytes, the Hub lists %d" % (name, size, want["size"]))
        elif want.get("sha256") and verified.get(name) != stamp(full):
            checked += 1
            if sha256_of(full) != want["sha256"]:
                out.append("%s: its sha256 is not the one the Hub lists" % name)
    config, config_error = _json_file(os.path.join(path, "config.json"))
    if not isinstance(config, dict):
        out.append("config.json: %s" % (config_error or "not a JSON object"))
    index, _ = _json_file(os.path.join(path, "model.safetensors.index.json"), 64 << 20)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    out += [p for p in _damage(path, weight_map) if not any(p.startswith(o.split(":")[0] + ":") for o in out)]
    return out[:20], checked


def drop_unfinished(partial: str) -> None:
    """A file cut midway by an earlier pull: huggingface_hub 2.x writes every try to a file of its own
    (`<hash>.<etag>.<random>.incomplete`) and never reads one back, so it is only disk used. Removed while
    fleet holds the pull's lock: nothing else writes there. Files already whole are kept."""
    for where, _dirs, names in os.walk(os.path.join(partial, HF_META, "download")):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    os.remove(os.path.join(where, name))
                except OSError:
                    pass


def stamps(path: str, files: Dict[str, Dict[str, Any]]) -> Dict[str, List[int]]:
    return {n: stamp(os.path.join(path, n)) for n in files}


def write_marker(path: str, data: Dict[str, Any]) -> None:
    tmp = os.path.join(path, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, os.path.join(path, MARKER))


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def forget(path: str, names: List[str]) -> None:
    """Files of fleet's own partial download that failed: removed with the client's record of them, so
    the next pull fetches them again instead of trusting them."""
    for name in names:
        for p in (os.path.join(path, name), os.path.join(path, HF_META, "download", name + ".metadata")):
            try:
                os.remove(p)
            except OSError:
                pass


def main(a: Dict[str, Any]) -> None:
    secret = read_secret()
    target = os.path.expanduser(a["path"]).rstrip("/")
    partial = target + PARTIAL
    parent = os.path.dirname(target) or "/"
    if a.get("endpoint"):
        os.environ["HF_ENDPOINT"] = a["endpoint"]
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        emit(
            {
                "e": "refused",
                "kind": "disk",
                "why": "the models directory %s cannot be made: %s" % (parent, exc.strerror),
            }
        )
        return
    guard = open(os.path.join(parent, ".%s.fleet-pull.lock" % os.path.basename(target)), "a")  # noqa: SIM115 - held to exit
    try:
        fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        emit({"e": "refused", "kind": "busy", "why": "another fleet pull of %s is running on this host" % target})
        return
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError as exc:
        emit({"e": "refused", "kind": "client", "why": "the engine's Python has no huggingface_hub (%s)" % exc})
        return
    token = secret.get("token") or None  # None: the host's own login, if it has one
    try:
        commit, files = listing(HfApi(token=token), a["repo"], a.get("revision") or "main")
    except Exception as exc:  # noqa: BLE001 - unreachable, no such repo or revision, a refused token
        whole = os.path.isdir(target) and not problems_in(target, None)[0]
        if whole:  # a host without the Hub: its model is checked on its own terms
            emit({"e": "present", "files": None, "bytes": bytes_under(target), "commit": None, "unlisted": True})
        else:
            emit(
                {
                    "e": "refused",
                    "kind": "listing",
                    "why": "the Hub did not list %s@%s: %s: %s"
                    % (a["repo"], a.get("revision") or "main", type(exc).__name__, str(exc)[:600]),
                }
            )
        return
    total = sum(f["size"] for f in files.values())

    if os.path.isdir(target):
        marker, _ = _json_file(os.path.join(target, MARKER))
        ours = isinstance(marker, dict)
        problems, checked = problems_in(target, files, marker.get("verified") if ours else None)
        if not problems:
            if ours and checked:  # checksums read again: remembered against the files' new stamps
                write_marker(target, dict(marker, verified=stamps(target, files)))
            emit({"e": "present", "files": len(files), "bytes": total, "commit": commit, "checksums": checked})
            return
        if not ours:
            emit(
                {
                    "e": "refused",
                    "kind": "foreign",
                    "why": "%s is there but not whole, and fleet did not make it (no %s in it): it is left as it is"
                    % (target, MARKER),
                    "problems": problems,
                }
            )
            return
        if os.path.exists(partial):
            emit(
                {
                    "e": "refused",
                    "kind": "foreign",
                    "why": "both %s and %s exist; remove the one you do not want" % (target, partial),
                }
            )
            return
        os.rename(target, partial)  # fleet's own, damaged: repaired where a deploy cannot mistake it
        forget(partial, [p.split(":")[0] for p in problems])

    os.makedirs(partial, exist_ok=True)
    drop_unfinished(partial)
    have = sum(
        f["size"]
        for n, f in files.items()
        if os.path.isfile(os.path.join(partial, n)) and os.path.getsize(os.path.join(partial, n)) == f["size"]
    )
    free = free_bytes(partial)
    emit({"e": "planned", "files": len(files), "bytes": total, "have": have, "free": free, "commit": commit})
    if total - have + DISK_MARGIN > free:
        emit(
            {
                "e": "refused",
                "kind": "disk",
                "why": "not enough disk: %d bytes to download, %d free at %s (and %d kept free); nothing downloaded"
                % (total - have, free, parent, DISK_MARGIN),
            }
        )
        return

    failed = []  # type: List[BaseException]

    def download() -> None:
        try:
            snapshot_download(repo_id=a["repo"], revision=commit, local_dir=partial, token=token, max_workers=4)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failed.append(exc)

    worker = threading.Thread(target=download, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(PROGRESS_EVERY_S)
        if stdin_closed():  # Ctrl-C, or the connection cut: stop here; nothing counted present
            os._exit(3)
        emit({"e": "progress", "done": min(total, bytes_under(partial)), "total": total})
    if failed:
        error = failed[0]
        why = "the download failed: %s: %s" % (type(error).__name__, str(error)[:600])
        emit({"e": "refused", "kind": "download", "why": why})
        return
    problems, checked = problems_in(partial, files)
    if problems:
        forget(partial, [p.split(":")[0] for p in problems if p.split(":")[0] in files])
        emit(
            {
                "e": "refused",
                "kind": "download",
                "why": "what was downloaded is not whole; it is not used",
                "problems": problems,
            }
        )
        return
    shutil.rmtree(os.path.join(partial, HF_META), ignore_errors=True)
    try:
        os.rmdir(os.path.join(partial, ".cache"))  # made by the client; kept if anything else is in it
    except OSError:
        pass
    write_marker(
        partial,
        {
            "repo": a["repo"],
            "revision": a.get("revision") or "main",
            "commit": commit,
            "pulled_at": time.time(),
            "verified": stamps(partial, files),
        },
    )
    os.rename(partial, target)
    emit({"e": "pulled", "files": len(files), "bytes": total, "checksums": checked, "commit": commit})


def run() -> None:
    try:
        main(json.loads(sys.argv[1]))
    except Exception as exc:  # the step always answers in its own words
        emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, str(exc)[:600])})


if __name__ == "__main__":
    run()
