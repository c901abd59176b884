"""The pipeline's answer (``pipeline/events.py``) in OpenAI's chat dialect: the JSON body
and the SSE chunks."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from tandem.gateway.endpoints.common.openai_bodies import (
    ChatChunkBuilder,
    chat_completion,
    choice_output,
    new_response_id,
    now,
)
from tandem.gateway.logprobs import LogprobEntry, chat_content, chat_logprobs
from tandem.gateway.pipeline.events import (
    AnswerEvent,
    AnswerMeta,
    CallArguments,
    CallStarted,
    ChoiceFinished,
    Completion,
    ReasoningDelta,
    TextDelta,
)


def chat_answer(meta: AnswerMeta, completion: Completion) -> dict[str, Any]:
    def logprobs(entries: list[LogprobEntry]) -> dict[str, Any]:
        return chat_logprobs(entries, meta.token_strings)

    choices = [choice_output(c, logprobs) for c in completion.choices]
    return chat_completion(
        new_response_id("chatcmpl"), meta.model, now(), choices, completion.usage
    )


async def chat_chunks(
    meta: AnswerMeta, events: AsyncIterable[AnswerEvent]
) -> AsyncIterator[dict[str, Any] | bytes]:
    """A chat stream: each choice opens with its role, then the events as deltas (a plain
    text delta framed already, ``text_event``)."""
    builder = ChatChunkBuilder(new_response_id("chatcmpl"), meta.model, now(), meta.include_usage)
    strings = meta.token_strings
    for index in range(meta.n):
        yield builder.start(index)
    async for event in events:
        if isinstance(event, TextDelta):
            if event.logprobs is None:
                yield builder.text_event(event.choice, event.text)
            else:
                logprobs = {"content": chat_content(event.logprobs, strings)}
                yield builder.delta(event.choice, event.text, logprobs)
        elif isinstance(event, ReasoningDelta):
            yield builder.reasoning(event.choice, event.text)
        elif isinstance(event, CallStarted):
            yield builder.call_start(event.choice, event.call, event.call_id, event.name)
        elif isinstance(event, CallArguments):
            yield builder.call_arguments(event.choice, event.call, event.text)
        elif isinstance(event, ChoiceFinished):
            yield builder.finish(event.choice, event.reason)
        elif meta.include_usage:
            yield builder.usage(event.usage)
