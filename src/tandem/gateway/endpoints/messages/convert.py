"""A Messages request as the chat request it means, and so the pipeline's request.

The conversion writes the equivalent chat body (``endpoints/chat/schema.py``) and lets the
chat model validate and convert it: the ``GenerationRequest`` is then the one the chat route
builds for that body, so the two routes answer alike (greedy) by construction, images,
tools and constraints included. The mapping:

- ``system`` (a string, or text blocks joined by blank lines) → a leading system message;
- user blocks: ``text`` → text parts, ``image`` → ``image_url`` parts (base64 data → a data
  URL; both then go through chat's media policy), ``tool_result`` → a ``tool`` message per
  result, ahead of the turn's other blocks (``is_error`` prefixes the text with "Error: ");
- assistant blocks: ``text`` → content, ``tool_use`` → ``tool_calls`` (input as JSON text),
  ``thinking`` → ``reasoning_content`` (rendered where the template renders reasoning),
  ``redacted_thinking`` → dropped (opaque: nothing a template could show);
- ``output_config.format`` (a JSON schema) → ``response_format`` json_schema;
- ``stop_sequences`` → ``stop``, ``tools`` → functions (``input_schema`` as parameters),
  ``tool_choice`` auto / any / tool / none → auto / required / named / none, and
  ``disable_parallel_tool_use`` → ``parallel_tool_calls: false``.
"""

from __future__ import annotations

from typing import Any

from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest, validate_chat_request
from tandem.gateway.endpoints.messages.blocks import (
    AssistantMessage,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from tandem.gateway.endpoints.messages.schema import (
    AnyChoice,
    CountTokensRequest,
    MessagesRequest,
    NamedChoice,
    NoChoice,
    ThinkingAdaptive,
    ThinkingEnabled,
)
from tandem.gateway.pipeline.generation_request import GenerationRequest

# A chat field's name as the Messages client wrote it (for the 400 that names it).
_CHAT_TO_MESSAGES = {
    "stop": "stop_sequences",
    "tool_choice.function.name": "tool_choice.name",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "response_format": "output_config.format",
    "response_format.json_schema.schema": "output_config.format.schema",
}


def chat_body(request: CountTokensRequest, reasoning_parser: str | None) -> dict[str, Any]:
    """The chat completion body equivalent to ``request``."""
    if isinstance(request.thinking, ThinkingEnabled | ThinkingAdaptive):
        _check_thinking(request, reasoning_parser)
    messages: list[dict[str, Any]] = []
    system = request.system_text()
    if system is not None:
        messages.append({"role": "system", "content": system})
    calls_seen: set[str] = set()
    for i, message in enumerate(request.messages):
        if isinstance(message, AssistantMessage):
            messages.append(_assistant(message, calls_seen))
        else:
            messages += _user(message.content, i, calls_seen)
    body: dict[str, Any] = {"model": request.model, "messages": messages}
    if request.tools:
        body["tools"] = [
            _tool(tool.name, tool.description, tool.input_schema) for tool in request.tools
        ]
    choice = request.tool_choice
    if choice is not None:
        body["tool_choice"] = _tool_choice(choice)
        if not isinstance(choice, NoChoice) and choice.disable_parallel_tool_use:
            body["parallel_tool_calls"] = False
    if isinstance(request, MessagesRequest):
        body["max_tokens"] = request.max_tokens
        body["stream"] = request.stream
        body["stop"] = list(request.stop_sequences)
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(request, name)
            if value is not None:
                body[name] = value
        output = request.output_config
        if output is not None and output.format is not None:
            schema = {"name": "output", "schema": output.format.schema_}
            body["response_format"] = {"type": "json_schema", "json_schema": schema}
    return body


def chat_request(
    request: CountTokensRequest, reasoning_parser: str | None
) -> ChatCompletionRequest:
    """The equivalent chat request, validated; its 400s name the Messages fields."""
    body = chat_body(request, reasoning_parser)
    try:
        return validate_chat_request(body)
    except TandemError as err:
        err.param = messages_param(err.param)
        raise


def generation(request: MessagesRequest, reasoning_parser: str | None) -> GenerationRequest:
    return chat_request(request, reasoning_parser).generation()


def messages_param(param: str | None) -> str | None:
    """A chat field's name in the Messages API (message indices shift: by message only)."""
    if param is None:
        return None
    if param in _CHAT_TO_MESSAGES:
        return _CHAT_TO_MESSAGES[param]
    parts = param.split(".")
    if parts[0] == "messages":
        return "messages"
    if parts[0] == "tools" and parts[-1] == "parameters":
        return ".".join([*parts[:2], "input_schema"])
    return param


def _check_thinking(request: CountTokensRequest, reasoning_parser: str | None) -> None:
    if reasoning_parser is None:
        # Without a parser the reasoning would stay in the text, not in thinking blocks.
        raise make_error(
            "unsupported_parameter",
            "thinking needs a gateway started with --reasoning-parser: remove 'thinking'",
            param="thinking",
        )
    limit = getattr(request, "max_tokens", None)
    budget = getattr(request.thinking, "budget_tokens", None)
    if limit is not None and budget is not None and budget >= limit:
        raise make_error(
            "invalid_request",
            "thinking.budget_tokens must be less than max_tokens",
            param="thinking.budget_tokens",
        )


def _user(blocks: str | list[Any], index: int, calls_seen: set[str]) -> list[dict[str, Any]]:
    """One user turn: its tool results as tool messages, then the rest as one message."""
    if isinstance(blocks, str):
        return [{"role": "user", "content": blocks}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, ToolResultBlock):
            if block.tool_use_id not in calls_seen:
                raise make_error(
                    "invalid_request",
                    f"tool_result for '{block.tool_use_id}', which no earlier tool_use block has",
                    param=f"messages.{index}.content.{j}.tool_use_id",
                )
            results.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()}
            )
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": block.url()}})
        else:
            assert isinstance(block, TextBlock)
            parts.append({"type": "text", "text": block.text})
    return results + ([{"role": "user", "content": parts}] if parts else [])


def _assistant(message: AssistantMessage, calls_seen: set[str]) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            text.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls_seen.add(block.id)
            function = {"name": block.name, "arguments": block.arguments()}
            calls.append({"id": block.id, "type": "function", "function": function})
        # redacted_thinking: encrypted by its issuer, nothing to render.
    turn: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        turn["tool_calls"] = calls
    if reasoning:
        turn["reasoning_content"] = "".join(reasoning)
    return turn


def _tool(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, NoChoice):
        return "none"
    if isinstance(choice, AnyChoice):
        return "required"
    if isinstance(choice, NamedChoice):
        return {"type": "function", "function": {"name": choice.name}}
    return "auto"
