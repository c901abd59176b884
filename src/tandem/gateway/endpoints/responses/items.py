"""Input and output items: stored as plain dicts, read back as chat messages.

A turn's input items are normalized once (every item a dict with ``type`` and ``id``,
message content as a list of parts) and stored that way; a conversation is then rebuilt
by turning every stored item — earlier inputs, earlier outputs, this turn's input — into
chat messages with one function, :func:`chat_messages`. Images stay as the client sent
them: a ``data:`` URL by value, an http(s) URL by reference (fetched again, under the media
policy, when a later turn re-sends it; docs/operations.md, "Stored responses").
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from tandem.gateway.endpoints.responses.input_models import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputImage,
    MessageItem,
    ReasoningItem,
)
from tandem.gateway.endpoints.responses.request import ResponsesRequest

_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def new_item_id(kind: str) -> str:
    return f"{_ID_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}"


def input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """This turn's input as it is stored and listed (``GET …/input_items``)."""
    if isinstance(request.input, str):
        return [_message("user", [{"type": "input_text", "text": request.input}])]
    return normalized_items(request.input)


def normalized_items(validated: Sequence[BaseModel]) -> list[dict[str, Any]]:
    """Validated input items (``input_models.InputItem``) as stored: plain dicts, each
    with an ``id``, message content as a list of parts. Also the Conversations API's."""
    items: list[dict[str, Any]] = []
    for item in validated:
        data = item.model_dump(exclude_none=True, by_alias=True)
        if isinstance(item, MessageItem) and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            data["content"] = [{"type": kind, "text": item.content}]
        data.setdefault("id", new_item_id(data["type"]))
        items.append(data)
    return items


def _message(role: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "message", "id": new_item_id("message"), "role": role, "content": content}


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized items (stored or new) as chat messages, in conversation order.

    Consecutive ``function_call`` items join the assistant message before them (one turn
    that spoke and called); a ``reasoning`` item rides on the next assistant message as
    its ``reasoning_content``, which the chat template may render or drop.
    """
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            reasoning += [c.text for c in ReasoningItem.model_validate(item).content or []]
        elif kind == "message":
            msg = MessageItem.model_validate(item)
            message: dict[str, Any] = {"role": msg.role, "content": _chat_content(msg.content)}
            if msg.role == "assistant" and reasoning:
                message["reasoning_content"], reasoning = "".join(reasoning), []
            messages.append(message)
        elif kind == "function_call":
            call = FunctionCallItem.model_validate(item)
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant" or reasoning:
                last = {"role": "assistant", "content": None}
                if reasoning:
                    last["reasoning_content"], reasoning = "".join(reasoning), []
                messages.append(last)
            last.setdefault("tool_calls", []).append(
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            )
        elif kind == "function_call_output":
            out = FunctionCallOutputItem.model_validate(item)
            messages.append(
                {"role": "tool", "tool_call_id": out.call_id, "content": _chat_content(out.output)}
            )
    return messages


def _chat_content(content: Any) -> str | list[dict[str, Any]]:
    """A string when the content is text only (what templates expect of most turns)."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, InputImage):
            image: dict[str, Any] = {"url": part.image_url}
            if part.detail is not None:
                image["detail"] = part.detail
            parts.append({"type": "image_url", "image_url": image})
        else:
            text = getattr(part, "text", None)
            parts.append({"type": "text", "text": part.refusal if text is None else text})
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts
