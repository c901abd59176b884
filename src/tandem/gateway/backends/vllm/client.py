"""A typed client for one worker's ``vllm.grpc.engine.VllmEngine`` service.

The one thing this adds over the generated stub is *abort-on-drop* for
``Generate``: a stream the caller abandons before every sample completed sends
``Abort([request_id])`` to the worker, so the engine stops computing and frees
the request's KV instead of finishing work nobody will read.

gRPC failures surface unchanged as :class:`grpc.aio.AioRpcError`; the caller maps
them with :func:`tandem.errors.error_from_grpc`, using :attr:`GenerateStream.started`
to tell "failed to start" from "stream error".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.vllm.frames import frame_of
from tandem.gateway.backends.vllm.labels import model_id_of, worker_labels
from tandem.gateway.workers.protocol import WorkerDescription
from tandem.wire.pixel_splice import serialize_with_pixels
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import common, pb, pb_grpc
from tandem.wire.worker_marker import TANDEM_WORKER_METADATA_KEY

log = logging.getLogger("tandem.gateway.workers")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DEFAULT_CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
    "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    # gRPC's default reconnect backoff grows to two minutes. A worker restarted on its
    # address must be found by the next health check (issue 38: back within two
    # intervals at 1 s): the channel retries a refused connection every 0.5 s at most,
    # a cheap failed connect while the worker is down.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 500,
}
KV_RELEASE_METHOD = "/tandem.kv.KvTransfer/Release"
# Call ends that happened on our side: the worker may not know the request is dead.
_LOCAL_END_CODES = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED})


class GenerateStream:
    """Async iterator over one ``Generate`` call's frames, read into neutral frames.

    Abandoning it early (``break`` out of ``async for``, cancelling the consuming
    task, leaving ``async with`` or calling :meth:`aclose`) cancels the call and
    sends ``Abort`` for its request id, unless a ``complete`` frame already arrived
    for each of the ``n`` samples or the worker ended the call itself.
    """

    def __init__(
        self,
        call: grpc.aio.UnaryStreamCall,
        request_id: str,
        n: int,
        on_drop: Callable[[str], None],
    ) -> None:
        self.request_id = request_id
        self.n = n
        self.started = False  # a first frame arrived: later errors are stream errors
        self._call = call
        self._on_drop = on_drop
        self._completed = 0
        self._ended = False  # the call is over; nothing left on the worker to abort

    @property
    def completed(self) -> bool:
        """Every sample got its ``complete`` frame."""
        return self._completed >= self.n

    def __aiter__(self) -> GenerateStream:
        return self

    async def __anext__(self) -> Frame:
        if self._ended:
            raise StopAsyncIteration
        try:
            message = await self._call.read()
        except asyncio.CancelledError:
            self._drop()
            raise
        except grpc.aio.AioRpcError as err:
            if err.code() in _LOCAL_END_CODES:
                self._drop()
            self._ended = True
            raise
        if message is grpc.aio.EOF:
            self._ended = True
            raise StopAsyncIteration
        self.started = True
        frame = frame_of(message)
        if frame.final:
            self._completed += 1
        return frame

    async def aclose(self) -> None:
        self._drop()

    async def __aenter__(self) -> GenerateStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._drop()

    def __del__(self) -> None:
        # The plain ``async for … : break`` pattern drops the last reference right here.
        with contextlib.suppress(Exception):
            self._drop()

    def _drop(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self.completed:
            return
        self._call.cancel()
        self._on_drop(self.request_id)


class VllmClient:
    """One gRPC channel to one vLLM-protocol worker ("host:port"); a
    :class:`~tandem.gateway.workers.protocol.WorkerClient`."""

    def __init__(
        self,
        url: str,
        *,
        options: Sequence[tuple[str, Any]] = (),
        abort_timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self.abort_timeout_s = abort_timeout_s
        merged = {**DEFAULT_CHANNEL_OPTIONS, **dict(options)}
        self._channel = grpc.aio.insecure_channel(url, options=list(merged.items()))
        self._stub = pb_grpc.VllmEngineStub(self._channel)
        # Generate with a request the caller serialized itself (pixels outside the message).
        self._generate_raw = self._channel.unary_stream(
            "/vllm.grpc.engine.VllmEngine/Generate",
            request_serializer=bytes,
            response_deserializer=pb.GenerateResponse.FromString,
        )
        self._background: set[asyncio.Task[None]] = set()

    async def describe(self, timeout: float) -> WorkerDescription:
        """``GetModelInfo`` and ``GetServerInfo`` (with the Tandem marker) read into labels;
        ValueError when the worker names no model."""
        model_info, (server_info, marker) = await asyncio.gather(
            self.get_model_info(timeout=timeout, wait_for_ready=True),
            self.get_server_info_and_marker(timeout=timeout, wait_for_ready=True),
        )
        model_id = model_id_of(model_info)
        if not model_id:
            raise ValueError(f"worker {self.url} reported neither a served model name nor a path")
        return WorkerDescription(model_id, worker_labels(model_info, server_info, marker))

    async def get_model_info(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> pb.GetModelInfoResponse:
        return await self._stub.GetModelInfo(
            pb.GetModelInfoRequest(), timeout=timeout, wait_for_ready=wait_for_ready
        )

    async def get_server_info(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> pb.GetServerInfoResponse:
        return await self._stub.GetServerInfo(
            pb.GetServerInfoRequest(), timeout=timeout, wait_for_ready=wait_for_ready
        )

    async def get_server_info_and_marker(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> tuple[pb.GetServerInfoResponse, str]:
        """``GetServerInfo`` and the Tandem worker marker of its trailing metadata ("" if none).

        See :mod:`tandem.wire.worker_marker`: only Tandem workers send the marker.
        """
        call = self._stub.GetServerInfo(
            pb.GetServerInfoRequest(), timeout=timeout, wait_for_ready=wait_for_ready
        )
        response = await call
        trailing = await call.trailing_metadata()
        marker = next((str(v) for k, v in trailing or () if k == TANDEM_WORKER_METADATA_KEY), "")
        return response, marker

    async def health_check(self, timeout: float = 2.0) -> bool:
        """True iff the worker answered in time and said it is healthy."""
        try:
            reply = await self._stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            log.debug("health check of %s failed: %s", self.url, err.code().name)
            return False
        return bool(reply.healthy)

    async def get_loads(
        self, timeout: float | None = None, dp_rank: int | None = None
    ) -> pb.GetLoadsResponse:
        request = pb.GetLoadsRequest()
        if dp_rank is not None:
            request.dp_rank = dp_rank
        return await self._stub.GetLoads(request, timeout=timeout)

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        """The worker's tokenizer archive (zip bytes), checked against its sha256."""
        parts: list[bytes] = []
        digest = ""
        call = self._stub.GetTokenizer(common.GetTokenizerRequest(), timeout=timeout)
        async for chunk in call:
            parts.append(chunk.data)
            digest = chunk.sha256  # only the final chunk carries it
        data = b"".join(parts)
        if not digest:
            raise ValueError(f"tokenizer from {self.url} came without a sha256 fingerprint")
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest.strip().lower():
            raise ValueError(
                f"tokenizer from {self.url} failed its sha256 check: "
                f"expected {digest}, got {actual} over {len(data)} bytes"
            )
        return data

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        await self._stub.Abort(
            pb.AbortRequest(request_ids=list(request_ids)),
            timeout=self.abort_timeout_s if timeout is None else timeout,
        )

    def generate(
        self,
        request: pb.GenerateRequest,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> GenerateStream:
        """Start ``Generate``; errors (even "could not connect") surface while iterating.

        ``pixels`` (kept outside the message) are serialized here, once, into the outgoing
        bytes; the caller may drop its reference as soon as this returns. ``on_done`` runs
        when the call ends, however it ends (the leg's shared-memory segments go then).
        """
        if pixels is None:
            call = self._stub.Generate(request, timeout=timeout)
        else:
            call = self._generate_raw(serialize_with_pixels(request, pixels), timeout=timeout)
        if on_done is not None:
            call.add_done_callback(lambda _call: on_done())
        n = max(1, request.sampling_params.n)
        return GenerateStream(call, request.request_id, n, self._abort_in_background)

    async def release_kv(self, transfer_id: str, timeout: float = 2.0) -> bool:
        """Tell a Tandem prefill worker to drop the KV it holds under ``transfer_id``.

        Tandem's KV side channel (``tandem.kv.KvTransfer/Release``) answers on the same
        port; other workers have no such call (their KV waits for its lease or timeout).
        """
        call = self._channel.unary_unary(
            KV_RELEASE_METHOD,
            request_serializer=lambda value: json.dumps(value).encode(),
            response_deserializer=json.loads,
        )
        reply = await call({"transfer_id": transfer_id}, timeout=timeout)
        return bool(reply.get("released"))

    async def close(self, grace: float | None = None) -> None:
        """Let pending aborts go out, then close the channel (``grace`` for live calls)."""
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.abort_timeout_s)
        await self._channel.close(grace)

    def _abort_in_background(self, request_id: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            log.warning("cannot abort %s on %s: no running event loop", request_id, self.url)
            return
        task = loop.create_task(self._abort_quietly(request_id))
        # Keep a reference: the loop holds tasks weakly.
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await self.abort([request_id])
            log.debug("aborted %s on %s", request_id, self.url)
        except Exception as err:  # fire-and-forget: a failed abort must not hurt the caller
            log.warning("abort of %s on %s failed: %s", request_id, self.url, err)

    def __repr__(self) -> str:
        return f"WorkerClient({self.url!r})"
