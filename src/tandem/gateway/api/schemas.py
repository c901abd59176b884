"""Request bodies of ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Validation is strict about types and lenient about presence: unknown fields are
ignored (the SDK and other gateways send extras), a JSON ``null`` for an optional
field means "use the default", and any malformed body becomes a 400
``invalid_request`` :class:`~tandem.errors.TandemError` whose ``param`` is the
dotted path of the first bad field. Pydantic errors never reach the client.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tandem.errors import make_error
from tandem.gateway.api.generation import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    MAX_COMPLETION_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
    GenerationParams,
    TokenCount,
    TokenId,
)
from tandem.gateway.api.schemas_chat import (
    INVALID,
    ChatMessage,
)
from tandem.gateway.api.tools import (
    MAX_TOOLS,
    NO_PARAMETERS,
    Tool,
    ToolChoice,
    template_tools,
    tool_constraint,
    tool_mode,
)
from tandem.gateway.api.unhonoured import refuse_unhonoured
from tandem.gateway.api.validation_errors import error_param, validation_error
from tandem.gateway.pipeline.generation_request import (
    ChatPrompt,
    GenerationRequest,
    ToolMode,
    Tools,
    ToolSpec,
)

# Re-exported: callers and tests read the limits from here.
__all__ = [
    "DEFAULT_COMPLETION_MAX_TOKENS",
    "MAX_STOP_CHARS",
    "MAX_STOP_TOKEN_IDS",
    "ChatCompletionRequest",
    "CompletionRequest",
    "error_param",
    "parse_chat_request",
    "parse_completion_request",
    "validate_chat_request",
]


def _unsupported(what: str) -> PydanticCustomError:
    return PydanticCustomError(INVALID, f"{what} are not supported")


class ChatCompletionRequest(GenerationParams):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: TokenCount | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    _tool_mode: ToolMode = PrivateAttr(ToolMode("none"))

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


def _prompt_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "~str"
    return "~ids" if isinstance(value, list) else None


PromptInput = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[TokenId], Field(min_length=1), Tag("~ids")],
    Discriminator(
        _prompt_tag,
        custom_error_type=INVALID,
        custom_error_message="prompt must be a string or a list of token ids",
    ),
]


class CompletionRequest(GenerationParams):
    prompt: PromptInput

    @model_validator(mode="before")
    @classmethod
    def _honoured_only(cls, data: Any) -> Any:
        refuse_unhonoured(data, chat=False)
        return data

    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    best_of: int | None = Field(None, ge=1)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        # ["text"] and [[1, 2]] are one-element batches; unwrap them. Batches of several
        # prompts are refused: each would be its own generation.
        if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
            if len(value) != 1:
                raise PydanticCustomError(
                    INVALID, "batched prompts are not supported: send exactly one prompt"
                )
            return value[0]
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise _unsupported("echo=true requests")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str) -> str:
        raise _unsupported("suffixes")

    @model_validator(mode="after")
    def _cross_checks(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise make_error("invalid_request", "best_of must equal n", param="best_of")
        self._check_min_tokens()
        return self

    def output_limit(self) -> int:
        return self.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS

    def wire_logprobs(self) -> int | None:
        return self.logprobs

    def generation(self) -> GenerationRequest:
        """The pipeline's request (``pipeline/generation_request.py``)."""
        prompt = self.prompt if isinstance(self.prompt, str) else list(self.prompt)
        return GenerationRequest(
            self.model, prompt, self.sampling(), bool(self.stream), self.include_usage
        )


_Model = TypeVar("_Model", bound=BaseModel)


def _parse(model: type[_Model], body: bytes | str) -> _Model:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        # from None: the pydantic chain is noise in logs; the message carries what matters.
        raise validation_error(exc) from None


def parse_chat_request(body: bytes | str) -> ChatCompletionRequest:
    return _parse(ChatCompletionRequest, body)


def validate_chat_request(data: dict[str, Any]) -> ChatCompletionRequest:
    """A chat request built in the gateway (the Responses API's chat form), validated."""
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def parse_completion_request(body: bytes | str) -> CompletionRequest:
    return _parse(CompletionRequest, body)
