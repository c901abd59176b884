"""The fake worker client keeps the real client's contract, so dispatch tests over it hold.

The same cases run against the real ``GenerateStream`` over gRPC in
tests/unit/gateway/workers/test_workers_client.py.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from dispatch_bench import wait_until
from fake_worker_client import FakeWorkerClient, FakeWorkers, WorkerInfo
from fake_worker_scripts import Frames, chunk, complete, held, rpc_error

from tandem.gateway.workers.registry import WorkerRegistry
from tandem.wire.proto import GenerateRequest, pb

URL = "127.0.0.1:7401"


def client(
    *frames: pb.GenerateResponse, error: grpc.aio.AioRpcError | None = None
) -> tuple[FakeWorkers, FakeWorkerClient]:
    """A worker that streams ``frames``, or fails with ``error``."""

    def handler(url: str, request: GenerateRequest) -> Frames:
        if error is not None:
            raise error
        return frames

    workers = FakeWorkers(handler=handler)
    return workers, FakeWorkerClient(URL, workers)


def request(n: int = 1) -> GenerateRequest:
    req = GenerateRequest(request_id="r-1")
    req.sampling_params.n = n
    return req


async def test_a_full_stream_sends_no_abort() -> None:
    workers, fake = client(chunk([1]), complete([1]))
    stream = fake.generate(request())
    assert ["complete" if f.final else "chunk" async for f in stream] == ["chunk", "complete"]
    await stream.aclose()
    assert workers.aborts == [] and stream.ended_by_worker


async def test_closing_once_every_sample_completed_sends_no_abort() -> None:
    workers, fake = client(complete([1], 0), complete([2], 1), chunk([3]))
    stream = fake.generate(request(n=2))
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    assert workers.aborts == []


@pytest.mark.parametrize("read", [0, 1])
async def test_closing_early_sends_one_abort(read: int) -> None:
    workers, fake = client(chunk([1]), complete([1]))
    stream = fake.generate(request())
    for _ in range(read):
        await anext(stream)
    await stream.aclose()
    await stream.aclose()
    assert workers.aborts == [(URL, "r-1")] and stream.closed


async def test_a_cancelled_read_sends_abort() -> None:
    workers = FakeWorkers(handler=lambda url, req: held(asyncio.Event().wait(), []))
    stream = FakeWorkerClient(URL, workers).generate(request())
    reader = asyncio.ensure_future(anext(stream))
    await wait_until(lambda: stream.reading)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert workers.aborts == [(URL, "r-1")]


@pytest.mark.parametrize(
    "code,aborted",
    [(grpc.StatusCode.DEADLINE_EXCEEDED, True), (grpc.StatusCode.UNAVAILABLE, False)],
)
async def test_only_a_call_ended_on_our_side_is_aborted(
    code: grpc.StatusCode, aborted: bool
) -> None:
    workers, fake = client(error=rpc_error(code))
    stream = fake.generate(request())
    with pytest.raises(grpc.aio.AioRpcError):
        await anext(stream)
    assert not stream.started
    await stream.aclose()
    assert workers.aborts == ([(URL, "r-1")] if aborted else [])


async def test_the_request_is_recorded_as_sent() -> None:
    workers, fake = client(complete())
    req = request()
    fake.generate(req, timeout=3.0)
    req.request_id = "changed-after-send"
    (call,) = workers.calls
    assert call.request.request_id == "r-1" and call.timeout == 3.0 and call.pixels is None


async def test_registration_reads_the_labels_and_the_tandem_marker() -> None:
    workers = FakeWorkers(
        infos={
            "127.0.0.1:7501": WorkerInfo.tandem(),
            "127.0.0.1:7502": WorkerInfo.vllm_nixl(supports_vision=False),
        }
    )
    registry = WorkerRegistry(client_factory=workers.factory)
    tandem = await registry.add("127.0.0.1:7501", "prefill")
    vllm = await registry.add("127.0.0.1:7502", "decode")

    assert tandem.role == "prefill" and tandem.kv_connector == "TandemConnector"
    assert tandem.enforces_tandem_media_policy and tandem.accepts_media_refs
    assert tandem.supports_vision and tandem.model_id == "tiny-qwen3-vl"
    assert vllm.role == "decode" and vllm.kv_connector == "NixlConnector"
    assert not vllm.enforces_tandem_media_policy and not vllm.accepts_media_refs
    assert vllm.language_model_only
    await registry.close()
    assert all(c.closed for c in workers.clients.values())
