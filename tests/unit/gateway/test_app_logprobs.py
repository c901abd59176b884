"""Logprobs from the wire to OpenAI's shapes, through the real app in-process.

The worker side is scripted (a fake, as in the other ``test_app_*`` files): it answers
fixed tokens with made-up logprobs, so these tests pin down how the gateway reads and
renders them. Real engines' logprobs are tested in tests/integration/test_gateway_structured.py.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_app_fakes import MODEL, ScriptedDispatcher, make_gateway, read_wire

from tandem.errors import make_error
from tandem.gateway.app import build_app
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.logprobs import LOGPROB_FLOOR, CompletionLogprobs, TokenStrings
from tandem.gateway.logprobs import LogprobEntry as Entry
from tandem.gateway.model import ModelHandle
from tandem.wire.proto import pb

MESSAGES = [{"role": "user", "content": "Hi"}]
TEXT = "héllo"  # é is two bytes: two byte-level tokens, neither decodable alone


def token_logprob(position: int) -> float:
    return -0.25 * (position + 1)


class LogprobWorker(ScriptedDispatcher):
    """Streams or completes ``TEXT`` with logprobs where the wire request asks for them."""

    def __init__(self, model: ModelHandle) -> None:
        super().__init__(model, TEXT)
        self.seen: list[pb.GenerateRequest] = []

    async def open(self, ctx: RequestContext) -> OpenedStream:
        assert ctx.wire is not None
        self.seen.append(ctx.wire)
        await super().open(ctx)
        return OpenedStream(read_wire(self._answer(ctx.wire)), lambda ok: None)

    def _logprobs(self, positions: range, k: int | None) -> pb.OutputLogProbs:
        out = pb.OutputLogProbs()
        for i in positions:
            out.token_ids.append(self.tokens[i])
            out.token_logprobs.append(token_logprob(i))
            if k:
                # The sampled token first, then made-up alternatives, one of them masked.
                ids = [self.tokens[i], *range(40, 40 + k - 1)]
                values = [token_logprob(i), *[-5.0] * (k - 2), -math.inf][:k]
                out.top_logprobs.append(pb.TopLogProbs(token_ids=ids, values=values))
        return out

    async def _answer(self, wire: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        params = wire.sampling_params
        k = params.logprobs if params.HasField("logprobs") else None
        n = len(self.tokens)
        if wire.stream:
            for i, token in enumerate(self.tokens):
                chunk = pb.GenerateStreamChunk(token_ids=[token])
                if k is not None:
                    chunk.output_logprobs.CopyFrom(self._logprobs(range(i, i + 1), k))
                yield pb.GenerateResponse(chunk=chunk)
            # As vLLM's servicer does, the stream's Complete repeats the last delta.
            done = pb.GenerateComplete(finish_reason="stop", completion_tokens=n)
            if k is not None:
                done.output_logprobs.CopyFrom(self._logprobs(range(n - 1, n), k))
            yield pb.GenerateResponse(complete=done)
            return
        done = pb.GenerateComplete(finish_reason="stop", output_ids=self.tokens)
        if k is not None:
            done.output_logprobs.CopyFrom(self._logprobs(range(n), k))
        yield pb.GenerateResponse(complete=done)


def api(state: Any) -> openai.AsyncOpenAI:
    transport = httpx.ASGITransport(app=build_app(state))
    http = httpx.AsyncClient(transport=transport, base_url="http://gateway.test/v1")
    return openai.AsyncOpenAI(
        base_url="http://gateway.test/v1", api_key="x", http_client=http, max_retries=0
    )


def gateway(qwen_meta_dir: Path) -> tuple[Any, LogprobWorker]:
    state, _ = make_gateway(qwen_meta_dir)
    worker = LogprobWorker(state.model)
    state.dispatcher = worker
    return state, worker


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_logprobs(qwen_meta_dir: Path, stream: bool) -> None:
    state, worker = gateway(qwen_meta_dir)
    async with api(state) as client:
        kwargs: dict[str, Any] = dict(
            model=MODEL, messages=MESSAGES, max_tokens=8, logprobs=True, top_logprobs=3
        )
        if stream:
            content = []
            async for chunk in await client.chat.completions.create(stream=True, **kwargs):
                choice = chunk.choices[0]
                if choice.logprobs is not None and choice.logprobs.content:
                    content.extend(choice.logprobs.content)
        else:
            answer = await client.chat.completions.create(**kwargs)
            assert answer.choices[0].message.content == TEXT
            content = answer.choices[0].logprobs.content
    assert worker.seen[0].sampling_params.logprobs == 3
    # One entry a token, the repeated last delta of a stream's Complete not counted twice.
    assert [e.logprob for e in content] == [token_logprob(i) for i in range(len(worker.tokens))]
    assert b"".join(bytes(e.bytes) for e in content).decode() == TEXT
    assert content[1].token == "\ufffd" and content[1].bytes == [0xC3]  # half of é
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob
        assert entry.top_logprobs[-1].logprob == LOGPROB_FLOOR  # -inf has no JSON spelling


async def test_chat_logprobs_without_alternatives_and_without_asking(qwen_meta_dir: Path) -> None:
    state, worker = gateway(qwen_meta_dir)
    async with api(state) as client:
        answer = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, logprobs=True
        )
        plain = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert worker.seen[0].sampling_params.logprobs == 0
    assert all(e.top_logprobs == [] for e in answer.choices[0].logprobs.content)
    assert not worker.seen[1].sampling_params.HasField("logprobs")
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
async def test_completion_logprobs(qwen_meta_dir: Path, stream: bool) -> None:
    state, worker = gateway(qwen_meta_dir)
    async with api(state) as client:
        kwargs: dict[str, Any] = dict(model=MODEL, prompt="Hi", max_tokens=8, logprobs=2)
        if stream:
            tokens, values, offsets, tops = [], [], [], []
            async for chunk in await client.completions.create(stream=True, **kwargs):
                lp = chunk.choices[0].logprobs
                if lp is not None and lp.tokens:
                    tokens += lp.tokens
                    values += lp.token_logprobs
                    offsets += lp.text_offset
                    tops += lp.top_logprobs
        else:
            answer = await client.completions.create(**kwargs)
            lp = answer.choices[0].logprobs
            tokens, values, offsets, tops = (
                lp.tokens,
                lp.token_logprobs,
                lp.text_offset,
                lp.top_logprobs,
            )
    n = len(worker.tokens)
    assert values == [token_logprob(i) for i in range(n)]
    assert len(tokens) == n and offsets == [sum(len(t) for t in tokens[:i]) for i in range(n)]
    assert all(len(top) == 2 and top[tokens[i]] == values[i] for i, top in enumerate(tops))


def test_completion_top_logprobs_include_the_sampled_token(qwen_meta_dir: Path) -> None:
    strings = TokenStrings(ModelHandle.from_dir(qwen_meta_dir, MODEL).tokenizer)
    render = CompletionLogprobs(strings, 1)
    # A sampled token (65, "A") outside the one alternative asked for (66, "B").
    out = render.render([Entry(65, -2.0, ((66, -0.1),))])
    assert out["top_logprobs"] == [{"B": -0.1, "A": -2.0}]
    assert render.render([Entry(66, -0.1, ((66, -0.1),))])["text_offset"] == [1]
    assert CompletionLogprobs(strings, 0).render([Entry(65, -1.0)])["top_logprobs"] == [None]


async def test_a_worker_refusing_the_constraint_names_the_field(qwen_meta_dir: Path) -> None:
    state, worker = gateway(qwen_meta_dir)
    # As a worker's INVALID_ARGUMENT with tandem-error-code invalid_structured_output reads.
    worker.fail = make_error("invalid_structured_output", "grammar: unexpected token")
    async with api(state) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=8,
                extra_body={"structured_outputs": {"grammar": "root ::= oops"}},
            )
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "invalid_structured_output"
    assert body["param"] == "structured_outputs.grammar"
    assert worker.seen[0].sampling_params.grammar == "root ::= oops"


class OneFrameWorker(LogprobWorker):
    """Sends all of ``TEXT``'s tokens in one frame, as vLLM workers with speculative
    decoding do (a streamed chunk) or a non-streaming worker does (its Complete)."""

    async def _answer(self, wire: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        n = len(self.tokens)
        logprobs = self._logprobs(range(n), 0)
        if wire.stream:
            chunk = pb.GenerateStreamChunk(token_ids=self.tokens, output_logprobs=logprobs)
            yield pb.GenerateResponse(chunk=chunk)
            yield pb.GenerateResponse(complete=pb.GenerateComplete(finish_reason="length"))
            return
        done = pb.GenerateComplete(finish_reason="length", output_ids=self.tokens)
        done.output_logprobs.CopyFrom(logprobs)
        yield pb.GenerateResponse(complete=done)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stop_string_inside_a_frame_drops_the_logprobs_after_it(
    qwen_meta_dir: Path, stream: bool
) -> None:
    """The stop "ll" ends at the fifth of the frame's six tokens ("héllo"), so the sixth
    ("o") is neither counted nor given a logprob (docs/pd-contract.md §20)."""
    state, _ = make_gateway(qwen_meta_dir)
    state.dispatcher = OneFrameWorker(state.model)
    async with api(state) as client:
        ask = {"model": MODEL, "messages": MESSAGES, "logprobs": True, "stop": ["ll"]}
        if stream:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    **ask, stream=True, stream_options={"include_usage": True}
                )
            ]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            entries = [
                e
                for c in chunks
                if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content or []
            ]
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            usage = chunks[-1].usage
        else:
            reply = await client.chat.completions.create(**ask)
            content, finish, usage = (
                reply.choices[0].message.content,
                reply.choices[0].finish_reason,
                reply.usage,
            )
            assert reply.choices[0].logprobs is not None
            entries = reply.choices[0].logprobs.content or []
    assert content == "hé" and finish == "stop"
    assert [e.logprob for e in entries] == [token_logprob(i) for i in range(5)]
    assert usage is not None and usage.completion_tokens == 5
