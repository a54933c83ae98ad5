"""Run the SGLang engine simulator directly (no SSH) on a simulated host directory, for simulator tests
and for capturing real simulator logs as diagnosis samples."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from fleet_testbed import simhost

READY = "The server is fired up and ready to roll!"


def make_host(
    root: Path,
    *,
    name: str = "h",
    gpu: dict[str, Any] = simhost.RTX_PRO_6000,
    count: int = 8,
    version: str = "0.5.11",
    address: str = "127.0.3.1",
) -> Path:
    spec = replace(simhost.BLACKWELL, name=name, gpu=gpu, gpu_count=count, sglang_version=version, address=address)
    return simhost.build_host(root, spec)


def model(hdir: Path, name: str) -> str:
    return str(hdir / "models" / name)


def env(hdir: Path) -> dict[str, str]:
    return {**os.environ, "SIM_SPEED": "0.05", "SIM_HOST_DIR": str(hdir)}


def run(hdir: Path, args: list[str], extra_env: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, str]:
    """Run to completion (a launcher error or a crash); returns (exit code, stdout+stderr)."""
    p = subprocess.run(
        [str(hdir / "env" / "bin" / "python"), "-m", "sglang.launch_server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env(hdir), **(extra_env or {})},
    )
    return p.returncode, p.stdout + p.stderr


class Running:
    """A simulated server started in its own process group; always killed on exit."""

    def __init__(self, hdir: Path, args: list[str], extra_env: dict[str, str] | None = None) -> None:
        self.log_path = hdir / "logs" / f"sim-{time.monotonic_ns()}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in __exit__
        self.proc = subprocess.Popen(
            [str(hdir / "env" / "bin" / "python"), "-m", "sglang.launch_server", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**env(hdir), **(extra_env or {})},
        )

    def text(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, needle: str, timeout: float = 20) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return True
            if self.proc.poll() is not None:
                return needle in self.text()
            time.sleep(0.02)
        return False

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def http(url: str, body: dict[str, Any] | None = None, timeout: float = 5.0) -> tuple[int | None, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode() if body is not None else None, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None
    except OSError as e:
        return None, str(e)


def chat(address: str, port: int, prompt: str, served: str = "m", timeout: float = 5.0) -> tuple[int | None, Any]:
    return http(
        f"http://{address}:{port}/v1/chat/completions",
        {"model": served, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8},
        timeout,
    )


class RequestLoop:
    """Requests one after another on a thread of their own while a block runs: `ask` returns None when a
    request was answered as expected, else what came back instead (an exception counts as a failure too)."""

    def __init__(self, ask: Callable[[], object], pause_s: float = 0.0, join_s: float = 60.0) -> None:
        self.ask, self.pause_s, self.join_s = ask, pause_s, join_s
        self.answered = 0
        self.failures: list[object] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                failure = self.ask()
            except Exception as exc:  # a refused connection, a 503, a timeout: every failure counts
                failure = f"{type(exc).__name__}: {exc}"
            if failure is None:
                self.answered += 1
            else:
                self.failures.append(failure)
            time.sleep(self.pause_s)

    def __enter__(self) -> RequestLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.join_s)


def established_tcp() -> list[tuple[str, str]]:
    """(local, remote) of this machine's established IPv4 TCP connections, as /proc/net/tcp writes them:
    "0100007F:7530" is 127.0.0.1:30000."""
    rows = [line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:]]
    return [(r[1], r[2]) for r in rows if r[3] == "01"]


def client_connected(port: int) -> bool:
    """Some client holds an established TCP connection to `port` on this machine (a request on its way)."""
    return any(int(remote.split(":")[1], 16) == port for _, remote in established_tcp())


def tcp_ports_to(address: str, port: int) -> set[int]:
    """Local ports of the established TCP connections to address:port."""
    want = f"{socket.inet_aton(address)[::-1].hex().upper()}:{port:04X}"
    return {int(local.split(":")[1], 16) for local, remote in established_tcp() if remote == want}


def wait_until(predicate: Any, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False
