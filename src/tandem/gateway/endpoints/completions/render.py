"""The pipeline's answer (``pipeline/events.py``) in OpenAI's legacy-completions dialect:
the JSON body and the SSE chunks (logprob offsets continue per choice)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from tandem.gateway.endpoints.common.openai_bodies import (
    TextChunkBuilder,
    choice_output,
    new_response_id,
    now,
    text_completion,
)
from tandem.gateway.logprobs import CompletionLogprobs, LogprobEntry
from tandem.gateway.pipeline.events import (
    AnswerEvent,
    AnswerMeta,
    AnswerUsage,
    ChoiceFinished,
    Completion,
    TextDelta,
)


def completion_answer(meta: AnswerMeta, completion: Completion) -> dict[str, Any]:
    alternatives = meta.logprob_alternatives or 0

    def logprobs(entries: list[LogprobEntry]) -> dict[str, Any]:
        return CompletionLogprobs(meta.token_strings, alternatives).render(entries)

    choices = [choice_output(c, logprobs) for c in completion.choices]
    return text_completion(new_response_id("cmpl"), meta.model, now(), choices, completion.usage)


async def completion_chunks(
    meta: AnswerMeta, events: AsyncIterable[AnswerEvent]
) -> AsyncIterator[dict[str, Any] | bytes]:
    """A legacy-completions stream: text deltas (logprob offsets continue per choice; a
    plain one framed already, ``text_event``)."""
    builder = TextChunkBuilder(new_response_id("cmpl"), meta.model, now(), meta.include_usage)
    alternatives = meta.logprob_alternatives or 0
    renderers = [CompletionLogprobs(meta.token_strings, alternatives) for _ in range(meta.n)]
    async for event in events:
        if isinstance(event, TextDelta):
            if event.logprobs is None:
                yield builder.text_event(event.choice, event.text)
            else:
                logprobs = renderers[event.choice].render(event.logprobs)
                yield builder.delta(event.choice, event.text, logprobs)
        elif isinstance(event, ChoiceFinished):
            yield builder.finish(event.choice, event.reason)
        elif isinstance(event, AnswerUsage) and meta.include_usage:
            yield builder.usage(event.usage)
