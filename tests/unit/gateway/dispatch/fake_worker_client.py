"""A handler-driven fake of the gateway's worker client, for fast dispatch tests.

Like httpx's ``MockTransport``: a test gives a *handler* per worker, a function of
``(url, GenerateRequest)`` that returns the frames the worker streams back (a list, or
an async iterator that may wait on the test's events) or raises the worker's gRPC error
(fake_worker_scripts.py has frames and ready-made handlers). The fake plugs in through
``WorkerRegistry(client_factory=...)``, so the real dispatchers, selection, retries and
KV release run unchanged; only the gRPC channel is gone. A fake is needed because real
workers cannot be told to fail, stall or answer one leg at a precise moment; the
real-process tests (tests/integration/test_pd_gateway.py) cover the same flows end to end.

Everything a worker would see is recorded: each Generate (a copy of its message as sent,
with its pixel payload), each Abort, each KV release, and how each stream ended.

Kept out of conftest.py under a unique module name so test modules can import it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import grpc
from fake_worker_scripts import Handler, well_behaved

from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.vllm.frames import frame_of
from tandem.gateway.backends.vllm.labels import model_id_of, worker_labels
from tandem.gateway.workers.protocol import WorkerClient, WorkerDescription
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest, pb
from tandem.wire.worker_marker import TANDEM_WORKER_METADATA_KEY

MODEL = "tiny-qwen3-vl"

# Call ends that happen on the gateway's side: the real client sends Abort for them too.
_LOCAL_END_CODES = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(slots=True)
class WorkerInfo:
    """What a worker reports about itself (GetModelInfo, GetServerInfo and its marker)."""

    model: str = MODEL
    supports_vision: bool = True
    kv_connector: str = ""  # "TandemConnector", "NixlConnector", "" (none)
    kv_role: str = ""
    mm_processor: str = ""  # non-empty: the worker takes media_refs
    mm_media_ref_schemes: str = ""
    tandem_marker: str = ""  # the ``tandem-worker`` trailing metadata; "" for vLLM

    @classmethod
    def tandem(cls, **overrides: Any) -> WorkerInfo:
        """A Tandem worker: TandemConnector, media_refs capable, sends the marker."""
        base = cls(
            kv_connector="TandemConnector",
            mm_processor="tandem",
            mm_media_ref_schemes="data,http,https",
            tandem_marker="0.test",
        )
        return replace(base, **overrides)

    @classmethod
    def vllm_nixl(cls, **overrides: Any) -> WorkerInfo:
        """A vLLM worker with NIXL: no minted transfer ids, no release call, no marker."""
        return replace(cls(kv_connector="NixlConnector"), **overrides)

    def model_info(self) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(
            served_model_name=self.model,
            model_path=f"/models/{self.model}",
            is_generation=True,
            supports_vision=self.supports_vision,
        )

    def server_info(self) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            server_type="vllm-grpc",
            kv_connector=self.kv_connector,
            kv_role=self.kv_role,
            mm_processor=self.mm_processor,
            mm_media_ref_schemes=self.mm_media_ref_schemes,
        )

    def trailing_metadata(self) -> grpc.aio.Metadata:
        """GetServerInfo's trailing metadata: a Tandem worker adds its marker there."""
        if not self.tandem_marker:
            return grpc.aio.Metadata()
        return grpc.aio.Metadata((TANDEM_WORKER_METADATA_KEY, self.tandem_marker))


