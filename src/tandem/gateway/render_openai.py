"""The pipeline's answer (``pipeline/events.py``) in OpenAI's chat and legacy-completions
dialects: JSON bodies and SSE chunks."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from tandem.gateway.api.responses import (
    ChatChunkBuilder,
    ChoiceOutput,
    TextChunkBuilder,
    chat_completion,
    new_response_id,
    now,
    text_completion,
    tool_call_dict,
)
from tandem.gateway.logprobs import CompletionLogprobs, LogprobEntry, chat_content, chat_logprobs
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
)


def chat_answer(meta: AnswerMeta, completion: Completion) -> dict[str, Any]:
    def logprobs(entries: list[LogprobEntry]) -> dict[str, Any]:
        return chat_logprobs(entries, meta.token_strings)

    choices = [_choice_output(c, logprobs) for c in completion.choices]
    return chat_completion(
        new_response_id("chatcmpl"), meta.model, now(), choices, completion.usage
    )


def completion_answer(meta: AnswerMeta, completion: Completion) -> dict[str, Any]:
    alternatives = meta.logprob_alternatives or 0

    def logprobs(entries: list[LogprobEntry]) -> dict[str, Any]:
        return CompletionLogprobs(meta.token_strings, alternatives).render(entries)

    choices = [_choice_output(c, logprobs) for c in completion.choices]
    return text_completion(new_response_id("cmpl"), meta.model, now(), choices, completion.usage)


def _choice_output(
    choice: FinishedChoice, render: Callable[[list[LogprobEntry]], dict[str, Any]]
) -> ChoiceOutput:
    calls = [tool_call_dict(c.id, c.name, c.arguments) for c in choice.calls or ()]
    logprobs = render(choice.logprobs) if choice.logprobs is not None else None
    return ChoiceOutput(
        choice.index, choice.text, choice.finish_reason, logprobs, calls or None, choice.reasoning
    )


async def chat_chunks(
    meta: AnswerMeta, events: AsyncIterable[AnswerEvent]
) -> AsyncIterator[dict[str, Any]]:
    """A chat stream: each choice opens with its role, then the events as deltas."""
    builder = ChatChunkBuilder(new_response_id("chatcmpl"), meta.model, now(), meta.include_usage)
    strings = meta.token_strings
    for index in range(meta.n):
        yield builder.start(index)
    async for event in events:
        if isinstance(event, TextDelta):
            logprobs = None
            if event.logprobs is not None:
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


async def completion_chunks(
    meta: AnswerMeta, events: AsyncIterable[AnswerEvent]
) -> AsyncIterator[dict[str, Any]]:
    """A legacy-completions stream: text deltas (logprob offsets continue per choice)."""
    builder = TextChunkBuilder(new_response_id("cmpl"), meta.model, now(), meta.include_usage)
    alternatives = meta.logprob_alternatives or 0
    renderers = [CompletionLogprobs(meta.token_strings, alternatives) for _ in range(meta.n)]
    async for event in events:
        if isinstance(event, TextDelta):
            logprobs = None
            if event.logprobs is not None:
                logprobs = renderers[event.choice].render(event.logprobs)
            yield builder.delta(event.choice, event.text, logprobs)
        elif isinstance(event, ChoiceFinished):
            yield builder.finish(event.choice, event.reason)
        elif isinstance(event, AnswerUsage) and meta.include_usage:
            yield builder.usage(event.usage)
