"""Tokens that arrive together leave together: one SSE chunk for a burst of frames.

The app is the real one in-process (prompt, respond and rendering stages); the worker side
is scripted so that a test decides which frames have "arrived" at once. The frames
object offers ``take_ready`` as the gateway's relay does over Tandem's HTTP/2 client;
tests/unit/wire/test_h2grpc.py checks the client's side of it against a real server.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from pathlib import Path

from gateway_app_fakes import ScriptedDispatcher, chat_body, client, make_gateway, sse_chunks

from tandem.gateway.backends.frames import Frame
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream
from tandem.gateway.logprobs import LogprobEntry

TEXT = "a burst of tokens, all here at once"


class BurstFrames:
    """Frames in bursts: the first of each through ``__anext__`` (a wait for the worker),
    the rest of it through ``take_ready`` (already arrived); None ends a burst."""

    def __init__(self, bursts: list[list[Frame]]) -> None:
        self._bursts = deque(deque(burst) for burst in bursts)
        self.waits = 0

    def __aiter__(self) -> BurstFrames:
        return self

    async def __anext__(self) -> Frame:
        while self._bursts and not self._bursts[0]:
            self._bursts.popleft()
        if not self._bursts:
            raise StopAsyncIteration
        self.waits += 1
        return self._bursts[0].popleft()

    async def take_ready(self) -> Frame | None:
        if self._bursts and self._bursts[0]:
            return self._bursts[0].popleft()
        if self._bursts:
            self._bursts.popleft()  # the burst is over; the next one is not here yet
        return None

    async def aclose(self) -> None:
        self._bursts.clear()


def entries_of(position: int, token: int) -> Callable[[], list[LogprobEntry]]:
    return lambda: [LogprobEntry(token, -0.25 * position, ((token, -0.25 * position),))]


class BurstDispatcher(ScriptedDispatcher):
    def __init__(self, model, sizes: list[int]) -> None:
        super().__init__(model, TEXT)
        self.sizes = sizes

    async def open(self, ctx: RequestContext) -> OpenedStream:
        frames = [Frame(0, [t], entries_of(i, t)) for i, t in enumerate(self.tokens)]
        frames.append(Frame(0, [], final=True, finish_reason="stop"))
        bursts, at = [], 0
        for size in self.sizes:
            bursts.append(frames[at : at + size])
            at += size
        bursts.append(frames[at:])
        return OpenedStream(BurstFrames(bursts), lambda ok: None)


async def chunks_of(qwen_meta_dir: Path, sizes: list[int], **extra) -> list[dict]:
    state, _ = make_gateway(qwen_meta_dir)
    state.dispatcher = BurstDispatcher(state.model, sizes)
    async with client(state) as http:
        body = chat_body(stream=True, max_tokens=64, **extra)
        answer = await http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
    return sse_chunks(answer.text)


async def contents(qwen_meta_dir: Path, sizes: list[int], **extra) -> list[str]:
    chunks = await chunks_of(qwen_meta_dir, sizes, **extra)
    assert any(c["choices"] and c["choices"][0]["finish_reason"] == "stop" for c in chunks)
    return [
        c["choices"][0]["delta"]["content"]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("content")
    ]


async def test_a_burst_goes_out_as_one_chunk(qwen_meta_dir: Path) -> None:
    tokens = len(ScriptedDispatcher(make_gateway(qwen_meta_dir)[0].model, TEXT).tokens)
    assert await contents(qwen_meta_dir, [tokens + 1]) == [TEXT]


async def test_bursts_keep_their_boundaries_and_the_text(qwen_meta_dir: Path) -> None:
    pieces = await contents(qwen_meta_dir, [1, 5, 1, 10])
    assert "".join(pieces) == TEXT
    assert [len(p.encode()) for p in pieces][:4] == [1, 5, 1, 10]  # byte-level tokens


async def test_one_frame_at_a_time_gives_one_chunk_a_token(qwen_meta_dir: Path) -> None:
    tokens = len(ScriptedDispatcher(make_gateway(qwen_meta_dir)[0].model, TEXT).tokens)
    pieces = await contents(qwen_meta_dir, [1] * tokens)
    assert "".join(pieces) == TEXT and len(pieces) == tokens


async def test_a_burst_across_a_stop_string_ends_at_the_stop(qwen_meta_dir: Path) -> None:
    tokens = len(ScriptedDispatcher(make_gateway(qwen_meta_dir)[0].model, TEXT).tokens)
    pieces = await contents(qwen_meta_dir, [tokens + 1], stop=["tokens"])
    assert pieces == ["a burst of "]


async def test_a_bursts_logprobs_are_every_token_in_order(qwen_meta_dir: Path) -> None:
    chunks = await chunks_of(qwen_meta_dir, [3, 4], logprobs=True, top_logprobs=1)
    with_content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    entries = [c["choices"][0]["logprobs"]["content"] for c in with_content]
    assert [len(e) for e in entries[:2]] == [3, 4]
    flat = [entry["logprob"] for e in entries for entry in e]
    assert flat == [-0.25 * i for i in range(len(flat))]
    assert "".join(c["choices"][0]["delta"]["content"] for c in with_content) == TEXT
