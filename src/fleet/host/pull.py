"""Runs ON the host (sent as `python -c`, with the engine's Python): put a playbook's model onto the host
from the Hugging Face Hub with the engine's own client (`huggingface_hub.snapshot_download`), and prove it
whole before it counts as present. Events, one JSON object per line:
  {"e":"present","files":n,"bytes":n}            already there and whole: nothing downloaded
  {"e":"planned","files":n,"bytes":n,"have":n,"free":n,"commit":sha}
  {"e":"progress","done":n,"total":n}            about once a second
  {"e":"pulled","files":n,"bytes":n,"checksums":n,"commit":sha}
  {"e":"refused","kind":..,"why":..,"problems":[..],"stage":..}   nothing new counts as present (file by file);
      kind: disk, busy, client, listing, foreign (a directory fleet did not make), download;
      stage: check (nothing downloaded) or download (it began)
  {"e":"error","error":..}

The download goes into `<model>.fleet-partial/` (fleet's own) and is renamed to the model's path only once every file has the size the Hub lists, the checksum it lists, a safetensors header that
accounts for the file, and a config.json that parses: a cut, a Ctrl-C or a full disk leaves no directory
at the model's path that a deploy would take as complete. A model directory fleet did not make (no
`.fleet-pulled.json` in it) is never changed: damaged, it is reported and left. The token comes on stdin
(one JSON line), never in argv; when stdin then ends, fleet is gone and the pull stops where it is.
The next pull keeps every file already whole and fetches the rest (a cut connection within one pull is
resumed by the client itself, from the bytes it has).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, cast

try:  # the model-file checks are prepended when this script is sent to a host
    _damage  # noqa: B018
except NameError:  # imported as a module (fleet's own tests, mypy)
    from fleet.host.common import stdin_closed
    from fleet.host.model_files import _damage, _json_file, literal_patterns
    from fleet.host.records import not_ours_alone, open_appending, owned
    from fleet.transfer_protocol import ListedFile, PullRequest

MARKER = ".fleet-pulled.json"  # in a model directory fleet made: what it pulled, from where, and when
PARTIAL = ".fleet-partial"
PARTIAL_MARK = ".fleet-partial-of-fleet"  # in a partial download fleet made: it may be resumed and removed
PUSH_RECORD = ".fleet-push.json"  # in a partial push: the source's listing it was started for
PUSH_DONE = ".fleet-push-done"  # in a partial push: the files already proved, one name a line
FLEET_FILES = (MARKER, MARKER + ".tmp", PARTIAL_MARK, PUSH_RECORD, PUSH_DONE, ".cache")  # never a model's own
HF_META = os.path.join(".cache", "huggingface")  # the client's own resume records inside local_dir
DISK_MARGIN = 64 << 20  # left free beyond the checkpoint: logs and the client's metadata need room too
PROGRESS_EVERY_S = 1.0


def emit(obj: Mapping[str, object]) -> None:
    try:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # fleet is gone: nobody to tell, nothing left half-counted
        os._exit(3)


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


def hub_listing(api: Any, repo: str, revision: str) -> Tuple[str, Dict[str, ListedFile]]:
    """The commit the revision names now, and every file in it: size and (for LFS files) sha256."""
    commit = api.repo_info(repo_id=repo, revision=revision).sha
    files = {}  # type: Dict[str, ListedFile]
    for f in api.list_repo_tree(repo_id=repo, revision=commit, recursive=True):
        if getattr(f, "size", None) is None or not hasattr(f, "blob_id"):
            continue  # a folder
        lfs = getattr(f, "lfs", None)
        files[f.path] = {
            "size": int(f.size),
            "sha256": getattr(lfs, "sha256", None) if lfs else None,
            "git_sha1": None if lfs else f.blob_id,  # a file kept in git itself: its blob id is a checksum
        }
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
        for i, block in enumerate(iter(lambda: f.read(1 << 20), b"")):
            h.update(block)
            if i % 256 == 255:  # hundreds of GB take minutes: fleet may be gone meanwhile
                gone_now()
    return h.hexdigest()


def git_blob_sha1(path: str, size: int) -> str:
    h = hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stamp(path: str) -> List[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def problems_in(
    path: str, files: Optional[Dict[str, ListedFile]], verified: Optional[Dict[str, Any]] = None
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
        elif want.get("git_sha1") and not want.get("sha256"):  # small: read every time
            checked += 1
            if git_blob_sha1(full, size) != want["git_sha1"]:
                out.append("%s: its content is not the one the Hub lists" % name)
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


def stamps(path: str, files: Dict[str, ListedFile]) -> Dict[str, List[int]]:
    return {n: stamp(os.path.join(path, n)) for n in files}


def write_marker(path: str, data: Mapping[str, object]) -> None:
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


def refuse(kind: str, why: str, problems: Optional[List[str]] = None, stage: str = "check") -> None:
    """stage: "check" (nothing was downloaded) or "download" (it began)."""
    emit({"e": "refused", "kind": kind, "why": why, "problems": problems or [], "stage": stage})


def unsafe_names(files: Dict[str, ListedFile]) -> List[str]:
    """Names in the Hub's listing that would land outside the model directory (or hide in a terminal):
    the listing is the remote side's word, not fleet's. Each as the operator can find it (control
    characters spelt out, \x1b and the like), not as a terminal would show it."""
    bad = []
    for name in files:
        parts = name.split("/")
        if (
            not name
            or name.startswith("/")
            or any(p in ("", ".", "..") for p in parts)
            or any(ord(c) < 32 or ord(c) == 127 for c in name)
            or parts[0] in FLEET_FILES
        ):
            bad.append(spelt_out(name))
    return bad


def spelt_out(name: str) -> str:
    return "".join(c if 32 <= ord(c) != 127 else "\\x%02x" % ord(c) for c in name)


def offline(exc: BaseException) -> bool:
    """Whether the Hub was not reached at all (no route, refused, timed out, offline mode): only then does a
    model already on the host count on its own terms. A 401, a 404 or an unknown revision is an answer."""
    names = set(c.__name__ for c in type(exc).__mro__)
    return bool(names & {"ConnectError", "ConnectTimeout", "TimeoutException", "NetworkError", "OfflineModeIsEnabled"})


def ours(path: str) -> Optional[Dict[str, Any]]:
    """The marker of a directory fleet made (a real directory, not a symlink to one, and it and its marker
    this user's alone), else None."""
    if not (owned(path, stat.S_ISDIR) and owned(os.path.join(path, MARKER), stat.S_ISREG)):
        return None
    marker, _ = _json_file(os.path.join(path, MARKER))
    return marker if isinstance(marker, dict) else None


def seed(partial: str, target: str, files: Dict[str, ListedFile], broken: List[str]) -> None:
    """A new download of a model fleet made starts from its files that are whole and unchanged in size
    (hard links: the model at the path is not touched); the client checks each against the Hub again."""
    for name, want in files.items():
        src, dst = os.path.join(target, name), os.path.join(partial, name)
        if name in broken or os.path.lexists(dst) or not os.path.isfile(src) or os.path.islink(src):
            continue
        if os.path.getsize(src) != want["size"]:
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            pass


def claim(target: str) -> Any:
    """The lock on this model's path for this pull (or push), held until the step exits; None, with the
    refusal said, when another holds it or something fleet did not make is in the way. A swap cut between
    its two renames is undone first."""
    partial, old = target + PARTIAL, target + ".fleet-old"
    parent = os.path.dirname(target) or "/"
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        return refuse("disk", "the models directory %s cannot be made: %s" % (parent, exc.strerror))
    unsafe = not_ours_alone(parent)
    if unsafe:  # another user could plant a partial, a marker or a link there that fleet then trusts
        why = (
            "%s: fleet keeps the models it checks only where nobody else may write (chmod go-w, or another models_dir)"
        )
        return refuse("foreign", why % unsafe)
    lock_path = os.path.join(parent, ".%s.fleet-pull.lock" % os.path.basename(target))
    guard = open_appending(lock_path)  # no link, no waiting, this user's file alone
    try:
        fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return refuse("busy", "another fleet pull of %s is running on this host" % target)
    if ours(old) is not None:  # a swap cut between its two renames: the model that was there comes back
        if not os.path.lexists(target):
            os.rename(old, target)
        else:
            shutil.rmtree(old)
    for path in (target, partial):
        if os.path.lexists(path) and not os.path.isdir(path):
            return refuse("foreign", "%s is there and is not a directory; fleet leaves it as it is" % path)
    if os.path.lexists(partial) and not (
        owned(partial, stat.S_ISDIR) and owned(os.path.join(partial, PARTIAL_MARK), stat.S_ISREG)
    ):
        return refuse("foreign", "%s is there and fleet did not make it; it is left as it is" % partial)
    return guard


def start_partial(partial: str) -> None:
    if not os.path.isdir(partial):
        os.makedirs(partial, 0o755)
        open(os.path.join(partial, PARTIAL_MARK), "w").close()


def drop_strays(partial: str, files: Dict[str, ListedFile], client_dir: Optional[str] = None) -> None:
    """What this listing does not name (another layout, another source, a file the Hub's client fetched
    that fleet's listing did not have) and every link (fleet makes none here: one planted could lead a
    write outside the partial copy): removed. `client_dir`: the download client's own records, kept."""
    keep = set(files) | {PARTIAL_MARK, PUSH_RECORD, PUSH_DONE}
    kept_dir = os.path.join(partial, client_dir) if client_dir else None
    for where, dirs, names in os.walk(partial, topdown=False):
        rel = os.path.relpath(where, partial)
        if kept_dir and not os.path.islink(kept_dir) and (where + os.sep).startswith(kept_dir + os.sep):
            continue
        for name in names + [d for d in dirs if os.path.islink(os.path.join(where, d))]:
            key = name if rel == "." else rel.replace(os.sep, "/") + "/" + name
            if kept_dir and os.path.join(where, name) == kept_dir and not os.path.islink(kept_dir):
                continue
            full = os.path.join(where, name)
            if key not in keep or os.path.islink(full) or not os.path.isfile(full):
                os.remove(full)
        if rel != "." and not os.listdir(where):
            os.rmdir(where)


def swap_in(target: str, partial: str, marker: Mapping[str, object], stop_if_gone: bool = True) -> None:
    """The whole, checked partial becomes the model: marked as fleet's, then renamed to the path. Fleet's
    own older or damaged copy there is swapped out in two renames (a cut between them is undone by
    `claim`), then removed. `stop_if_gone`: a last look at stdin first (a push's stdin has ended by now).
    The partial keeps fleet's mark until it is renamed: cut before, it is still fleet's to resume."""
    for leftover in (PUSH_RECORD, PUSH_DONE, MARKER + ".tmp"):  # another kind of try's records
        try:
            os.remove(os.path.join(partial, leftover))
        except OSError:
            pass
    write_marker(partial, marker)
    if stop_if_gone:
        gone_now()
    if os.path.isdir(target):
        old = target + ".fleet-old"
        os.rename(target, old)
        os.rename(partial, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(partial, target)
    try:
        os.remove(os.path.join(target, PARTIAL_MARK))
    except OSError:
        pass


def main(a: PullRequest) -> None:
    secret = read_secret()
    target = os.path.expanduser(a["path"]).rstrip("/")
    partial = target + PARTIAL
    parent = os.path.dirname(target) or "/"
    revision = a.get("revision") or "main"
    endpoint = a.get("endpoint")
    if endpoint:
        os.environ["HF_ENDPOINT"] = endpoint
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    guard = claim(target)
    if guard is None:
        return
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError as exc:
        return refuse("client", "the engine's Python has no huggingface_hub (%s)" % exc)
    token = secret.get("token") or None  # None: the host's own login, if it has one
    try:
        commit, files = hub_listing(HfApi(token=token), a["repo"], revision)
    except Exception as exc:  # noqa: BLE001 - sorted below: not reached, or an answer
        said = "%s: %s" % (type(exc).__name__, str(exc)[:2000])
        if offline(exc) and os.path.isdir(target) and not problems_in(target, None)[0]:
            emit({"e": "present", "files": None, "bytes": bytes_under(target), "commit": None, "unlisted": said})
        else:
            refuse("listing", "the Hub did not list %s@%s: %s" % (a["repo"], revision, said))
        return
    bad = unsafe_names(files)
    if bad:
        return refuse("listing", "the Hub's listing names files outside the model directory", bad[:20])
    total = sum(f["size"] for f in files.values())

    marker = ours(target)
    broken = []  # type: List[str]
    if os.path.isdir(target):
        same_commit = marker is not None and marker.get("commit") == commit
        problems, checked = problems_in(target, files, marker.get("verified") if same_commit and marker else None)
        if not problems and (marker is None or same_commit):
            if marker is not None and checked:  # checksums read again: remembered against the files' new stamps
                write_marker(target, dict(marker, verified=stamps(target, files)))
            emit({"e": "present", "files": len(files), "bytes": total, "commit": commit, "checksums": checked})
            return
        if marker is None:
            why = "%s is there but not whole, and fleet did not make it (no %s in it): it is left as it is"
            return refuse("foreign", why % (target, MARKER), problems)
        broken = [p.split(":")[0] for p in problems]  # fleet's own: rebuilt beside it, swapped in when whole

    start_partial(partial)
    drop_strays(partial, files, client_dir=".cache")  # a cut pull's files of another layout, and any link
    drop_unfinished(partial)
    if marker is not None:
        seed(partial, target, files, broken)
    have = sum(f["size"] for n, f in files.items() if whole_here(os.path.join(partial, n), f["size"]))
    free = free_bytes(partial)
    emit({"e": "planned", "files": len(files), "bytes": total, "have": have, "free": free, "commit": commit})
    if total - have + DISK_MARGIN > free:
        why = "not enough disk: %d bytes to download, %d free at %s (and %d kept free); nothing downloaded"
        return refuse("disk", why % (total - have, free, parent, DISK_MARGIN))

    download = lambda: snapshot_download(  # noqa: E731 - run in download_into's thread
        repo_id=a["repo"],
        revision=commit,
        local_dir=partial,
        token=token,
        max_workers=4,
        allow_patterns=literal_patterns(sorted(files)),  # what fleet listed, checked and sized for
    )
    counted = fetched(partial, files, total, download)
    if counted is not None:
        marker = {"repo": a["repo"], "revision": revision, "commit": commit, "pulled_at": time.time()}
        swap_in(target, partial, dict(marker, verified=stamps(partial, files)))
        emit({"e": "pulled", "files": len(files), "bytes": total, "checksums": counted, "commit": commit})


def fetched(partial: str, files: Dict[str, ListedFile], total: int, download: Callable[[], Any]) -> Optional[int]:
    """The download into fleet's partial copy, then every file checked: how many checksums were compared
    once it is whole and holds only the listed files; None (the refusal said) when not."""
    error = download_into(partial, total, download)
    if error is not None:
        full = isinstance(error, OSError) and error.errno == errno.ENOSPC or "No space left" in str(error)
        why = "the download failed: %s: %s" % (type(error).__name__, str(error)[:2000])
        refuse("disk" if full else "download", why + (" (at %s)" % partial if full else ""), stage="download")
        return None
    problems, checked = problems_in(partial, files)
    gone_now()
    if problems:
        forget(partial, [p.split(":")[0] for p in problems if p.split(":")[0] in files])
        refuse("download", "what was downloaded is not whole; it is not used", problems, stage="download")
        return None
    shutil.rmtree(os.path.join(partial, HF_META), ignore_errors=True)
    try:  # the client's own directory, kept if anything else is in it
        os.rmdir(os.path.join(partial, ".cache"))
    except OSError:
        pass
    drop_strays(partial, files)  # an old layout's shards, or what the client listed beyond fleet's listing
    return checked


def whole_here(path: str, size: int) -> bool:
    return os.path.isfile(path) and os.path.getsize(path) == size


def download_into(partial: str, total: int, download: Callable[[], Any]) -> Optional[BaseException]:
    """Run `download` (the Hub client's, into `partial`) in a thread, saying the bytes there every
    PROGRESS_EVERY_S and stopping if fleet is gone; what it raised, if anything."""
    failed = []  # type: List[BaseException]

    def run_it() -> None:
        try:
            download()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failed.append(exc)

    worker = threading.Thread(target=run_it, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(PROGRESS_EVERY_S)
        gone_now()
        emit({"e": "progress", "done": min(total, bytes_under(partial)), "total": total})
    return failed[0] if failed else None


def gone_now() -> None:
    """Ctrl-C, or the connection cut: stop here, before anything more counts as present."""
    if stdin_closed():
        os._exit(3)


def run() -> None:
    try:
        main(cast("PullRequest", json.loads(sys.argv[1])))
    except Exception as exc:  # the step always answers in its own words
        emit({"e": "error", "error": "%s: %s" % (type(exc).__name__, str(exc)[:600])})


if __name__ == "__main__" and not globals().get("FLEET_PULL_AS_LIBRARY"):  # the push steps use it as a library
    run()
