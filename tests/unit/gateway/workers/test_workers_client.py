"""VllmClient against a real grpc.aio server on 127.0.0.1 (a protocol-level test double,
see workers_fake_engine.py): abort-on-drop, start vs stream errors, tokenizer checks."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from workers_fake_engine import TOKENIZER_ZIP, FakeEngineWorker, free_port

from tandem.gateway.backends.frames import Frame
from tandem.gateway.backends.grpc_client import LegStream
from tandem.gateway.backends.vllm.client import VllmClient
from tandem.gateway.workers.worker import EngineLoad
from tandem.wire.proto import pb

pytestmark = pytest.mark.timeout(10)
WAIT = 3.0  # upper bound on every wait below; the happy path takes milliseconds


def request(rid: str = "req-1", n: int = 1) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]),
        sampling_params=pb.SamplingParams(n=n, max_tokens=4),
    )


async def drain(stream: LegStream) -> list[Frame]:
    return [frame async for frame in stream]


async def test_full_stream_yields_chunks_then_complete_and_sends_no_abort(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    stream = client.generate(request())
    frames = await asyncio.wait_for(drain(stream), WAIT)
    kinds = ["complete" if f.final else "chunk" for f in frames]
    assert kinds == ["chunk"] * fake_worker.state.frames_per_sample + ["complete"]
    assert stream.started and stream.completed
    del stream
    await client.close()  # waits for any pending abort, so an abort would be visible now
    assert fake_worker.state.aborted == []


async def test_break_after_every_sample_completed_sends_no_abort(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    completes = 0
    async for frame in client.generate(request(n=2)):
        completes += frame.final
        if completes == 2:
            break  # EOF not read yet, but nothing is left running on the worker
    await client.close()
    assert fake_worker.state.aborted == []


async def test_break_early_sends_abort_with_request_id(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    async for _frame in client.generate(request("rid-break")):
        break  # the plain pattern: no aclose, no context manager
    await asyncio.wait_for(fake_worker.state.abort_seen.wait(), WAIT)
    assert fake_worker.state.aborted == ["rid-break"]


async def test_break_before_last_sample_completes_sends_abort(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    async with client.generate(request("rid-n2", n=2)) as stream:
        async for frame in stream:
            if frame.final:
                break  # sample 0 done, sample 1 still running
    await asyncio.wait_for(fake_worker.state.abort_seen.wait(), WAIT)
    assert fake_worker.state.aborted == ["rid-n2"]


async def test_aclose_sends_abort_once(fake_worker: FakeEngineWorker, client: VllmClient) -> None:
    stream = client.generate(request("rid-close"))
    await asyncio.wait_for(anext(stream), WAIT)
    await stream.aclose()
    await stream.aclose()
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    await asyncio.wait_for(fake_worker.state.abort_seen.wait(), WAIT)
    await client.close()
    assert fake_worker.state.aborted == ["rid-close"]


async def test_cancelled_consumer_sends_abort(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    got_first = asyncio.Event()

    async def consume() -> None:
        async for _ in client.generate(request("rid-cancel")):
            got_first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_first.wait(), WAIT)
    fake_worker.state.frame_delay_s = 0.5  # the consumer is now parked inside a read
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT)
    await asyncio.wait_for(fake_worker.state.abort_seen.wait(), WAIT)
    assert fake_worker.state.aborted == ["rid-cancel"]


async def test_failure_before_first_message_is_not_started(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    fake_worker.state.fail_at_start = grpc.StatusCode.INVALID_ARGUMENT
    stream = client.generate(request())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(anext(stream), WAIT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not stream.started
    await client.close()
    assert fake_worker.state.aborted == []  # the worker ended the call itself


async def test_failure_mid_stream_is_started(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    fake_worker.state.fail_after_first = grpc.StatusCode.INTERNAL
    stream = client.generate(request())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(drain(stream), WAIT)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert stream.started


async def test_deadline_exceeded_aborts_on_the_worker(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    fake_worker.state.frame_delay_s = 1.0
    stream = client.generate(request("rid-deadline"), timeout=0.1)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(drain(stream), WAIT)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(fake_worker.state.abort_seen.wait(), WAIT)
    assert fake_worker.state.aborted == ["rid-deadline"]


async def test_unreachable_worker_fails_before_start() -> None:
    client = VllmClient(f"127.0.0.1:{free_port()}")
    stream = client.generate(request())
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await asyncio.wait_for(anext(stream), WAIT)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not stream.started
    await client.close()


async def test_tokenizer_concatenates_chunks_and_checks_sha256(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    assert await asyncio.wait_for(client.get_tokenizer(), WAIT) == TOKENIZER_ZIP


@pytest.mark.parametrize("digest", ["0" * 64, ""], ids=["wrong", "missing"])
async def test_tokenizer_with_bad_or_missing_sha256_raises(
    fake_worker: FakeEngineWorker, client: VllmClient, digest: str
) -> None:
    fake_worker.state.tokenizer_sha256 = digest
    with pytest.raises(ValueError, match="sha256"):
        await asyncio.wait_for(client.get_tokenizer(), WAIT)


async def test_info_health_and_loads(fake_worker: FakeEngineWorker, client: VllmClient) -> None:
    info = await asyncio.wait_for(client.get_model_info(timeout=WAIT), WAIT)
    assert info.model_path == "/models/tiny-qwen3-vl"
    server = await asyncio.wait_for(client.get_server_info(timeout=WAIT), WAIT)
    assert server.mm_processor == "inprocess"
    loads = await asyncio.wait_for(client.get_loads(timeout=WAIT), WAIT)
    assert loads.loads[0].num_running_reqs == 2
    assert await client.engine_load(timeout=WAIT) == EngineLoad(running=2, waiting=1)
    assert await client.health_check(timeout=WAIT) is True
    fake_worker.state.healthy = False
    assert await client.health_check(timeout=WAIT) is False


async def test_explicit_abort_reaches_worker(
    fake_worker: FakeEngineWorker, client: VllmClient
) -> None:
    await asyncio.wait_for(client.abort(["a", "b"]), WAIT)
    assert fake_worker.state.aborted == ["a", "b"]
