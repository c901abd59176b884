"""A channel to one gRPC server ("host:port"): one HTTP/2 connection, made on first use
and again after it broke or was told to go away.

``unary_stream(method, ...)`` mirrors ``grpc.aio.Channel.unary_stream``: the callable it
returns starts a call at once when the connection is up (no task, no await), and from a
task while it connects. A connect that fails ends the call with UNAVAILABLE in gRPC
core's words ("failed to connect to all addresses"), as a call without
``wait_for_ready`` does on grpc.aio; the next call tries again.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import grpc

from tandem.hostport import split_host_port
from tandem.wire.h2grpc import frames as f
from tandem.wire.h2grpc.call import StreamCall
from tandem.wire.h2grpc.connection import H2Connection, MessageParts

USER_AGENT = "tandem-h2grpc/1"
SETTLE_TIMEOUT_S = 10.0  # the server's first SETTINGS after the TCP connect


def h2_channel(target: str) -> H2Channel | None:
    """A channel to ``target`` if it is ``host:port`` (None for other gRPC target forms,
    such as ``unix:``, which stay on grpc.aio)."""
    try:
        return H2Channel(target)
    except ValueError:
        return None


class H2Channel:
    def __init__(self, target: str, max_message_bytes: int = 256 << 20) -> None:
        self.target = target
        self._host, self._port = split_host_port(target)
        self.authority = target
        self._max_message = max_message_bytes
        self._connection: H2Connection | None = None
        self._connecting: asyncio.Task[H2Connection] | None = None
        self._closed = False

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes | MessageParts],
        response_deserializer: Callable[[bytes], Any],
    ) -> Callable[..., StreamCall]:
        fixed = f.request_block(self.authority, method, USER_AGENT)

        def start(
            request: Any,
            timeout: float | None = None,
            metadata: tuple[tuple[str, str], ...] = (),
        ) -> StreamCall:
            message = request_serializer(request)
            parts = (message,) if isinstance(message, bytes) else message
            prefix = f.message_prefix(sum(len(part) for part in parts))
            block = fixed
            if timeout is not None:
                block += f.timeout_field(timeout)
            if metadata:
                block += f.metadata_fields(metadata)
            call = StreamCall(response_deserializer, self._max_message, timeout)
            connection = self._connection
            if connection is not None and connection.usable and connection.has_room:
                connection.open(call, block, prefix, parts)
            else:
                call.starter = asyncio.get_running_loop().create_task(
                    self._start_later(call, block, prefix, parts)
                )
            return call

        return start

    async def _start_later(
        self, call: StreamCall, block: bytes, prefix: bytes, parts: MessageParts
    ) -> None:
        try:
            connection = await self._connected()
            await connection.wait_room()
            if not connection.usable:
                raise ConnectionError(connection.closed_reason or "the connection closed")
        except asyncio.CancelledError:
            return  # the call was cancelled or its deadline passed: it has its status
        except (OSError, ConnectionError, TimeoutError) as err:
            call.on_failed(
                grpc.StatusCode.UNAVAILABLE,
                f"failed to connect to all addresses; last error: {err}",
            )
            return
        if not call.done():
            connection.open(call, block, prefix, parts)

    async def _connected(self) -> H2Connection:
        if self._closed:
            raise ConnectionError("the channel was closed")
        connection = self._connection
        if connection is not None and connection.usable:
            return connection
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
            self._connecting.add_done_callback(_retrieve)
        # shield: one caller's cancellation must not abort the connect others wait for
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> H2Connection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            H2Connection, self._host, self._port, proto=socket.IPPROTO_TCP
        )
        try:
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                await connection.settled
        except BaseException:
            connection.close()
            raise
        if self._closed:
            connection.close()
            raise ConnectionError("the channel was closed")
        old, self._connection = self._connection, connection
        if old is not None and old is not connection:
            old.closed_reason = old.closed_reason or "replaced"
        return connection

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _retrieve(task: asyncio.Task[H2Connection]) -> None:
    """Mark a connect's failure seen: the waiting calls report it, or nobody waited."""
    if not task.cancelled():
        task.exception()
