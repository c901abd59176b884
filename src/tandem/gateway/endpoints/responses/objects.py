"""The Response object and its output items, built from what the chat pipeline answered.

The Responses API is served by the chat pipeline (one pipeline under both APIs,
docs/architecture.md): its answer — content, reasoning, tool calls, logprobs, usage — is
rewritten here into OpenAI's Response shape, and that object is what is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tandem.errors import TandemError
from tandem.gateway.endpoints.responses.items import new_item_id
from tandem.gateway.endpoints.responses.request import NamedFunction, ResponsesRequest
from tandem.gateway.logprobs import TokenStrings, chat_content
from tandem.gateway.pipeline.events import Completion, Usage

CountTokens = Callable[[str], int]


@dataclass(slots=True)
class ResponseHeader:
    """What every form of one response repeats: ids, time and the request's settings."""

    id: str
    created_at: int
    model: str
    request: ResponsesRequest
    stored: bool
    conversation: str | None = None  # the conversation this turn is appended to

    def envelope(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        req = self.request
        text_format = (
            req.text.format.model_dump(by_alias=True, exclude_none=True)
            if (req.text and req.text.format)
            else {"type": "text"}
        )
        tool_choice: Any = req.tool_choice
        if isinstance(tool_choice, NamedFunction):
            tool_choice = tool_choice.model_dump()
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": self.stored,
            "temperature": req.temperature,
            "text": {"format": text_format, "verbosity": "medium"},
            "tool_choice": tool_choice or ("auto" if req.tools else "none"),
            "tools": [t.model_dump(exclude_none=True) for t in req.function_tools()],
            "top_logprobs": req.top_logprobs or 0,
            "top_p": req.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": req.user,
            "safety_identifier": req.safety_identifier,
            "metadata": req.metadata or {},
            **({"conversation": {"id": self.conversation}} if self.conversation else {}),
        }


@dataclass(slots=True)
class Answer:
    """One finished answer in chat terms, whichever way it arrived (JSON or stream)."""

    content: str = ""
    reasoning: str | None = None
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (call id, name, args)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None

    @classmethod
    def from_completion(cls, completion: Completion, strings: TokenStrings) -> Answer:
        """The first choice of the pipeline's answer (a Responses request has n = 1)."""
        choice = completion.choices[0]
        calls = [(c.id, c.name, c.arguments) for c in choice.calls or ()]
        logprobs = chat_content(choice.logprobs, strings) if choice.logprobs is not None else []
        return cls(
            choice.text or "",
            choice.reasoning,
            calls,
            logprobs,
            choice.finish_reason,
            completion.usage,
        )


def output_text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(item_id: str, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": parts,
    }


def reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content}


def call_item(item_id: str, status: str, call_id: str, name: str, args: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    }


def output_items(answer: Answer) -> list[dict[str, Any]]:
    """Reasoning first, then the message (unless the answer is calls only), then the calls."""
    items = []
    if answer.reasoning is not None:
        items.append(reasoning_item(new_item_id("reasoning"), answer.reasoning))
    if answer.content or not answer.calls:
        part = output_text_part(answer.content, answer.logprobs)
        items.append(message_item(new_item_id("message"), "completed", [part]))
    for call_id, name, args in answer.calls:
        items.append(call_item(new_item_id("function_call"), "completed", call_id, name, args))
    if answer.finish_reason == "length" and "status" in items[-1]:
        items[-1]["status"] = "incomplete"  # the token limit cut the last item short
    return items


def usage(tokens: Usage | None, reasoning: str | None, count: CountTokens) -> Any:
    """The Responses API's usage object; reasoning tokens counted from its text."""
    if tokens is None:
        return None
    reasoning_tokens = count(reasoning) if reasoning else 0
    return {
        "input_tokens": tokens.prompt_tokens,
        "input_tokens_details": {"cached_tokens": tokens.cached_tokens},
        "output_tokens": tokens.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": tokens.prompt_tokens + tokens.completion_tokens,
    }


def finished(
    header: ResponseHeader, answer: Answer, output: list[dict[str, Any]], count: CountTokens
) -> dict[str, Any]:
    """The final Response: ``completed``, or ``incomplete`` when the token limit cut it."""
    cut = answer.finish_reason == "length"
    body = header.envelope("incomplete" if cut else "completed", output)
    if cut:
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    body["usage"] = usage(answer.usage, answer.reasoning, count)
    return body


def failed(header: ResponseHeader, err: TandemError, output: list[dict[str, Any]]) -> Any:
    body = header.envelope("failed", output)
    body["error"] = {"code": err.code, "message": err.message}
    return body
