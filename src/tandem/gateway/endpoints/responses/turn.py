"""One ``POST /v1/responses``: the request, the conversation it continues, its chat form.

:meth:`Turn.parse` is the pipeline's parser for this route (``pipeline/run.py``): it reads
the Responses body, loads the earlier turns named by ``previous_response_id`` (or the
items of the ``conversation`` it names, endpoints/conversations) from the history store,
and returns the chat request's conversion (``pipeline/generation_request.py``)
for the pipeline to serve — so PD, both media paths, structured outputs and tools behave
exactly as on ``/v1/chat/completions``.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.chat.schema import validate_chat_request
from tandem.gateway.endpoints.responses.conversation_turns import conversation_context
from tandem.gateway.endpoints.responses.items import chat_messages, input_items
from tandem.gateway.endpoints.responses.objects import ResponseHeader
from tandem.gateway.endpoints.responses.request import NamedFunction, parse_responses_request
from tandem.gateway.history.codec import encoded
from tandem.gateway.history.store import (
    NO_TENANT,
    BrokenChain,
    ChainTooLong,
    HistoryError,
    HistoryLimits,
    ResponseStore,
    StoredResponse,
)
from tandem.gateway.pipeline.generation_request import GenerationRequest

log = logging.getLogger("tandem.gateway.endpoints.responses")

# Statuses a later turn may continue from: an answer that ended (cut by the token limit
# or not). A failed turn, or one a dead gateway never finished, is not a conversation.
CONTINUABLE = ("completed", "incomplete")

# Chat fields that have another name here: refused with the Responses spelling.
_CHAT_ONLY = {
    "messages": "input",
    "n": "one response per request",
    "response_format": "text.format",
    "logprobs": "include: ['message.output_text.logprobs'] and top_logprobs",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "best_of": "one response per request",
}


class Turn:
    def __init__(self, store: ResponseStore | None, limits: HistoryLimits, tenant: str | None):
        self.store = store
        self.limits = limits
        self.tenant = tenant or NO_TENANT
        self.header: ResponseHeader | None = None
        self.items: list[dict[str, Any]] = []
        self.history: list[StoredResponse] = []
        self.conversation: str | None = None  # appended to once the turn is answered

    @property
    def stores(self) -> bool:
        return self.header is not None and self.header.stored

    async def parse(self, body: bytes) -> GenerationRequest:
        request = parse_responses_request(body)
        stored = request.store and self.store is not None
        if request.store and self.store is None and "store" in request.model_fields_set:
            raise make_error(
                "unsupported_parameter",
                "this gateway keeps no responses (--history-backend none): send store=false",
                param="store",
            )
        self.header = ResponseHeader(
            f"resp_{uuid.uuid4().hex}", int(time.time()), request.model, request, stored
        )
        self.items = input_items(request)
        kept = stored or request.conversation is not None
        if kept and len(encoded(self.items)) > self.limits.max_response_bytes:
            raise make_error(
                "invalid_request",
                f"this input takes more than the {self.limits.max_response_bytes} bytes a "
                "stored response may hold (--history-max-response-mb): send images by "
                "http(s) URL, or store=false",
                param="store",
            )
        if request.previous_response_id is not None:
            self.history = await self._earlier_turns(request.previous_response_id)
        earlier = [item for turn in self.history for item in _turn_items(turn)]
        if request.conversation_id is not None:
            earlier = await self._conversation(request.conversation_id)
        messages = chat_messages(earlier + self.items)
        if request.instructions is not None:
            # Instructions belong to this request only: an earlier turn's are not carried.
            messages.insert(0, {"role": "system", "content": request.instructions})
        if not messages:
            raise make_error("invalid_request", "the input holds no message", param="input")
        chat = self._chat_fields(request.model_extra or {})
        chat.update(_chat_request(request, messages))
        try:
            return validate_chat_request(chat).generation()
        except TandemError as err:
            err.param = responses_param(err.param)
            raise

    async def _conversation(self, conversation_id: str) -> list[dict[str, Any]]:
        """The conversation's items; refused now, before any generation, when this turn's
        input could not be appended to it afterwards (an id it holds already)."""
        earlier = await conversation_context(self.store, self.tenant, conversation_id)
        held = {item["id"] for item in earlier}
        for index, item in enumerate(self.items):
            if item["id"] in held:
                raise make_error(
                    "invalid_request",
                    f"conversation {conversation_id} already has an item {item['id']!r}",
                    param=f"input.{index}.id",
                )
        self.conversation = conversation_id
        assert self.header is not None
        self.header.conversation = conversation_id
        return earlier

    async def _earlier_turns(self, previous_id: str) -> list[StoredResponse]:
        param = "previous_response_id"
        if self.store is None:
            raise make_error(
                "invalid_request",
                "this gateway keeps no responses (--history-backend none)",
                param=param,
            )
        try:
            chain = await self.store.chain(self.tenant, previous_id)
        except BrokenChain as exc:
            raise make_error("invalid_request", str(exc), param=param) from None
        except ChainTooLong as exc:
            raise make_error("invalid_request", str(exc), param=param) from None
        except HistoryError as exc:
            raise history_unavailable(exc) from None
        if chain is None:
            raise make_error(
                "response_not_found", f"no stored response {previous_id!r}", param=param
            )
        for turn in chain:
            if turn.status not in CONTINUABLE:
                raise make_error(
                    "invalid_request",
                    f"response {turn.id!r} is {turn.status}: a conversation continues only "
                    "from answered turns",
                    param=param,
                )
        return chain

    def _chat_fields(self, extra: dict[str, Any]) -> dict[str, Any]:
        """vLLM's sampling extensions pass to chat, which honours or refuses each by name."""
        for name, instead in _CHAT_ONLY.items():
            if name in extra and extra[name] is not None:
                raise make_error(
                    "unsupported_parameter",
                    f"'{name}' is a chat completions field; here use {instead}",
                    param=name,
                )
        return dict(extra)


def _turn_items(turn: StoredResponse) -> list[dict[str, Any]]:
    return turn.input_items + list(turn.response.get("output") or [])


def _chat_request(request: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    chat: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "stream": request.stream,
        "parallel_tool_calls": request.parallel_tool_calls,
    }
    if request.stream:
        chat["stream_options"] = {"include_usage": True}
    optional = {
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    chat.update({k: v for k, v in optional.items() if v is not None})
    if request.text is not None and request.text.format is not None:
        response_format = request.text.format.response_format()
        if response_format is not None:
            chat["response_format"] = response_format
    tools = [t.chat_tool() for t in request.function_tools()]
    if tools:
        chat["tools"] = tools
    choice = request.tool_choice
    if isinstance(choice, NamedFunction):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        chat["tool_choice"] = choice
    if request.wants_logprobs:
        chat["logprobs"] = True
        chat["top_logprobs"] = request.top_logprobs or 0
    return chat


# Chat field paths as the Responses API names them (errors raised by chat validation).
_PARAM_PREFIXES = (
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("messages", "input"),
    ("tool_choice.function.name", "tool_choice.name"),
    ("logprobs", "include"),
)


def responses_param(param: str | None) -> str | None:
    if param is None:
        return None
    for chat, ours in _PARAM_PREFIXES:
        if param == chat or param.startswith(chat + "."):
            return ours
    if param.startswith("tools.") and ".function." in param:
        return param.replace(".function.", ".", 1)
    return param


def history_unavailable(exc: HistoryError) -> TandemError:
    # The detail (database host, user, file path) is for the operator's log, not the client.
    log.warning("stored responses unavailable: %s", exc)
    return make_error("history_unavailable", "stored responses are unavailable; try again")
