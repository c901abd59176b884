"""The KV side channel: how a decode worker pulls prompt KV from a prefill worker.

It is a small gRPC service of Tandem's own, ``tandem.kv.KvTransfer``, served on
the same port as the worker protocol's service (and on an SGLang worker's bootstrap
port), so a worker's gRPC address is also its KV address. Messages are JSON requests
and raw float32 frames; no .proto is needed because both ends are Tandem.

- ``Pull``: stream the KV of tokens ``[start, end)`` held under a transfer id.
  When the id is not there yet (a gateway-minted id whose prefill is still
  running) the server waits up to ``wait_s`` for it to appear.
- ``Describe``: ``{"transfer_id", "wait_s"}`` → ``{"transfer_id", "num_tokens",
  "tokens_digest", "media"}`` once the id is held (waiting up to ``wait_s`` as Pull
  does; NOT_FOUND after that). ``media`` is the held request's pixel-free media
  description (``worker/kv_media.py``) or null: a decode leg that carries no media of
  its own reads its items and grids there.
- ``Release``: drop a held transfer now (the decode leg is done with it, or
  failed before it could start). With ``wait_s`` it first waits that long for the id
  to appear (a decode leg refused while its prefill is still running).
- ``Stats``: the worker's counters as JSON (held KV blocks, cache hits, …).

A frame is ``<QQ`` (first token, token count) followed by the tokens' KV as
float32 in the layout ``[layers, 2, kv_heads, tokens, head_dim]``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
import torch

from tandem.engine.kv_store import KvStore
from tandem.engine.types import KVLayers, ModelShape
from tandem.wire.peer_channels import PeerChannels, once_more_when_unavailable
from tandem.worker.kv_media import media_to_json

SERVICE = "tandem.kv.KvTransfer"
FRAME_TOKENS = 256
MAX_WAIT_S = 60.0  # the longest a Pull, Describe or Release waits for a transfer id
_HEADER = struct.Struct("<QQ")


def tokens_digest(token_ids: list[int]) -> str:
    """A short fingerprint of a token prefix: the pulled KV must belong to these ids."""
    return hashlib.blake2b(np.asarray(token_ids, dtype="<u4").tobytes(), digest_size=16).hexdigest()


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def _loads(data: bytes) -> dict[str, Any]:
    return json.loads(data.decode())


def _identity(data: bytes) -> bytes:
    return data


def encode_frame(start: int, kv: KVLayers) -> bytes:
    stacked = torch.stack([torch.stack((k, v)) for k, v in kv])  # [L, 2, H, T, D]
    tokens = stacked.shape[3]
    return _HEADER.pack(start, tokens) + stacked.contiguous().numpy().tobytes()


def decode_frame(frame: bytes, shape: ModelShape) -> tuple[int, KVLayers]:
    start, tokens = _HEADER.unpack_from(frame)
    dims = (shape.num_layers, 2, shape.num_kv_heads, tokens, shape.head_dim)
    expected = _HEADER.size + int(np.prod(dims)) * 4
    if len(frame) != expected:
        raise ValueError(f"KV frame of {len(frame)} bytes, expected {expected}")
    array = np.frombuffer(frame, dtype="<f4", offset=_HEADER.size).reshape(dims)
    stacked = torch.from_numpy(array.copy())
    return start, [(stacked[layer, 0], stacked[layer, 1]) for layer in range(dims[0])]


class KvChannelServer:
    """Serves the held KV of one worker's :class:`KvStore`."""

    def __init__(
        self, store: KvStore, shape: ModelShape, stats: Callable[[], dict[str, Any]]
    ) -> None:
        self.store = store
        self.shape = shape
        self.stats = stats

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Pull": grpc.unary_stream_rpc_method_handler(
                    self.pull, request_deserializer=_loads, response_serializer=_identity
                ),
                "Describe": grpc.unary_unary_rpc_method_handler(
                    self.describe, request_deserializer=_loads, response_serializer=_dumps
                ),
                "Release": grpc.unary_unary_rpc_method_handler(
                    self.release, request_deserializer=_loads, response_serializer=_dumps
                ),
                "Stats": grpc.unary_unary_rpc_method_handler(
                    self.get_stats, request_deserializer=_loads, response_serializer=_dumps
                ),
            },
        )

    async def pull(self, request: dict[str, Any], context: grpc.aio.ServicerContext):
        transfer_id = str(request.get("transfer_id", ""))
        start, end = int(request.get("start", 0)), int(request.get("end", 0))
        if request.get("shape") != [
            self.shape.num_layers,
            self.shape.num_kv_heads,
            self.shape.head_dim,
        ]:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "KV shape mismatch: the prefill and decode workers serve different models",
            )
        held = await self._wait_for(transfer_id, float(request.get("wait_s", 0.0)))
        if held is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no KV held under transfer id {transfer_id!r} (expired, released or unknown)",
            )
        if not 0 <= start <= end <= held.num_tokens:
            await context.abort(
                grpc.StatusCode.OUT_OF_RANGE,
                f"tokens [{start}, {end}) outside the {held.num_tokens} held",
            )
        if request.get("tokens_digest") != tokens_digest(held.token_ids[:end]):
            # The decode leg's prompt differs from what was prefilled: its KV would be wrong.
            self.store.release(transfer_id)
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"transfer {transfer_id!r} holds KV for a different prompt than the decode leg's",
            )
        for first in range(start, end, FRAME_TOKENS):
            last = min(end, first + FRAME_TOKENS)
            yield encode_frame(first, [(k[:, first:last], v[:, first:last]) for k, v in held.kv])
        if request.get("release"):
            self.store.release(transfer_id)

    async def _wait_for(self, transfer_id: str, wait_s: float):
        deadline = time.monotonic() + min(max(wait_s, 0.0), MAX_WAIT_S)
        while True:
            held = self.store.get(transfer_id)
            if held is not None or time.monotonic() >= deadline:
                return held
            await asyncio.sleep(0.005)

    async def describe(self, request: dict[str, Any], context: grpc.aio.ServicerContext):
        transfer_id = str(request.get("transfer_id", ""))
        held = await self._wait_for(transfer_id, _seconds(request.get("wait_s")))
        if held is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no KV held under transfer id {transfer_id!r} (not yet stored, expired, "
                "released or unknown)",
            )
        return {
            "transfer_id": transfer_id,
            "num_tokens": held.num_tokens,
            "tokens_digest": tokens_digest(held.token_ids),
            "media": media_to_json(held.media),
        }

    async def release(self, request: dict[str, Any], context: grpc.aio.ServicerContext):
        transfer_id = str(request.get("transfer_id", ""))
        wait_s = _seconds(request.get("wait_s"))
        if wait_s:
            await self._wait_for(transfer_id, wait_s)
        return {"released": self.store.release(transfer_id)}

    async def get_stats(self, request: dict[str, Any], context: grpc.aio.ServicerContext):
        return self.stats()


