"""The Responses event sequence, fed to the openai SDK's own stream accumulator.

``ResponseStreamState`` is what ``client.responses.stream(...)`` runs over the events it
receives: if our sequence breaks its rules (an item before ``response.created``, a delta
for an unknown index, a completed response with unfinished items) it raises, and its final
response must hold what the pipeline's answer events said.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from openai import omit
from openai._models import construct_type_unchecked
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from tandem.errors import make_error
from tandem.gateway.endpoints.responses.objects import Answer, ResponseHeader, output_items
from tandem.gateway.endpoints.responses.request import parse_responses_request
from tandem.gateway.endpoints.responses.stream import EventWriter
from tandem.gateway.logprobs import LogprobEntry, TokenStrings
from tandem.gateway.pipeline.events import (
    AnswerEvent,
    AnswerUsage,
    CallArguments,
    CallStarted,
    ChoiceFinished,
    ReasoningDelta,
    TextDelta,
    Usage,
)


def writer(**fields: Any) -> EventWriter:
    body = {"model": "m", "input": "hi", **fields}
    import json

    request = parse_responses_request(json.dumps(body))
    header = ResponseHeader("resp_1", 0, "m", request, stored=True)
    return EventWriter(header, lambda text: len(text), STRINGS)


def replay(events: list[dict[str, Any]]) -> Any:
    """Run the SDK's accumulator over our events; its final response."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for event in events:
        parsed = construct_type_unchecked(type_=ResponseStreamEvent, value=event)  # type: ignore[arg-type]
        state.handle_event(parsed)
    return state._completed_response


def run(w: EventWriter, answer: list[AnswerEvent]) -> list[dict[str, Any]]:
    events = w.start()
    for piece in answer:
        events += w.push(piece)
    closing, _ = w.finish()
    return events + closing


class _Strings:
    """Token texts by id, as the gateway's ``TokenStrings`` gives them (ids from :func:`_lp`)."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def get(self, token_id: int) -> tuple[str, list[int]]:
        text = self.texts[token_id]
        return text, list(text.encode())


_STRINGS = _Strings()
STRINGS = cast(TokenStrings, _STRINGS)


def _lp(token: str, logprob: float = -0.1) -> list[LogprobEntry]:
    _STRINGS.texts.append(token)
    return [LogprobEntry(len(_STRINGS.texts) - 1, logprob)]


class B:
    """The answer events of one choice, named as a chat stream's chunks were."""

    @staticmethod
    def delta(index: int, text: str, logprobs: list[LogprobEntry] | None = None) -> TextDelta:
        return TextDelta(index, text, logprobs)

    @staticmethod
    def reasoning(index: int, text: str) -> ReasoningDelta:
        return ReasoningDelta(index, text)

    @staticmethod
    def call_start(index: int, call: int, call_id: str, name: str) -> CallStarted:
        return CallStarted(index, call, call_id, name)

    @staticmethod
    def call_arguments(index: int, call: int, text: str) -> CallArguments:
        return CallArguments(index, call, text)

    @staticmethod
    def finish(index: int, reason: str) -> ChoiceFinished:
        return ChoiceFinished(index, reason)

    @staticmethod
    def usage(usage: Usage) -> AnswerUsage:
        return AnswerUsage(usage)


def test_text_stream_accumulates_to_the_same_text() -> None:
    chunks = [
        B.delta(0, "He", _lp("He", -0.5)),
        B.delta(0, "llo"),
        B.finish(0, "stop"),
        B.usage(Usage(5, 2, 3)),
    ]
    events = run(writer(), chunks)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = replay(events)
    assert final.output_text == "Hello"
    assert final.status == "completed"
    assert final.usage.input_tokens == 5 and final.usage.input_tokens_details.cached_tokens == 3
    assert final.output[0].content[0].logprobs[0].token == "He"
    assert events[-1]["type"] == "response.completed"


def test_reasoning_then_text_then_calls_are_separate_items() -> None:
    chunks = [
        B.reasoning(0, "think"),
        B.reasoning(0, "ing"),
        B.delta(0, "Let me check."),
        B.call_start(0, 0, "call_a", "get_weather"),
        B.call_arguments(0, 0, '{"city":'),
        B.call_arguments(0, 0, '"Paris"}'),
        B.call_start(0, 1, "call_b", "get_time"),
        B.call_arguments(0, 1, "{}"),
        B.finish(0, "tool_calls"),
        B.usage(Usage(5, 9)),
    ]
    w = writer()
    final = replay(run(w, chunks))
    kinds = [item.type for item in final.output]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    assert final.output[0].content[0].text == "thinking"
    assert final.output[2].arguments == '{"city":"Paris"}' and final.output[2].call_id == "call_a"
    assert final.output[3].name == "get_time"
    assert final.usage.output_tokens_details.reasoning_tokens == len("thinking")


