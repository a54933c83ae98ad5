"""Length-prefixed JSON messages on a unix socket: how a fleet run talks to `fleet pool`.

Stdlib only: the warm launcher (`fleet.launch`) imports this before anything else of fleet.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a frame larger than this is a protocol error, not a log chunk


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        part = sock.recv(n)
        if not part:
            raise EOFError("the other side closed the socket")
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def read_frame(sock: socket.socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise EOFError(f"frame of {size} bytes")
    message = json.loads(_read_exact(sock, size))
    if not isinstance(message, dict):
        raise EOFError("frame is not an object")
    return message