class KvChannelClient:
    """Pulls KV from other workers; one channel per address, reused."""

    def __init__(self, shape: ModelShape, timeout_s: float = 30.0) -> None:
        self.shape = shape
        self.timeout_s = timeout_s
        self._peers = PeerChannels()

    def _channel(self, address: str) -> grpc.aio.Channel:
        return self._peers.get(address)

    async def pull(
        self,
        address: str,
        transfer_id: str,
        token_ids: list[int],
        start: int,
        end: int,
        *,
        release: bool,
        wait_s: float = 0.0,
    ) -> KVLayers:
        call = self._channel(address).unary_stream(
            f"/{SERVICE}/Pull", request_serializer=_dumps, response_deserializer=_identity
        )
        request = {
            "transfer_id": transfer_id,
            "start": start,
            "end": end,
            "release": release,
            "wait_s": wait_s,
            "tokens_digest": tokens_digest(token_ids[:end]),
            "shape": [self.shape.num_layers, self.shape.num_kv_heads, self.shape.head_dim],
        }

        async def attempt() -> KVLayers:
            parts: list[KVLayers] = []
            expected = start
            stream: AsyncIterator[bytes] = call(request, timeout=self.timeout_s + wait_s)
            async for frame in stream:
                first, kv = decode_frame(frame, self.shape)
                if first != expected:
                    raise ValueError(f"KV frame out of order: got {first}, expected {expected}")
                expected += kv[0][0].shape[1]
                parts.append(kv)
            if expected != end:
                raise ValueError(f"KV pull ended at token {expected}, expected {end}")
            return concat_kv(parts, self.shape)

        return await once_more_when_unavailable(self._channel(address), attempt)

    async def describe(self, address: str, transfer_id: str, wait_s: float) -> dict[str, Any]:
        """The held transfer's size, digest and media description (waits up to ``wait_s``)."""
        call = self._channel(address).unary_unary(
            f"/{SERVICE}/Describe", request_serializer=_dumps, response_deserializer=_loads
        )
        request = {"transfer_id": transfer_id, "wait_s": wait_s}
        reply: dict[str, Any] = await once_more_when_unavailable(
            self._channel(address), lambda: call(request, timeout=self.timeout_s + wait_s)
        )
        return reply

    async def release(self, address: str, transfer_id: str, wait_s: float = 0.0) -> bool:
        call = self._channel(address).unary_unary(
            f"/{SERVICE}/Release", request_serializer=_dumps, response_deserializer=_loads
        )
        request: dict[str, Any] = {"transfer_id": transfer_id}
        if wait_s:
            request["wait_s"] = wait_s
        reply = await once_more_when_unavailable(
            self._channel(address), lambda: call(request, timeout=5.0 + wait_s)
        )
        return bool(reply.get("released"))

    async def stats(self, address: str) -> dict[str, Any]:
        call = self._channel(address).unary_unary(
            f"/{SERVICE}/Stats", request_serializer=_dumps, response_deserializer=_loads
        )
        return await call({}, timeout=5.0)

    async def close(self) -> None:
        await self._peers.close()


def _seconds(value: Any) -> float:
    """A JSON ``wait_s`` as seconds: 0 for anything that is not a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return 0.0
    return min(float(value), MAX_WAIT_S)


def concat_kv(parts: list[KVLayers], shape: ModelShape) -> KVLayers:
    """Join KV pieces along the token axis (an empty list gives zero tokens)."""
    if not parts:
        empty = torch.zeros(shape.num_kv_heads, 0, shape.head_dim)
        return [(empty, empty) for _ in range(shape.num_layers)]
    if len(parts) == 1:
        return parts[0]
    return [
        (torch.cat([p[i][0] for p in parts], dim=1), torch.cat([p[i][1] for p in parts], dim=1))
        for i in range(shape.num_layers)
    ]
