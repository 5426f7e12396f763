"""A TCP relay on loopback that adds a fixed delay to each direction: a stand-in for the
network between edgespec and its RPC workers (a test tool and the RPC benchmark's).

    python tests/relay.py LISTEN_PORT TARGET_HOST:TARGET_PORT DELAY_MS

Every chunk read on one side is written to the other ``DELAY_MS`` after it arrived (order
kept, so the delay adds latency without limiting throughput), as on a link with that one-way
latency. It prints ``ready`` once listening, and ends on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import signal
import sys


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            queue.put_nowait((loop.time() + delay, data))
    except (ConnectionError, OSError):
        pass
    queue.put_nowait((0.0, None))
    try:
        await sender
    except (ConnectionError, OSError):
        pass
    try:
        writer.close()
    except (ConnectionError, OSError):
        pass


async def relay(listen_port: int, target: str, delay_ms: float) -> None:
    host, _, port = target.rpartition(":")
    delay = delay_ms / 1000.0

    async def handle(c_reader, c_writer) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            c_writer.close()
            return
        await asyncio.gather(_pump(c_reader, s_writer, delay), _pump(s_reader, c_writer, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print("ready", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(relay(int(sys.argv[1]), sys.argv[2], float(sys.argv[3])))
