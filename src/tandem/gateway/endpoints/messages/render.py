"""The pipeline's answer (``pipeline/events.py``) as Anthropic's Message object.

The content blocks come in the order the model wrote them: ``thinking`` (when a reasoning
parser split reasoning off), ``text``, then one ``tool_use`` per call. Tandem signs nothing,
so a thinking block's ``signature`` is an empty string (clients send it back; it is not
checked). Usage: ``input_tokens`` counts every prompt token, those a worker's prefix cache
served included (they are also in ``cache_read_input_tokens``), so that it equals what
``/v1/messages/count_tokens`` answers for the same request.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from tandem.gateway.pipeline.events import (
    AnswerMeta,
    ChoiceFinished,
    Completion,
    FinishedChoice,
    Usage,
)

# OpenAI's finish reasons (the pipeline's) as Anthropic's stop reasons.
_STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def tool_use_id(call_id: str) -> str:
    """The pipeline's ``call_…`` id in Anthropic's ``toolu_…`` form (same random part)."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish_reason: str, stop_sequence: str | None, called: bool) -> str:
    """``called``: the answer holds a tool_use block. A named tool choice finishes "stop"
    in OpenAI's words (the client chose the call); Anthropic's says ``tool_use`` for any
    answer that ends in calls."""
    if stop_sequence is not None:
        return "stop_sequence"
    if called and finish_reason != "length":
        return "tool_use"
    return _STOP_REASONS.get(finish_reason, "end_turn")


def matched_stop(finished: FinishedChoice | ChoiceFinished) -> str | None:
    """The client's stop sequence that ended the answer, if one did."""
    return finished.stop_sequence


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object Anthropic's ``input`` is (``{}``: not an object,
    e.g. a call cut by max_tokens)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message_envelope(message_id: str, model: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }


def _blocks(choice: FinishedChoice) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if choice.reasoning:
        blocks.append({"type": "thinking", "thinking": choice.reasoning, "signature": ""})
    if choice.text:
        blocks.append({"type": "text", "text": choice.text})
    for call in choice.calls or ():
        blocks.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.id),
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    return blocks


def message_answer(meta: AnswerMeta, completion: Completion) -> dict[str, Any]:
    """The Message of a JSON answer (one choice: the Messages API has no ``n``)."""
    choice = completion.choices[0]
    stop = matched_stop(choice)
    return {
        **message_envelope(new_message_id(), meta.model),
        "content": _blocks(choice),
        "stop_reason": stop_reason(choice.finish_reason, stop, bool(choice.calls)),
        "stop_sequence": stop,
        "usage": usage_dict(completion.usage),
    }
