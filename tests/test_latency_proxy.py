"""The benchmark's latency proxy delivers every byte, in order, and adds the round-trip time it was given
(a lower bound only: the proxy may be slower on a busy machine, never faster)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

TESTBED = Path(__file__).resolve().parents[1] / "testbed"


def echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_the_proxy_forwards_everything_and_adds_the_round_trip_time() -> None:
    srv, port = echo_server()
    with socket.socket() as probe:  # a free port for the proxy
        probe.bind(("127.0.0.1", 0))
        proxy_port = probe.getsockname()[1]
    proxy = subprocess.Popen(
        [sys.executable, "-m", "fleet_testbed.latency", "--rtt-ms", "100", f"127.0.0.1:{proxy_port}=127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTBED)},
    )
    try:
        assert proxy.stdout and proxy.stdout.readline().strip() == "ready"
        with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as c:
            payload = bytes(range(256)) * 1000
            c.sendall(b"x")
            assert c.recv(1) == b"x"  # first exchange: connection set-up plus one round trip
            start = time.monotonic()
            c.sendall(payload)
            got = b""
            while len(got) < len(payload):
                got += c.recv(65536)
            elapsed = time.monotonic() - start
        assert got == payload
        assert elapsed >= 0.1
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        if proxy.stdout:
            proxy.stdout.close()
        srv.close()
