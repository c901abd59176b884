"""A loopback TCP proxy that breaks connections on demand, for fault tests.

Runs on the test's event loop between a gateway and a worker. Each accepted connection
is piped both ways to the target; :meth:`TcpProxy.reset` closes every open connection
at once (the peer sees a reset), :meth:`TcpProxy.stall` stops forwarding bytes without
closing anything (a hung network), :meth:`TcpProxy.resume` lets them through again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self.connections = 0

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def stall(self) -> None:
        self._flowing.clear()

    def resume(self) -> None:
        self._flowing.set()

    def reset(self) -> None:
        """Abort every open connection (RST where the platform sends one)."""
        for writer in list(self._writers):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    # Linger 0: close sends RST, as a crashed peer's kernel would.
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                    )
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            await self._flowing.wait()
            writer.write(data)
            await writer.drain()
