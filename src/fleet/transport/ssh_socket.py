"""The TCP connection under fleet's SSH, and the paramiko transport over it, tuned for few round trips:
quick ACKs and no Nagle delay while sshd authenticates, AES-GCM first, large windows and packets."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from fleet.transport.sshlib import paramiko

# Linux only; elsewhere the socket is only NODELAY (the wait at authentication goes, the one at the
# first channel stays).
TCP_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


# AES-GCM first: paramiko seals and checks each packet in one pass of `cryptography`, where its default
# (aes128-ctr with hmac-sha2-256) takes two; a server without it (OpenSSH has had it since 6.2) settles
# on the next. Larger windows and packets than paramiko's 2 MiB / 32 KiB take fewer trips through its
# Python per byte. Measured here over loopback: sending 1.4x, receiving 3x (a push's two legs).
FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
WINDOW_BYTES = 8 << 20
PACKET_BYTES = 128 << 10
READ_BYTES = 1 << 20  # one read of a stream takes what has come, up to this: fewer trips per byte


def fast_transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    transport = paramiko.Transport(
        sock, default_window_size=WINDOW_BYTES, default_max_packet_size=PACKET_BYTES, **kwargs
    )
    options = transport.get_security_options()
    options.ciphers = (*FAST_CIPHERS, *(c for c in options.ciphers if c not in FAST_CIPHERS))
    return transport


class QuickAckSocket(socket.socket):
    """Acknowledges each segment at once instead of up to 40 ms later (delayed ACK).

    Until a session starts, sshd leaves Nagle's algorithm on: after USERAUTH_SUCCESS it holds its next
    small packet until that one is acknowledged, and a client with nothing to send delays that
    acknowledgement by 40 ms (measured on loopback: opening the first channel took 44 ms, 1 ms with
    this). The kernel resets quick-ACK mode on its own, so it is set again after every read."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        if TCP_QUICKACK is not None:
            with contextlib.suppress(OSError):  # closed meanwhile by another thread: the data still counts
                self.setsockopt(socket.IPPROTO_TCP, TCP_QUICKACK, 1)
        return data


def tcp_connect(host: str, port: int, timeout_s: float) -> socket.socket:
    """The TCP connection to sshd, for paramiko to run SSH over.

    paramiko's own socket leaves Nagle's algorithm on, so a request it writes in two pieces waits for
    the server's delayed ACK: public-key authentication took ~48 ms on loopback, ~8 ms with TCP_NODELAY.
    Together with quick ACKs a new connection is ready to run a command in ~27 ms instead of ~115 ms."""
    plain = socket.create_connection((host, port), timeout=timeout_s)
    sock = QuickAckSocket(fileno=plain.detach())
    sock.settimeout(timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
