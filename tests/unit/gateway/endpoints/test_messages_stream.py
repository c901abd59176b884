"""The Messages event sequence, fed to the anthropic SDK's own stream accumulator.

``accumulate_event`` is what ``client.messages.stream(...)`` runs over the events it
receives: a delta for a block that was never started, or a block of the wrong kind, makes
it fail; its final message must equal the JSON answer for the same pipeline answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from anthropic.lib.streaming._messages import accumulate_event
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from tandem.errors import make_error
from tandem.gateway.endpoints.messages.render import message_answer
from tandem.gateway.endpoints.messages.stream import PING, message_events, with_pings
from tandem.gateway.logprobs import TokenStrings
from tandem.gateway.pipeline.events import (
    AnswerEvent,
    AnswerMeta,
    AnswerUsage,
    CallArguments,
    CallStarted,
    ChoiceFinished,
    Completion,
    FinishedChoice,
    ReasoningDelta,
    TextDelta,
    Usage,
)
from tandem.gateway.tools.calls import ToolCall

META = AnswerMeta(
    "tiny-qwen3-vl", 1, False, None, TokenStrings(Tokenizer(WordLevel({"a": 0}, "a")))
)
USAGE = Usage(prompt_tokens=12, completion_tokens=9, cached_tokens=4)


async def scripted(
    events: list[AnswerEvent], fail_after: int | None = None
) -> AsyncIterator[AnswerEvent]:
    for i, event in enumerate(events):
        if fail_after is not None and i == fail_after:
            raise make_error("decode_stream_error", "the decode worker went away")
        yield event


async def streamed(events: AsyncIterator[AnswerEvent]) -> list[dict[str, Any]]:
    return [event async for event in message_events(META, events)]


def accumulated(events: list[dict[str, Any]]) -> dict[str, Any]:
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)  # type: ignore[arg-type]
    assert snapshot is not None
    return snapshot.model_dump(exclude_none=True)


ANSWER: list[AnswerEvent] = [
    ReasoningDelta(0, "Think"),
    ReasoningDelta(0, "ing."),
    TextDelta(0, "", None),  # logprobs only: no block of its own
    TextDelta(0, "Here "),
    TextDelta(0, "goes."),
    CallStarted(0, 0, "call_abc", "weather"),
    CallArguments(0, 0, '{"city": '),
    CallArguments(0, 0, '"Oslo"}'),
    CallStarted(0, 1, "call_def", "zoom"),
    CallArguments(0, 1, '{"level": 2}'),
    ChoiceFinished(0, "tool_calls"),
    AnswerUsage(USAGE),
]
SAME_AS_JSON = Completion(
    [
        FinishedChoice(
            0,
            "Here goes.",
            "tool_calls",
            calls=[
                ToolCall("call_abc", "weather", '{"city": "Oslo"}'),
                ToolCall("call_def", "zoom", '{"level": 2}'),
            ],
            reasoning="Thinking.",
        )
    ],
    USAGE,
)


def without_id(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "id"}


async def test_the_stream_accumulates_to_the_json_answer() -> None:
    events = await streamed(scripted(ANSWER))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use", "tool_use"]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2, 3]
    final = accumulated(events)
    expected = message_answer(META, SAME_AS_JSON)
    assert final["content"] == expected["content"]
    assert final["content"][2] == {
        "type": "tool_use",
        "id": "toolu_abc",
        "name": "weather",
        "input": {"city": "Oslo"},
    }
    assert final["stop_reason"] == "tool_use" == expected["stop_reason"]
    assert final["usage"]["input_tokens"] == 12 == expected["usage"]["input_tokens"]
    assert final["usage"]["output_tokens"] == 9
    assert final["usage"]["cache_read_input_tokens"] == 4


async def test_a_cut_answer_stops_for_max_tokens() -> None:
    events = await streamed(
        scripted([TextDelta(0, "abc"), ChoiceFinished(0, "length"), AnswerUsage(USAGE)])
    )
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert accumulated(events)["content"] == [{"type": "text", "text": "abc"}]


async def test_a_failure_after_the_start_is_an_error_event() -> None:
    events = await streamed(scripted(ANSWER, fail_after=4))
    assert events[0]["type"] == "message_start"
    last = events[-1]
    assert last["type"] == "error"
    assert last["error"]["type"] == "api_error"
    assert last["error"]["message"].startswith("decode_stream_error: ")
    assert not any(e["type"] in ("message_delta", "message_stop") for e in events)


async def test_pings_keep_a_quiet_stream_alive_and_the_source_is_closed() -> None:
    closed = asyncio.Event()

    async def slow() -> AsyncIterator[AnswerEvent]:
        try:
            await asyncio.sleep(0.35)
            yield TextDelta(0, "late")
            await asyncio.sleep(3600)
            yield TextDelta(0, "never")
        finally:
            closed.set()

    seen: list[AnswerEvent | None] = []
    stream = with_pings(slow(), 0.1)
    async for item in stream:
        seen.append(item)
        if item is not None:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert seen[-1] == TextDelta(0, "late")
    assert 2 <= seen.count(None) <= 4  # one per 0.1 s of silence
    assert closed.is_set()
    assert PING == {"type": "ping"}


async def test_a_reported_stop_sequence_is_the_stop_reason_streamed_and_not() -> None:
    choice = FinishedChoice(0, "a red", "stop", stop_sequence=" circle")
    answer = message_answer(META, Completion([choice], USAGE))
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("stop_sequence", " circle")
    plain = message_answer(META, Completion([FinishedChoice(0, "a red", "stop")], USAGE))
    assert (plain["stop_reason"], plain["stop_sequence"]) == ("end_turn", None)
    finish = ChoiceFinished(0, "stop", stop_sequence=" circle")
    events = await streamed(scripted([TextDelta(0, "a red"), finish, AnswerUsage(USAGE)]))
    final = accumulated(events)
    assert (final["stop_reason"], final["stop_sequence"]) == ("stop_sequence", " circle")