class FakeGenerateStream:
    """``GenerateStream``'s contract without a channel.

    The handler runs on the first read (a real call's failure, even "could not connect",
    also surfaces while iterating). Dropping the stream (``aclose``, a cancelled read, a
    call ended on our side, garbage collection) records an Abort unless every one of the
    ``n`` samples completed or the worker ended the call itself.
    """

    def __init__(self, worker: FakeWorkerClient, request: GenerateRequest, handler: Handler):
        self.request_id = request.request_id
        self.n = max(1, request.sampling_params.n)
        self.started = False  # a first frame was read: later errors are stream errors
        self.reading = False  # the gateway asked for a frame: the call reached the worker
        self.aborted = False  # an Abort went to the worker for this stream
        self.closed = False  # the gateway called aclose
        self.ended_by_worker = False  # EOF or an error from the worker
        self.frames_sent = 0
        self._worker = worker
        self._request = request
        self._handler = handler
        self._source: AsyncIterator[pb.GenerateResponse] | None = None
        self._completed = 0
        self._ended = False

    @property
    def completed(self) -> bool:
        return self._completed >= self.n

    def __aiter__(self) -> FakeGenerateStream:
        return self

    async def __anext__(self) -> Frame:
        if self._ended:
            raise StopAsyncIteration
        self.reading = True
        try:
            if self._source is None:
                self._source = await self._open()
            message = await anext(self._source)
        except StopAsyncIteration:
            self._ended = self.ended_by_worker = True
            raise
        except grpc.aio.AioRpcError as err:
            if err.code() in _LOCAL_END_CODES:
                self._drop()
            self._ended = self.ended_by_worker = True
            raise
        except BaseException:  # a cancelled read (the gateway gave up) drops the call
            self._drop()
            raise
        self.started = True
        self.frames_sent += 1
        frame = frame_of(message)  # as the real client reads the wire
        if frame.final:
            self._completed += 1
        return frame

    async def _open(self) -> AsyncIterator[pb.GenerateResponse]:
        result = self._handler(self._worker.url, self._request)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, Sequence):
            return _iterate(list(result))
        return result

    async def aclose(self) -> None:
        self.closed = True
        self._drop()
        if self._source is not None and hasattr(self._source, "aclose"):
            with contextlib.suppress(BaseException):
                await self._source.aclose()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._drop()

    def _drop(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self.completed:
            return
        self.aborted = True
        self._worker.record_abort(self.request_id)


async def _iterate(frames: list[pb.GenerateResponse]) -> AsyncIterator[pb.GenerateResponse]:
    for frame in frames:
        yield frame


@dataclass(slots=True)
class GenerateCall:
    """One Generate as the worker received it."""

    url: str
    request: GenerateRequest  # a copy taken when it was sent
    pixels: PixelPayload | None
    timeout: float | None
    stream: FakeGenerateStream


@dataclass(slots=True)
class FakeWorkers:
    """The scripted workers, their handlers and everything they were sent.

    ``handlers`` by URL, else ``handler`` (default: :func:`well_behaved`).
    """

    infos: dict[str, WorkerInfo] = field(default_factory=dict)
    handlers: dict[str, Handler] = field(default_factory=dict)
    handler: Handler | None = None
    calls: list[GenerateCall] = field(default_factory=list)
    aborts: list[tuple[str, str]] = field(default_factory=list)  # (url, request id)
    releases: list[tuple[str, str]] = field(default_factory=list)  # (url, transfer id)
    release_error: grpc.aio.AioRpcError | None = None
    clients: dict[str, FakeWorkerClient] = field(default_factory=dict)
    loads: dict[str, EngineLoad] = field(default_factory=dict)  # GetLoads, by URL

    def factory(self, url: str) -> WorkerClient:
        """The registry's ``client_factory``: one fake client per worker URL."""
        client = FakeWorkerClient(url, self)
        self.clients[url] = client
        # The registry is typed against the client protocol; the fake has its methods.
        return cast(WorkerClient, client)

    def handler_for(self, url: str) -> Handler:
        return self.handlers.get(url) or self.handler or well_behaved

    def calls_to(self, url: str) -> list[GenerateCall]:
        return [c for c in self.calls if c.url == url]


class FakeWorkerClient:
    """``WorkerClient``'s methods over :class:`FakeWorkers` (no channel, no sockets)."""

    def __init__(self, url: str, workers: FakeWorkers) -> None:
        self.url = url
        self.workers = workers
        self.closed = False

    @property
    def info(self) -> WorkerInfo:
        return self.workers.infos.get(self.url) or WorkerInfo()

    async def describe(self, timeout: float) -> WorkerDescription:
        """As the real client reads its two info calls into labels."""
        model_info = await self.get_model_info()
        server_info, marker = await self.get_server_info_and_marker()
        labels = worker_labels(model_info, server_info, marker)
        return WorkerDescription(model_id_of(model_info), labels)

    async def get_model_info(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> pb.GetModelInfoResponse:
        return self.info.model_info()

    async def get_server_info(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> pb.GetServerInfoResponse:
        return self.info.server_info()

    async def get_server_info_and_marker(
        self, timeout: float | None = None, wait_for_ready: bool = False
    ) -> tuple[pb.GetServerInfoResponse, str]:
        # Read out of the trailing metadata as the real client does: only Tandem sends it.
        trailing = self.info.trailing_metadata()
        marker = next((str(v) for k, v in trailing if k == TANDEM_WORKER_METADATA_KEY), "")
        return self.info.server_info(), marker

    async def health_check(self, timeout: float = 2.0) -> bool:
        return True

    async def engine_load(self, timeout: float = 2.0) -> EngineLoad | None:
        return self.workers.loads.get(self.url)  # what a test says the engine reports

    async def get_loads(
        self, timeout: float | None = None, dp_rank: int | None = None
    ) -> pb.GetLoadsResponse:
        return pb.GetLoadsResponse()

    async def get_tokenizer(self, timeout: float | None = None) -> bytes:
        raise NotImplementedError("load the model from a directory (qwen_meta_dir) instead")

    async def abort(self, request_ids: Sequence[str], timeout: float | None = None) -> None:
        for request_id in request_ids:
            self.record_abort(request_id)

    def record_abort(self, request_id: str) -> None:
        # Synchronous, unlike the real client's background Abort: tests read it at once.
        self.workers.aborts.append((self.url, request_id))

    def generate(
        self,
        request: GenerateRequest,
        timeout: float | None = None,
        pixels: PixelPayload | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> FakeGenerateStream:
        # on_done releases a leg's shared-memory segments; unit tests send tensors inline,
        # so there is nothing to release and no call end to hook it to.
        sent = GenerateRequest()
        sent.CopyFrom(request)  # the real client serializes before returning
        stream = FakeGenerateStream(self, sent, self.workers.handler_for(self.url))
        self.workers.calls.append(GenerateCall(self.url, sent, pixels, timeout, stream))
        return stream

    async def release_kv(self, transfer_id: str, timeout: float = 2.0) -> bool:
        self.workers.releases.append((self.url, transfer_id))
        if self.workers.release_error is not None:
            raise self.workers.release_error
        return True

    async def close(self, grace: float | None = None) -> None:
        self.closed = True
