"""TensorRT-LLM answers read into the gateway's frames and collected into choices: chunks
routed by ``sequence_index``, one complete per sequence (n = 2 ends after both), the
finish reason normalized ("stop_word" is "stop"), logprobs with their alternatives, both
when the worker streams and when it does not; over a real loopback stand-in worker."""

from __future__ import annotations

from typing import Any

import pytest
from trtllm_standin import StandinServer, StandinState, eventually, top_logprob

from tandem.gateway.backends.trtllm.backend import TrtllmBackend
from tandem.gateway.backends.trtllm.client import TrtllmClient
from tandem.gateway.backends.trtllm.frames import (
    finish_reason,
    logprob_entries,
    prompt_logprob_entries,
    trtllm_frame,
)
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.logprobs import LogprobEntry
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.events import ChoiceFinished, TextDelta
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.gateway.pipeline.respond import collect, stream_events
from tandem.wire.trtllm import trpb


def test_a_chunk_is_one_sequences_new_tokens() -> None:
    chunk = trpb.GenerateStreamChunk(token_ids=[4, 5], sequence_index=1, prompt_tokens=9)
    chunk.logprobs.add(token_id=4, logprob=-0.5).top_logprobs.add(token_id=4, logprob=-0.5)
    chunk.logprobs.add(token_id=5, logprob=-1.5)
    frame = trtllm_frame(trpb.GenerateResponse(request_id="r", chunk=chunk))
    assert frame is not None and not frame.final
    assert (frame.index, list(frame.token_ids)) == (1, [4, 5])
    assert frame.logprobs is not None
    assert frame.logprobs() == [LogprobEntry(4, -0.5, ((4, -0.5),)), LogprobEntry(5, -1.5)]
    bare = trtllm_frame(trpb.GenerateResponse(chunk=trpb.GenerateStreamChunk(token_ids=[1])))
    assert bare is not None and bare.logprobs is None


@pytest.mark.parametrize(
    ("wire", "client"),
    [
        ("stop_word", "stop"),
        ("stop", "stop"),
        ("length", "length"),
        ("", "stop"),
        ("abort", "abort"),
    ],
)
def test_a_complete_ends_its_sequence(wire: str, client: str) -> None:
    done = trpb.GenerateComplete(
        output_token_ids=[1, 2, 3],
        sequence_index=2,
        finish_reason=wire,
        matched_token_id=3,
        prompt_tokens=7,
        completion_tokens=3,
        cached_tokens=4,
    )
    frame = trtllm_frame(trpb.GenerateResponse(complete=done))
    assert frame is not None and frame.final and frame.logprobs is None
    assert (frame.index, list(frame.token_ids), frame.finish_reason) == (2, [1, 2, 3], client)
    assert (frame.prompt_tokens, frame.cached_tokens) == (7, 4)
    assert finish_reason(" STOP_WORD ") == "stop"


def test_a_response_with_neither_part_carries_nothing() -> None:
    assert trtllm_frame(trpb.GenerateResponse(request_id="r")) is None


def test_prompt_logprobs_have_no_value_at_the_first_position() -> None:
    entries = [trpb.TokenLogprob(token_id=t, logprob=-float(t)) for t in (7, 8, 9)]
    assert prompt_logprob_entries(entries) == [None, LogprobEntry(8, -8.0), LogprobEntry(9, -9.0)]
    assert prompt_logprob_entries([]) == []
    assert logprob_entries(entries)[0] == LogprobEntry(7, -7.0)


@pytest.fixture(scope="module")
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    return ModelHandle.from_dir(request.getfixturevalue("qwen_meta_dir"), "tiny-qwen3-vl")


def context(handle: ModelHandle, **fields: Any) -> RequestContext:
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )
    ctx = RequestContext("chat", "req-7", body.generation(), handle)
    build_prompt(ctx)
    TrtllmBackend().build_request(ctx)
    return ctx


def scripted(handle: ModelHandle) -> tuple[StandinState, list[str]]:
    texts = ["alpha beta gamma", "delta epsilon"]
    state = StandinState(
        answers=[handle.encode(t) for t in texts],
        finish_reasons=["stop_word", "length"],
        prompt_tokens=6,
        cached_tokens=2,
    )
    return state, texts


def opened(client: TrtllmClient, ctx: RequestContext) -> OpenedStream:
    return OpenedStream(client.generate(ctx.wire, timeout=10.0), lambda ok: None)


@pytest.mark.parametrize("streamed", [False, True], ids=["completes", "chunks"])
async def test_n_2_collects_into_two_choices(handle: ModelHandle, streamed: bool) -> None:
    state, texts = scripted(handle)
    fields: dict[str, Any] = {"n": 2, "logprobs": True, "top_logprobs": 2}
    if streamed:
        fields["stop"] = ["never-said"]  # the gateway's own stops make the worker stream
    ctx = context(handle, **fields)
    assert ctx.wire.streaming is streamed
    async with StandinServer(state) as server:
        client = TrtllmClient(server.url)
        try:
            answer = await collect(ctx, opened(client, ctx))
        finally:
            await client.close()
    assert [c.text for c in answer.choices] == texts
    assert [c.finish_reason for c in answer.choices] == ["stop", "length"]
    for i, choice in enumerate(answer.choices):
        tokens = state.answers[i]
        assert choice.logprobs is not None
        assert [(e.token_id, e.logprob) for e in choice.logprobs] == [
            (t, pytest.approx(top_logprob(i, p))) for p, t in enumerate(tokens)
        ]
        assert [e.top[1][0] for e in choice.logprobs] == [40] * len(tokens)
    assert len(state.requests) == 1  # one request for both: num_return_sequences
    assert state.requests[0].sampling_config.num_return_sequences == 2
    usage = answer.usage
    assert (usage.prompt_tokens, usage.cached_tokens) == (6, 2)
    assert usage.completion_tokens == sum(len(a) for a in state.answers)
    assert state.aborts == []  # every sequence completed: nothing to abort


async def test_streamed_events_follow_each_sequence(handle: ModelHandle) -> None:
    state, texts = scripted(handle)
    ctx = context(handle, n=2, stream=True)
    got = ["", ""]
    finished: dict[int, str] = {}
    async with StandinServer(state) as server:
        client = TrtllmClient(server.url)
        try:
            async for event in stream_events(ctx, opened(client, ctx)):
                if isinstance(event, TextDelta):
                    got[event.choice] += event.text
                elif isinstance(event, ChoiceFinished):
                    finished[event.choice] = event.reason
        finally:
            await client.close()
    assert got == texts and finished == {0: "stop", 1: "length"}


async def test_a_dropped_stream_aborts_its_request(handle: ModelHandle) -> None:
    state, _ = scripted(handle)
    state.hang_after_first = True
    ctx = context(handle, stream=True)
    async with StandinServer(state) as server:
        client = TrtllmClient(server.url)
        try:
            stream = client.generate(ctx.wire, timeout=30.0)
            first = await anext(stream)
            assert not first.final and list(first.token_ids) == state.answers[0][:1]
            await stream.aclose()
            await eventually(lambda: state.aborts == ["req-7"])
            await eventually(state.cancelled.is_set)
        finally:
            await client.close()
    assert state.methods.count("/trtllm.TrtllmService/Abort") == 1
