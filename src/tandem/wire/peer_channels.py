"""gRPC channels from one Tandem process to its peers (KV and feature pulls, side calls).

Two things make a peer that came back on its address usable at once (issue 38):

- Reconnect back-off. gRPC's default grows from 1 s to two minutes; a decode worker's pull
  channel to a prefill worker that restarted (or whose connection was reset) would fail
  every pull for that long. ``RECONNECT_OPTIONS`` caps it at half a second, the numbers the
  gateway's worker channels use too.
- Fail-fast calls. A call on a channel in back-off fails at once with the last connect
  error, even when the peer is up again. :func:`once_more_when_unavailable` retries such a
  call once after waiting up to ``RECONNECT_GRACE_S`` for the channel to connect, so one
  reset costs no request, while a peer that is really gone still fails within the grace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

T = TypeVar("T")

RECONNECT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
RECONNECT_GRACE_S = 1.0
MAX_PEER_MESSAGE_BYTES = 256 << 20


class PeerChannels:
    """One channel per peer address, made on first use and reused."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            options = [("grpc.max_receive_message_length", MAX_PEER_MESSAGE_BYTES)]
            channel = grpc.aio.insecure_channel(address, options=[*options, *RECONNECT_OPTIONS])
            self._channels[address] = channel
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


async def once_more_when_unavailable(
    channel: grpc.aio.Channel, attempt: Callable[[], Awaitable[T]]
) -> T:
    """``attempt()``; when it fails UNAVAILABLE, once more if the channel reconnects soon.

    Only safe for calls whose repeat is harmless or refused by the peer (a pull whose KV
    was already released answers NOT_FOUND the second time).
    """
    try:
        return await attempt()
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        try:
            await asyncio.wait_for(channel.channel_ready(), RECONNECT_GRACE_S)
        except TimeoutError:
            raise err from None
    return await attempt()
