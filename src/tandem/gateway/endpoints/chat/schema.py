"""The request body of ``POST /v1/chat/completions``, and its conversion for the pipeline.

Validation is strict about types and lenient about presence: unknown fields are
ignored (the SDK and other gateways send extras), a JSON ``null`` for an optional
field means "use the default", and any malformed body becomes a 400
``invalid_request`` :class:`~tandem.errors.TandemError` whose ``param`` is the
dotted path of the first bad field. Pydantic errors never reach the client.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from tandem.errors import make_error
from tandem.gateway.endpoints.common.generation import (
    MAX_STOP_CHARS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    GenerationParams,
    TokenCount,
)
from tandem.gateway.endpoints.common.messages import (
    ChatMessage,
)
from tandem.gateway.endpoints.common.tool_schemas import (
    MAX_TOOLS,
    NO_PARAMETERS,
    Tool,
    ToolChoice,
    template_tools,
    tool_constraint,
    tool_mode,
)
from tandem.gateway.endpoints.common.unhonoured import refuse_unhonoured
from tandem.gateway.endpoints.common.validation_errors import (
    error_param,
    parse_json,
    validation_error,
)
from tandem.gateway.pipeline.generation_request import (
    ChatPrompt,
    GenerationRequest,
    ToolMode,
    Tools,
    ToolSpec,
)

NO_TOOLS = ToolMode("none")

# Re-exported: callers and tests read the limits from here.
__all__ = [
    "MAX_STOP_CHARS",
    "MAX_STOP_TOKEN_IDS",
    "ChatCompletionRequest",
    "error_param",
    "parse_chat_request",
    "validate_chat_request",
]


class ChatCompletionRequest(GenerationParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # A factory handing out one frozen value: a plain default is deep-copied per request.
    _tool_mode: ToolMode = PrivateAttr(default_factory=lambda: NO_TOOLS)

    @model_validator(mode="before")
    @classmethod
    def _honoured_only(cls, data: Any) -> Any:
        refuse_unhonoured(data, chat=True)
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> ChatCompletionRequest:
        self._check_min_tokens()
        if self.top_logprobs and not self.logprobs:
            # As OpenAI and vLLM: alternatives without the logprobs they belong to are a mistake.
            raise make_error(
                "invalid_request",
                "top_logprobs needs logprobs set to true",
                param="top_logprobs",
            )
        self._tool_mode = tool_mode(self.tools, self.tool_choice, self.parallel_tool_calls)
        forced = tool_constraint(self.tools or [], self._tool_mode)
        if forced is not None:
            # OpenAI's response_format governs text answers; a forced call leaves none, so
            # the call's constraint applies (instructor's and the Agents SDK's forced tools
            # send both). vLLM's own constraint fields stay refused beside a forced call.
            own = self._constraint is not None and self._constraint.param.startswith(
                "response_format"
            )
            if self._constraint is not None and not own:
                raise make_error(
                    "invalid_request",
                    f"tool_choice '{self._tool_mode.kind}' constrains the answer already; "
                    f"remove '{self._constraint.param}'",
                    param=self._constraint.param,
                )
            self._constraint = forced
        return self

    @property
    def tool_mode(self) -> ToolMode:
        return self._tool_mode

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools for the chat template; None when they stay out of the prompt."""
        return template_tools(self.tools, self._tool_mode)

    def wire_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def output_limit(self) -> int | None:
        # max_completion_tokens replaced max_tokens in the OpenAI API; it wins when both come.
        return self.max_completion_tokens or self.max_tokens

    def output_limit_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def image_urls(self) -> list[str]:
        """Every image part's URL, in the order the client wrote them."""
        return [url for kind, url in self.media_parts() if kind == "image"]

    def media_parts(self) -> list[tuple[str, str]]:
        """``(modality, url)`` of every image and video part, in the order written."""
        return [part for message in self.messages for part in message.media_parts()]

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.template_dict() for message in self.messages]

    def generation(self) -> GenerationRequest:
        """The pipeline's request (``pipeline/generation_request.py``)."""
        prompt = ChatPrompt(self.template_messages(), self.template_tools(), self.media_parts())
        specs = tuple(
            ToolSpec(t.function.name, t.function.parameters or NO_PARAMETERS)
            for t in self.tools or ()
        )
        return GenerationRequest(
            self.model,
            prompt,
            self.sampling(),
            bool(self.stream),
            self.include_usage,
            Tools(self._tool_mode, specs),
            self.output_limit_param(),
        )


def parse_chat_request(body: bytes | str) -> ChatCompletionRequest:
    return parse_json(ChatCompletionRequest, body)


def validate_chat_request(data: dict[str, Any]) -> ChatCompletionRequest:
    """A chat request built in the gateway (the Responses API's chat form), validated."""
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
