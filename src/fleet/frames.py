"""Length-prefixed JSON messages on a unix socket: how a fleet run talks to `fleet pool`; and what both
of the pool's sockets need to be this user's only.

Stdlib only: the warm launcher (`fleet.launch`) imports this before anything else of fleet.
"""

from __future__ import annotations

import json
import os
import struct

TYPE_CHECKING = False  # not typing's: importing typing is ~4 ms of a warm run's start (mypy reads this as True)
if TYPE_CHECKING:
    from _socket import socket  # socket.socket's base class: the launcher uses it without socket.py
    from collections.abc import Callable, Mapping
    from typing import Any, TypeVar

    T = TypeVar("T")

_HEADER = struct.Struct(">I")
MAX_FRAME = 64 * 1024 * 1024  # a frame larger than this is a protocol error, not a log chunk


def send_frame(sock: socket, message: Mapping[str, object]) -> None:
    body = json.dumps(message).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def _read_exact(sock: socket, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        part = sock.recv(n)
        if not part:
            raise EOFError("the other side closed the socket")
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def read_frame(sock: socket) -> dict[str, Any]:
    (size,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise EOFError(f"frame of {size} bytes")
    message = json.loads(_read_exact(sock, size))
    if not isinstance(message, dict):
        raise EOFError("frame is not an object")
    return message


def peer_uid(sock: socket) -> int:
    """The user id of the process at the other end of a unix socket."""
    import _socket

    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def owner_only(create_socket: Callable[[], T]) -> T:
    """Run `create_socket` (which binds a unix socket) with umask 0177: the file is born 0600, with no
    window where another user could connect."""
    old_umask = os.umask(0o177)
    try:
        return create_socket()
    finally:
        os.umask(old_umask)


def unlink_if_ours(path: str | os.PathLike[str], inode: int) -> None:
    """Remove a socket file this process bound (`inode`), never one a newer process has bound since."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass
