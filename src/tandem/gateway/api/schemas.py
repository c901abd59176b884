"""Request bodies of ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Validation is strict about types and lenient about presence: unknown fields are
ignored (the SDK and other gateways send extras), a JSON ``null`` for an optional
field means "use the default", and any malformed body becomes a 400
``invalid_request`` :class:`~tandem.errors.TandemError` whose ``param`` is the
dotted path of the first bad field. Pydantic errors never reach the client.
"""

from __future__ import annotations

from dataclasses import dataclass
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

from tandem.errors import TandemError, make_error
from tandem.gateway.api.schemas_chat import (
    INVALID,
    STRICT_IGNORE_EXTRA,
    UNSUPPORTED_PART,
    ChatMessage,
)
from tandem.gateway.api.structured import Constraint, request_constraint
from tandem.gateway.api.tools import (
    MAX_TOOLS,
    Tool,
    ToolChoice,
    ToolMode,
    template_tools,
    tool_constraint,
    tool_mode,
)
from tandem.gateway.api.unhonoured import refuse_unhonoured

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Token counts and ids travel as uint32 on the wire: a larger value must be a 400 here,
# not a protobuf range error (a 500) when the wire request is built.
UINT32_MAX = 2**32 - 1
MAX_N = 16
MAX_STOPS = 4
# A stop string is held back while it may still be starting, and matched against every
# new piece of text: an unbounded one would hold a whole answer back and cost quadratic
# time. 1024 characters is far above any real stop sequence.
MAX_STOP_CHARS = 1024
# Checked by the worker after every token; vLLM takes any number, a few dozen is plenty.
MAX_STOP_TOKEN_IDS = 64
# Entries of logit_bias: OpenAI takes up to 300 (vLLM any number); the worker checks each.
MAX_LOGIT_BIAS = 1024
# OpenAI's (and vLLM's) default for the legacy completions endpoint.
DEFAULT_COMPLETION_MAX_TOKENS = 16
# Top alternatives per token: OpenAI's limits, chat and legacy completions.
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
TokenCount = Annotated[int, Field(ge=1, le=UINT32_MAX)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


@dataclass(frozen=True, slots=True)
class SamplingSummary:
    """Resolved sampling parameters; ``None`` means "unset: the worker's default"."""

    n: int
    max_tokens: int | None
    temperature: float | None
    top_p: float
    top_k: int  # 0 = off (the wire's uint32 cannot carry -1)
    min_p: float
    seed: int | None
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    min_tokens: int
    frequency_penalty: float
    presence_penalty: float
    repetition_penalty: float
    skip_special_tokens: bool
    logit_bias: tuple[tuple[int, float], ...] = ()
    # Top alternatives per output token when logprobs are asked for (0: the token's own only).
    logprobs: int | None = None
    constraint: Constraint | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class StreamOptions(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    include_usage: bool = False


class _GenerationParams(BaseModel):
    """Fields shared by both endpoints."""

    model_config = STRICT_IGNORE_EXTRA

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    max_tokens: TokenCount | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1, le=UINT32_MAX)
    min_p: float = Field(0.0, ge=0, le=1)
    seed: int | None = Field(None, ge=INT32_MIN, le=INT32_MAX)
    stop: list[StopString] = Field(default_factory=list, max_length=MAX_STOPS)
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=MAX_STOP_TOKEN_IDS)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0, le=UINT32_MAX)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    skip_special_tokens: bool = True
    # Token id (as a JSON object key) -> bias added to its logit, OpenAI's -100..100.
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] = Field(
        default_factory=dict, max_length=MAX_LOGIT_BIAS
    )

    # Output constraints in their several spellings (api/structured.py reads them).
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    _constraint: Constraint | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _one_constraint(self) -> _GenerationParams:
        self._constraint = request_constraint(
            {
                "response_format": self.response_format,
                "structured_outputs": self.structured_outputs,
                "guided_json": self.guided_json,
                "guided_regex": self.guided_regex,
                "guided_choice": self.guided_choice,
                "guided_grammar": self.guided_grammar,
            }
        )
        return self

    @property
    def constraint(self) -> Constraint | None:
        return self._constraint

    def wire_logprobs(self) -> int | None:
        """Top alternatives per token for the wire's ``logprobs``; None: not asked for."""
        return None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float]) -> dict[str, float]:
        for key in value:
            if not (key.isdigit() and int(key) <= INT32_MAX):
                raise PydanticCustomError(
                    INVALID,
                    "logit_bias keys must be token ids (0 or more), got '{key}'",
                    {"key": key},
                )
        return value

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        # The SDK and many clients send explicit nulls for unset options. A null in a
        # required field is kept so it fails as a type error.
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if v is not None or (k in fields and fields[k].is_required())
        }

    @field_validator("stop", mode="before")
    @classmethod
    def _single_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def output_limit(self) -> int | None:
        return self.max_tokens

    def _check_min_tokens(self) -> None:
        limit = self.output_limit()
        if limit is not None and self.min_tokens > limit:
            raise make_error(
                "invalid_request",
                f"min_tokens ({self.min_tokens}) must not exceed the token limit ({limit})",
                param="min_tokens",
            )

    def sampling(self) -> SamplingSummary:
        return SamplingSummary(
            n=self.n,
            max_tokens=self.output_limit(),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            min_p=self.min_p,
            seed=self.seed,
            stop=tuple(self.stop),
            stop_token_ids=tuple(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            skip_special_tokens=self.skip_special_tokens,
            logit_bias=tuple(sorted((int(k), v) for k, v in self.logit_bias.items())),
            logprobs=self.wire_logprobs(),
            constraint=self.constraint,
        )


def _unsupported(what: str) -> PydanticCustomError:
    return PydanticCustomError(INVALID, f"{what} are not supported")


class ChatCompletionRequest(_GenerationParams):
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
            if self._constraint is not None:
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

    def image_urls(self) -> list[str]:
        """Every image part's URL, in the order the client wrote them."""
        return [url for message in self.messages for url in message.image_urls()]

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.template_dict() for message in self.messages]


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


class CompletionRequest(_GenerationParams):
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


def error_param(loc: tuple[int | str, ...]) -> str | None:
    """Dotted path of a pydantic error location, without the ``~`` union tags."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and p.startswith("~"))]
    return ".".join(parts) or None


def _to_tandem_error(exc: ValidationError) -> TandemError:
    first = exc.errors(include_url=False, include_input=False)[0]
    kind, msg = first["type"], first["msg"]
    param = error_param(first["loc"])
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", msg)
        return make_error("invalid_request", f"request body is not valid JSON: {detail}")
    if param is None and kind == "model_type":
        return make_error("invalid_request", "request body must be a JSON object")
    if kind == UNSUPPORTED_PART:
        return make_error("unsupported_content_part", msg, param=param)
    if kind == INVALID:
        return make_error("invalid_request", msg, param=param)
    if kind == "missing":
        return make_error("invalid_request", f"'{param}' is required", param=param)
    where = f"'{param}'" if param else "request body"
    return make_error("invalid_request", f"invalid {where}: {msg}", param=param)


_Model = TypeVar("_Model", bound=BaseModel)


def _parse(model: type[_Model], body: bytes | str) -> _Model:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        # from None: the pydantic chain is noise in logs; the message carries what matters.
        raise _to_tandem_error(exc) from None


def parse_chat_request(body: bytes | str) -> ChatCompletionRequest:
    return _parse(ChatCompletionRequest, body)


def parse_completion_request(body: bytes | str) -> CompletionRequest:
    return _parse(CompletionRequest, body)
