"""A TCP proxy that adds network latency: every chunk is delivered half the round-trip time after it
was read, in order, in both directions. The benchmark puts one in front of each simulated host's sshd
to show what round trips cost on a real network (loopback has none).

    python -m fleet_testbed.latency --rtt-ms 20 127.0.7.3:2522=127.0.6.3:2522 [more pairs...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, one_way_s: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(65536):
            queue.put_nowait((time.monotonic() + one_way_s, data))
    except OSError:
        pass
    queue.put_nowait((0.0, b""))
    with contextlib.suppress(OSError):
        await sender


async def _serve(listen: tuple[str, int], target: tuple[str, int], one_way_s: float) -> asyncio.Server:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        await asyncio.sleep(one_way_s * 2)  # the TCP handshake's round trip
        await asyncio.gather(_pipe(client_r, server_w, one_way_s), _pipe(server_r, client_w, one_way_s))
        for w in (client_w, server_w):
            w.close()

    return await asyncio.start_server(handle, *listen)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _main(pairs: list[tuple[tuple[str, int], tuple[str, int]]], one_way_s: float) -> None:
    servers = [await _serve(listen, target, one_way_s) for listen, target in pairs]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m fleet_testbed.latency")
    ap.add_argument("--rtt-ms", type=float, default=20.0)
    ap.add_argument("pairs", nargs="+", help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    a = ap.parse_args()
    pairs = [(_address(p.split("=", 1)[0]), _address(p.split("=", 1)[1])) for p in a.pairs]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(pairs, a.rtt_ms / 2000.0))


if __name__ == "__main__":
    main()
