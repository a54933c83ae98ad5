"""The simulated engine's multi-node meeting, over real TCP: what torch.distributed does for SGLang's
`--nnodes N --node-rank i --dist-init-addr HOST:PORT`, with torch's own error lines.

Rank 0 listens on the dist-init port (TCPStore, every address) and waits until the other N-1 nodes have
joined; the others connect, retrying until the timeout, as the TCPStore client does. A wrong address or a
filtered port is a real timeout; a node never started leaves rank 0 waiting. Once met, each rank holds its
connection: when a peer goes away, the collective it was in never finishes and NCCL's watchdog kills the
rank after the timeout (rank 0 keeps answering HTTP meanwhile, sglang #3099/#4780).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleet_testbed.sglang_sim import SITE, SimError

TORCH = "/usr/local/lib/python3.12/dist-packages/torch/distributed"


@dataclass
class Meeting:
    rank: int
    peers: list[socket.socket] = field(default_factory=list)
    listener: socket.socket | None = None

    def watch(self, on_lost: Callable[[], None]) -> None:
        """Calls `on_lost` once, when any peer's connection ends."""

        def follow(sock: socket.socket) -> None:
            sock.settimeout(None)
            try:
                while sock.recv(4096):
                    pass
            except OSError:
                pass
            on_lost()

        for sock in self.peers:
            threading.Thread(target=follow, args=(sock,), daemon=True).start()


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _frames(fn: str, line: int) -> list[tuple[str, int, str, str]]:
    return [
        (f"{SITE}/srt/model_executor/model_runner.py", 812, "init_torch_distributed", ""),
        (f"{TORCH}/rendezvous.py", line, fn, ""),
    ]


def meet(dist_init_addr: str, nnodes: int, node_rank: int, timeout_s: float, shown_s: int) -> Meeting | SimError:
    """`timeout_s`: how long this simulation waits; `shown_s`: the timeout the engine was given, as shown."""
    host, port = _split(dist_init_addr)
    deadline = time.monotonic() + timeout_s
    if node_rank == 0:
        return _serve(port, nnodes, deadline, shown_s)
    return _join(host, port, node_rank, deadline, shown_s)


def _serve(port: int, nnodes: int, deadline: float, shown_s: int) -> Meeting | SimError:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("0.0.0.0", port))
        listener.listen(64)
    except OSError:
        listener.close()
        return SimError(
            "torch.distributed.DistNetworkError",
            f"The server socket has failed to listen on any local network address. port: {port}, useIpv6: false, "
            "code: -98, name: EADDRINUSE, message: address already in use",
            _frames("_create_c10d_store", 189),
        )
    meeting = Meeting(0, listener=listener)
    joined: set[int] = set()
    while len(joined) < nnodes - 1:
        left = deadline - time.monotonic()
        if left <= 0:
            for sock in meeting.peers:
                sock.close()
            listener.close()
            return SimError(
                "torch.distributed.DistStoreError",
                f"Timed out after {shown_s + 1} seconds waiting for clients. {len(joined) + 1}/{nnodes} clients joined.",
                _frames("_create_c10d_store", 189),
            )
        listener.settimeout(min(left, 0.5))
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            continue
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            said = sock.recv(64).decode(errors="replace").strip()
            joined.add(int(said))
            meeting.peers.append(sock)
        except (OSError, ValueError):
            sock.close()
    for sock in meeting.peers:
        sock.sendall(b"go\n")
    return meeting


def _join(host: str, port: int, node_rank: int, deadline: float, shown_s: int) -> Meeting | SimError:
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except (ConnectionRefusedError, TimeoutError, OSError):
            time.sleep(0.2)  # the TCPStore client retries until its timeout
            continue
        sock.sendall(f"{node_rank}\n".encode())
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            if sock.recv(16).startswith(b"go"):
                return Meeting(node_rank, peers=[sock])
        except OSError:
            pass
        sock.close()
        return SimError(
            "torch.distributed.DistNetworkError",
            f"Connection reset by peer while waiting for rank 0 at ({host}, {port}) to start the group",
            _frames("_create_c10d_store", 189),
        )
    return SimError(
        "torch.distributed.DistNetworkError",
        f"The client socket has timed out after {shown_s * 1000}ms while trying to connect to ({host}, {port}).",
        _frames("_create_c10d_store", 189),
    )


def gloo_interface_error(ifname: str) -> SimError | None:
    """Gloo looks up GLOO_SOCKET_IFNAME on this node before it connects the mesh."""
    try:
        socket.if_nametoindex(ifname)
        return None
    except OSError:
        return SimError(
            "RuntimeError",
            f"[enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != nullptr. Unable to find "
            f"address for: {ifname}",
            [
                (f"{SITE}/srt/distributed/parallel_state.py", 1205, "init_distributed_environment", ""),
                (f"{TORCH}/distributed_c10d.py", 1596, "new_group", ""),
            ],
        )


def watchdog_lines(global_rank: int, timeout_s: int) -> list[str]:
    """What the rank prints when NCCL's watchdog finds its collective stuck (torch's ProcessGroupNCCL)."""
    stamp = time.strftime("%m%d %H:%M:%S") + f".{int(time.time() % 1 * 1e6):06d}"
    ms = timeout_s * 1000
    return [
        f"[rank{global_rank}]:[E{stamp} ProcessGroupNCCL.cpp:632] [Rank {global_rank}] Watchdog caught collective "
        f"operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)={ms}) ran for "
        f"{ms + 18} milliseconds before timing out.",
        f"[rank{global_rank}]:[E{stamp} ProcessGroupNCCL.cpp:2168] [PG ID 0 PG GUID 0(default_pg) Rank {global_rank}] "
        "Process group watchdog thread terminated with exception: [Rank 0] Watchdog caught collective operation "
        "timeout",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
    ]
