"""A local stand-in for the Hugging Face Hub: the part of its HTTP API that `huggingface_hub`'s
`snapshot_download` uses (repo info, the recursive tree, HEAD and ranged GET of /resolve/), serving model
directories made on this machine. Point `HF_ENDPOINT` at `FakeHub.url`.

Faults a test can ask for: a token the repo requires (401 otherwise), a connection cut once after N bytes
of a file (the client resumes with a Range request), and a file the Hub itself serves truncated (listed
with the truncated size: only a check of the file's own contents can tell).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    root: Path
    token: str | None = None  # required as `Authorization: Bearer ...` when set
    cut_once: dict[str, int] = field(default_factory=dict)  # file -> bytes sent before the connection drops
    truncated: dict[str, int] = field(default_factory=dict)  # file -> the size the Hub itself has
    slow: dict[str, int] = field(default_factory=dict)  # file -> bytes a second it is sent at (stop a pull halfway)
    extra: dict[str, bytes] = field(default_factory=dict)  # listed and served beside the directory's (any name)
    known_revisions: set[str] | None = None  # the branches and tags it has (None: any name is its one commit)

    _digests: dict[tuple[str, int, int, int | None], tuple[str, str]] = field(default_factory=dict, repr=False)

    def files(self) -> dict[str, FileEntry]:
        """Every file as the Hub has it now: its size and digests (each file read once per change)."""
        out = {}
        for p in sorted(self.root.rglob("*")):
            if not p.is_file():
                continue
            name = p.relative_to(self.root).as_posix()
            st = p.stat()
            cut = self.truncated.get(name)
            key = (name, st.st_size, st.st_mtime_ns, cut)
            if key not in self._digests:
                data = self.read(name)
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's id of the file
                self._digests[key] = (blob, hashlib.sha256(data).hexdigest())
            sha1, sha256 = self._digests[key]
            out[name] = FileEntry(min(st.st_size, cut) if cut is not None else st.st_size, sha1, sha256)
        for name, data in self.extra.items():
            blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            out[name] = FileEntry(len(data), blob, hashlib.sha256(data).hexdigest())
        return out

    def read(self, name: str) -> bytes:
        if name in self.extra:
            return self.extra[name]
        data = (self.root / name).read_bytes()
        return data[: self.truncated[name]] if name in self.truncated else data

    @property
    def commit(self) -> str:
        h = hashlib.sha1()
        for name, entry in self.files().items():
            h.update(name.encode() + b"\0" + entry.sha256.encode())
        return h.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha1: str  # git's blob id: the Hub's oid (and ETag) of a file kept in git
    sha256: str  # what the Hub lists for an LFS file


class FakeHub:
    def __init__(self, port: int = 0) -> None:
        self.repos: dict[str, Repo] = {}
        self.served: dict[str, int] = {}  # file path -> bytes of it sent (GET bodies only)
        self.on_request: Callable[[BaseHTTPRequestHandler], None] | None = None  # a test's look while one is in flight
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, head=True)

            def do_GET(self) -> None:
                hub._answer(self, head=False)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, repo_id: str, repo: Repo) -> Repo:
        self.repos[repo_id] = repo
        return repo

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- the API ---------------------------------------------------------------------------------------

    def _answer(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        if self.on_request is not None:
            self.on_request(h)
        path = unquote(urlparse(h.path).path)
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo_id, kind, rest = "/".join(parts[2:4]), parts[4], parts[5:]
            repo = self._authorised(h, repo_id)
            if repo is None:
                return
            if kind == "revision":
                asked = "/".join(rest)
                if repo.known_revisions is not None and asked not in repo.known_revisions | {repo.commit}:
                    return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {asked}")
                files = repo.files()
                body = {"id": repo_id, "sha": repo.commit, "siblings": [{"rfilename": n} for n in files]}
                return self._json(h, body)
            if kind == "tree":
                return self._json(h, self._tree(repo, "/".join(rest[1:])))
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._authorised(h, "/".join(parts[:2]))
            if repo is None:
                return
            return self._file(h, repo, "/".join(parts[4:]), head)
        self._error(h, 404, "EntryNotFound", f"no route {path}")

    def _authorised(self, h: BaseHTTPRequestHandler, repo_id: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if repo.token is not None and h.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(h, 401, "GatedRepo", "Invalid credentials in Authorization header")
            return None
        return repo

    def _tree(self, repo: Repo, under: str) -> list[dict[str, Any]]:
        out = []
        for name, f in repo.files().items():
            if under and not name.startswith(under.rstrip("/") + "/"):
                continue
            entry: dict[str, Any] = {"type": "file", "oid": f.sha1, "size": f.size, "path": name}
            if name.endswith(".safetensors"):  # LFS files: the Hub gives their sha256
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            out.append(entry)
        return out

    def _file(self, h: BaseHTTPRequestHandler, repo: Repo, name: str, head: bool) -> None:
        entry = repo.files().get(name)
        if entry is None:
            return self._error(h, 404, "EntryNotFound", f"{name} not found")
        data = repo.read(name)
        etag = entry.sha256 if name.endswith(".safetensors") else entry.sha1
        start = 0
        wanted = h.headers.get("Range", "")
        if wanted.startswith("bytes="):
            start = int(wanted[6:].split("-")[0] or 0)
        body = data[start:]
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{etag}"')
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        with self._lock:
            cut = repo.cut_once.pop(name, None)
        if cut is not None and cut < len(body):
            h.wfile.write(body[:cut])
            h.wfile.flush()
            self._count(name, cut)
            h.close_connection = True
            h.connection.shutdown(2)  # mid-file: the client sees the body end early
            return
        rate = repo.slow.get(name)
        step = max(1, (rate or 0) // 20)  # twenty pieces a second
        pieces = [body[i : i + step] for i in range(0, len(body), step)] if rate else [body]
        for piece in pieces:
            try:
                h.wfile.write(piece)
            except OSError:  # the client went away (a stopped pull)
                return
            self._count(name, len(piece))
            if rate:
                time.sleep(0.05)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.served[name] = self.served.get(name, 0) + n

    def _json(self, h: BaseHTTPRequestHandler, body: Any) -> None:
        data = json.dumps(body).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _error(self, h: BaseHTTPRequestHandler, code: int, kind: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(code)
        h.send_header("X-Error-Code", kind)
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)


def make_model(
    root: Path, shards: int = 2, shard_bytes: int = 96 * 1024, seed: int = 7, config: Path | None = None
) -> Path:
    """A small model directory with real contents: config.json (`config`'s, e.g. a simulated host's
    model's), an index and `shards` safetensors files whose headers account for their bytes (random, so a
    checksum means something)."""
    import random

    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    default = json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
    (root / "config.json").write_text(config.read_text() if config else default)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        header = json.dumps({f"w{i}": {"dtype": "BF16", "shape": [shard_bytes // 2], "data_offsets": [0, shard_bytes]}})
        raw = header.encode()
        (root / name).write_bytes(len(raw).to_bytes(8, "little") + raw + rng.randbytes(shard_bytes))
        weight_map[f"w{i}"] = name
    index = {"metadata": {"total_size": shards * shard_bytes}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "tokenizer_config.json").write_text("{}")
    return root


def main() -> None:
    """`python -m fleet_testbed.fakehub REPO=DIR ...`: serve model directories as the Hub would, until
    Ctrl-C; `fleet pull` on a host of this machine reaches it through HF_ENDPOINT."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.fakehub")
    ap.add_argument("repos", nargs="+", metavar="REPO=DIR", help="a repository id and the directory it serves")
    ap.add_argument("--port", type=int, default=0, help="its port on 127.0.0.1 (default: any free one)")
    a = ap.parse_args()
    hub = FakeHub(a.port)
    for given in a.repos:
        repo_id, sep, directory = given.partition("=")
        if not sep or not Path(directory).is_dir():
            ap.error(f"{given!r}: give REPO=DIR, DIR a model directory on this machine")
        hub.add(repo_id, Repo(Path(directory)))
    print(f"serving {', '.join(hub.repos)}; in another shell:\n  export HF_ENDPOINT={hub.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        hub.close()


if __name__ == "__main__":
    main()
