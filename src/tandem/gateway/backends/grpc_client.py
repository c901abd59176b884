"""What every gRPC worker client shares, whatever protocol its messages are in.

The channel (options that find a restarted worker quickly), *abort-on-drop* for a leg's
stream (a stream the caller abandons before every sample completed cancels the call and
sends the protocol's ``Abort``, so the engine stops and frees the request's KV), the
tokenizer archive checked against its digest, Tandem's KV release call, and closing with
the pending aborts sent. Each protocol's client (``backends/<name>/client.py``) adds its
messages: how it describes itself, its frames, its ``Abort``.

gRPC failures surface unchanged as :class:`grpc.aio.AioRpcError`; the caller maps them
with :func:`tandem.errors.error_from_grpc`, using :attr:`LegStream.started` to tell
"failed to start" from "stream error".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2

from tandem.gateway.backends.frames import Frame
from tandem.wire.h2grpc.call import NOT_READY
from tandem.wire.peer_channels import RECONNECT_OPTIONS
from tandem.wire.worker_marker import TANDEM_WORKER_METADATA_KEY

log = logging.getLogger("tandem.gateway.workers")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DEFAULT_CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
    "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    # gRPC's default reconnect backoff grows to two minutes. A worker restarted on its
    # address must be found by the next health check (issue 38: back within two
    # intervals at 1 s): the channel retries a refused connection every 0.5 s at most,
    # a cheap failed connect while the worker is down. Workers' own peer channels use
    # the same numbers (tandem/wire/peer_channels.py).
    **dict(RECONNECT_OPTIONS),
}
KV_RELEASE_METHOD = "/tandem.kv.KvTransfer/Release"
# Call ends that happened on our side: the worker may not know the request is dead.
_LOCAL_END_CODES = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED})


GARBLED_FRAME = "the worker sent a frame that is not a valid message of its protocol"


WRONG_REQUEST_ID = "the worker answered for another request"


def garbled_frame(details: str = GARBLED_FRAME) -> grpc.aio.AioRpcError:
    """The failure a stream reports for a frame it cannot use (INTERNAL): one that does not
    parse, or one that names another request."""
    return grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), details
    )


def answers_another_request(message: Any, request_id: str) -> bool:
    """Whether ``message`` names a request other than ``request_id``.

    SGLang, TokenSpeed and TensorRT-LLM responses carry the request id (vLLM's and MLX's do
    not: nothing to check). An engine may suffix it per sample ("<id>-1", "<id>_1"), so a
    frame is for us when its id is empty or starts with ours. A frame for another request
    means the worker mixed up streams: passing its tokens on would answer one client with
    another's text, so the call ends as a worker error instead.
    """
    kind = type(message)
    named = _NAMES_REQUEST.get(kind)
    if named is None:
        # Asked once per message type: getattr of a field the type lacks raises inside
        # protobuf, which cost a vLLM stream a few microseconds per frame.
        named = _NAMES_REQUEST[kind] = hasattr(message, "request_id")
    if not named:
        return False
    answered = message.request_id
    return bool(answered) and not answered.startswith(request_id)


_NAMES_REQUEST: dict[type, bool] = {}


class LegStream:
    """Async iterator over one ``Generate`` call's frames, read into neutral frames.

    Abandoning it early (``break`` out of ``async for``, cancelling the consuming
    task, leaving ``async with`` or calling :meth:`aclose`) cancels the call and
    sends ``Abort`` for its request id, unless a final frame already arrived for
    each of the ``n`` samples or the worker ended the call itself.
    """

    def __init__(
        self,
        call: grpc.aio.UnaryStreamCall,
        request_id: str,
        n: int,
        on_drop: Callable[[str], None],
        read_frame: Callable[[Any], Frame | None],
    ) -> None:
        self.request_id = request_id
        self.n = n
        self.started = False  # a first frame arrived: later errors are stream errors
        self._call = call
        self._on_drop = on_drop
        self._read_frame = read_frame
        self._completed = 0
        self._ended = False  # the call is over; nothing left on the worker to abort

    @property
    def completed(self) -> bool:
        """Every sample got its final frame."""
        return self._completed >= self.n

    def __aiter__(self) -> LegStream:
        return self

    async def __anext__(self) -> Frame:
        while True:
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
            frame = self._accept(message)
            if frame is not None:
                return frame

    def ready_frame(self) -> Frame | None:
        """The next frame if its message has arrived already, else None (also where the
        call cannot tell, as grpc.aio's cannot); never waits. Synchronous, so not the
        awaitable ``take_ready`` that ``respond`` looks for: the relay wraps it. The end
        of the call and its failures are left to ``__anext__``."""
        read_ready = getattr(self._call, "read_ready", None)
        while read_ready is not None and not self._ended:
            message = read_ready()
            if message is NOT_READY:
                return None
            frame = self._accept(message)
            if frame is not None:
                return frame
        return None

    def _accept(self, message: Any) -> Frame | None:
        """A message read from the call as a frame (None: it carries nothing)."""
        if message is None:
            # grpc.aio reads a frame that does not deserialize as None: the worker is
            # not speaking this protocol (or its bytes were corrupted). End the call,
            # abort it on the worker, and fail as a worker error in our words.
            self._drop()
            raise garbled_frame()
        if answers_another_request(message, self.request_id):
            log.warning(
                "worker answered request %r on the stream of %r; the call is ended",
                getattr(message, "request_id", ""),
                self.request_id,
            )
            self._drop()
            raise garbled_frame(WRONG_REQUEST_ID)
        self.started = True
        frame = self._read_frame(message)
        if frame is not None and frame.final:
            self._completed += 1
        return frame  # None: neither a chunk nor a completion, nothing to pass on

    async def aclose(self) -> None:
        self._drop()

    async def __aenter__(self) -> LegStream:
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


class GrpcWorkerClient:
    """One gRPC channel to one worker ("host:port"): the protocol-neutral half of a
    :class:`~tandem.gateway.workers.protocol.WorkerClient`."""

    # The full name of the protocol's ``SubscribeKvEvents`` ("" where it has none: MLX).
    kv_events_method = ""

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
        self._background: set[asyncio.Task[None]] = set()
        self._no_loads = False

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        raise NotImplementedError  # each protocol's Abort message

    async def answered_healthy(self, call: Awaitable[Any]) -> bool:
        """True iff a ``HealthCheck`` call answered in time with ``healthy`` set."""
        try:
            reply = await call
        except grpc.aio.AioRpcError as err:
            log.debug("health check of %s failed: %s", self.url, err.code().name)
            return False
        return bool(reply.healthy)

    async def answers(self, call: Awaitable[Any]) -> bool:
        """Whether the worker serves the service of this ``HealthCheck`` call: True for any
        answer (healthy or not), False for UNIMPLEMENTED; other failures are raised."""
        try:
            await call
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                return False
            raise
        return True

    async def read_load(self, call: Awaitable[Any]) -> tuple[int, int] | None:
        """A ``GetLoads`` answer summed over the engine's ranks, (running, waiting) (vLLM's
        and SGLang's ``SchedulerLoad`` name the counts alike); None once the worker said
        it has none."""
        if self._no_loads:
            return None
        try:
            reply = await call
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._no_loads = True  # not asked again
                return None
            raise
        if not reply.loads:
            return None
        return (
            sum(int(load.num_running_reqs) for load in reply.loads),
            sum(int(load.num_waiting_reqs) for load in reply.loads),
        )

    async def with_marker(self, call: Any) -> tuple[Any, str]:
        """A unary call's answer and the Tandem worker marker of its trailing metadata
        ("" if none; :mod:`tandem.wire.worker_marker`: only Tandem workers send it)."""
        response = await call
        trailing = await call.trailing_metadata()
        marker = next((str(v) for k, v in trailing or () if k == TANDEM_WORKER_METADATA_KEY), "")
        return response, marker

    async def read_description(
        self,
        model_info: Awaitable[Any],
        server_info: Any,
        model_id_of: Callable[[Any], str],
        labels_of: Callable[[Any, Any, str], dict[str, str]],
        missing: str = "reported neither a served model name nor a path",
    ) -> tuple[str, dict[str, str]]:
        """The model id and labels read from the protocol's ``GetModelInfo`` and
        ``GetServerInfo`` calls (both asked at once, the latter with the Tandem marker) by
        its own readers; ValueError, with ``missing``, when the worker names no model.
        (A pair, not a ``WorkerDescription``: ``gateway/workers`` imports this package.)"""
        info, (server, marker) = await asyncio.gather(model_info, self.with_marker(server_info))
        model_id = model_id_of(info)
        if not model_id:
            raise ValueError(f"worker {self.url} {missing}")
        return model_id, labels_of(info, server, marker)

    async def read_tokenizer(self, chunks: AsyncIterable[Any]) -> bytes:
        """The archive of a ``GetTokenizer`` stream, checked against its sha256."""
        parts: list[bytes] = []
        digest = ""
        async for chunk in chunks:
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

    def leg_stream(
        self,
        call: grpc.aio.UnaryStreamCall,
        request_id: str,
        n: int,
        read_frame: Callable[[Any], Frame | None],
        on_done: Callable[[], None] | None = None,
    ) -> LegStream:
        """``call`` as a stream that aborts on drop; ``on_done`` runs when the call ends."""
        if on_done is not None:
            call.add_done_callback(lambda _call: on_done())
        return LegStream(call, request_id, max(1, n), self._abort_in_background, read_frame)

    def subscribe_kv_events(
        self, start_sequence_number: int
    ) -> AsyncIterator[common_pb2.KvEventBatch]:
        """Open the worker's KV-event stream (``gateway/kv_events/subscription.py`` reads
        it); load records before the first batch are asked for. No deadline: the stream
        lives as long as the worker, and the caller cancels it."""
        if not self.kv_events_method:
            raise NotImplementedError(f"{type(self).__name__} has no SubscribeKvEvents")
        call = self._channel.unary_stream(
            self.kv_events_method,
            request_serializer=common_pb2.SubscribeKvEventsRequest.SerializeToString,
            response_deserializer=common_pb2.KvEventBatch.FromString,
        )
        request = common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=start_sequence_number, load_records_before_first_batch=True
        )
        stream: AsyncIterator[common_pb2.KvEventBatch] = call(request)
        return stream

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