def _shape(output: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """An output's items without their ids: what streamed and JSON answers must share."""
    shaped = []
    for item in output:
        if item["type"] == "function_call":
            shaped.append(("function_call", item["name"], item["arguments"], item["status"]))
        elif item["type"] == "message":
            part = item["content"][0]
            tokens = [lp["token"] for lp in part["logprobs"]]
            shaped.append(("message", part["text"], tokens, item["status"]))
        else:
            shaped.append(("reasoning", item["content"][0]["text"]))
    return shaped


def test_logprobs_only_chunks_open_no_item_and_lose_no_arguments() -> None:
    """A parsed stream with logprobs sends each frame's logprobs as a chunk of their own
    before its pieces; those chunks once opened a message, which closed the call with
    arguments "" (and split reasoning into many items), in the stored copy too."""
    chunks = [
        B.delta(0, "", _lp("<think>")),
        B.reasoning(0, "think"),
        B.delta(0, "", _lp("ing")),
        B.reasoning(0, "ing"),
        B.delta(0, "", _lp("{")),
        B.call_start(0, 0, "call_a", "get_weather"),
        B.call_arguments(0, 0, '{"city":'),
        B.delta(0, "", _lp('"Paris"}')),
        B.call_arguments(0, 0, ' "Paris"}'),
        B.finish(0, "tool_calls"),
    ]
    w = writer(top_logprobs=0, include=["message.output_text.logprobs"])
    events = run(w, chunks)
    final = replay(events)
    assert [item.type for item in final.output] == ["reasoning", "function_call"]
    assert final.output[1].arguments == '{"city": "Paris"}'
    stored = w.output  # what finish() stored, item for item
    answer = Answer(
        reasoning="thinking",
        calls=[("call_a", "get_weather", '{"city": "Paris"}')],
        finish_reason="tool_calls",
    )
    assert _shape(stored) == _shape(output_items(answer))  # the JSON answer's items


def test_logprobs_before_their_text_join_the_message() -> None:
    chunks = [
        B.delta(0, "", _lp("He")),  # held while the parser waits to see a call or not
        B.delta(0, "", _lp("llo")),
        B.delta(0, "Hello"),
        B.delta(0, "", _lp("!")),
        B.finish(0, "stop"),
    ]
    w = writer(top_logprobs=0, include=["message.output_text.logprobs"])
    final = replay(run(w, chunks))
    assert final.output_text == "Hello"
    assert [lp.token for lp in final.output[0].content[0].logprobs] == ["He", "llo", "!"]
    assert _shape(w.output) == [("message", "Hello", ["He", "llo", "!"], "completed")]


def test_a_cut_answer_ends_incomplete() -> None:
    events = run(writer(max_output_tokens=2), [B.delta(0, "ab"), B.finish(0, "length")])
    assert events[-1]["type"] == "response.incomplete"
    body = events[-1]["response"]
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"


def test_an_empty_answer_is_one_empty_message() -> None:
    final = replay(run(writer(), [B.finish(0, "stop")]))
    assert [item.type for item in final.output] == ["message"]
    assert final.output_text == ""


def test_a_failure_keeps_the_finished_items() -> None:
    w = writer()
    events = w.start() + w.push(B.delta(0, "partial"))
    closing, body = w.fail(make_error("decode_stream_error", "decode worker died"))
    assert closing[0]["type"] == "response.failed"
    assert body["status"] == "failed" and body["error"]["code"] == "decode_stream_error"
    assert closing[0]["sequence_number"] == events[-1]["sequence_number"] + 1


@pytest.mark.parametrize("stored", [True, False])
def test_envelope_reports_the_request(stored: bool) -> None:
    import json

    request = parse_responses_request(
        json.dumps({"model": "m", "input": "x", "metadata": {"a": "b"}, "top_logprobs": 2})
    )
    body = ResponseHeader("resp_2", 7, "m", request, stored).envelope("completed", [])
    assert body["store"] is stored and body["metadata"] == {"a": "b"}
    assert body["top_logprobs"] == 2 and body["tool_choice"] == "none"
