"""The body of ``POST /v1/responses``: what is honoured, what is refused by name.

Input items are validated by ``input_models.py`` and turned into chat messages by
``items.py``; the generation fields are checked with the same bounds as chat, so an error
names the Responses field (``max_output_tokens``, ``text.format``), never the chat field
it becomes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.common.generation import MAX_TOP_LOGPROBS, TokenCount
from tandem.gateway.endpoints.common.messages import (
    INVALID,
    STRICT_IGNORE_EXTRA,
    UNSUPPORTED_PART,
    without_nulls,
)
from tandem.gateway.endpoints.common.tool_schemas import MAX_TOOLS
from tandem.gateway.endpoints.common.validation_errors import validation_error
from tandem.gateway.endpoints.responses.input_models import InputItem, text_or_list

# OpenAI's limits on metadata: 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
MAX_INPUT_ITEMS = 2048
LOGPROBS_INCLUDE = "message.output_text.logprobs"


class FunctionTool(BaseModel):
    """The Responses API's flat function tool (chat nests the same under ``function``)."""

    model_config = STRICT_IGNORE_EXTRA
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat_tool(self) -> dict[str, Any]:
        function = self.model_dump(exclude_none=True, exclude={"type"})
        return {"type": "function", "function": function}


class _OtherTool(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> _OtherTool:
        raise PydanticCustomError(
            UNSUPPORTED_PART,
            "tool type '{t}' is not supported: only function tools are (hosted tools such "
            "as web or file search do not run here)",
            {"t": self.type},
        )


def _tool_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str):
        return None
    return "~function" if kind == "function" else "~other"


ResponseTool = Annotated[
    Annotated[FunctionTool, Tag("~function")] | Annotated[_OtherTool, Tag("~other")],
    Discriminator(
        _tool_tag,
        custom_error_type=INVALID,
        custom_error_message="each tool must be an object with a string 'type'",
    ),
]


class NamedFunction(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """``text.format``: ``text``, ``json_object`` or ``json_schema`` (flat, as OpenAI's)."""

    model_config = STRICT_IGNORE_EXTRA
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    def response_format(self) -> dict[str, Any] | None:
        """The chat ``response_format`` it means (``common/structured.py`` checks the schema)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        if self.schema_ is None:
            raise make_error(
                "invalid_request", "a json_schema format needs 'schema'", param="text.format.schema"
            )
        inner: dict[str, Any] = {"name": self.name or "response", "schema": self.schema_}
        if self.strict is not None:
            inner["strict"] = self.strict
        return {"type": "json_schema", "json_schema": inner}


class TextConfig(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only one a model without the knob gives


class ReasoningConfig(BaseModel):
    """Accepted only empty: the built-in templates have no effort or summary controls."""

    model_config = STRICT_IGNORE_EXTRA
    effort: None = None
    summary: None = None
    generate_summary: None = None


class StreamOptions(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    # OpenAI pads deltas with random text against length side channels; Tandem sends none.
    include_obfuscation: Literal[False] | None = None


class ConversationRef(BaseModel):
    """``conversation: {"id": ...}``, the object spelling of a conversation id."""

    model_config = STRICT_IGNORE_EXTRA
    id: str


def check_metadata(meta: dict[str, str]) -> None:
    """OpenAI's metadata bounds (responses and conversations alike), naming ``metadata``."""
    if len(meta) > MAX_METADATA_PAIRS:
        raise make_error(
            "invalid_request", f"at most {MAX_METADATA_PAIRS} metadata pairs", param="metadata"
        )
    for key, value in meta.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise make_error(
                "invalid_request",
                f"metadata keys take up to {MAX_METADATA_KEY} characters and values "
                f"up to {MAX_METADATA_VALUE}",
                param=f"metadata.{key[:MAX_METADATA_KEY]}",
            )


class ResponsesRequest(BaseModel):
    # Extra fields are kept: vLLM's sampling extensions (seed, top_k, stop, ...) pass on to
    # the chat request, which honours or refuses each by name (responses/turn.py).
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: str
    input: Annotated[
        Annotated[str, Tag("~str")] | Annotated[list[InputItem], Tag("~list")],
        Discriminator(
            text_or_list,
            custom_error_type=INVALID,
            custom_error_message="input must be a string or a list of items",
        ),
        Field(min_length=1),
    ]
    instructions: str | None = None
    previous_response_id: str | None = None
    # The conversation this turn continues and is appended to (endpoints/conversations).
    conversation: str | ConversationRef | None = None
    store: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_output_tokens: TokenCount | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    include: list[Literal["message.output_text.logprobs"]] | None = None
    text: TextConfig | None = None
    tools: list[ResponseTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    truncation: Literal["disabled"] | None = None
    background: Literal[False] | None = None
    service_tier: Literal["auto", "default"] | None = None
    max_tool_calls: None = None

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = without_nulls(cls, data)
            for name, why in _REFUSED.items():
                if data.get(name) not in (None, [], {}):
                    raise make_error("unsupported_parameter", f"{why}: remove '{name}'", param=name)
            if isinstance(data.get("input"), list) and len(data["input"]) > MAX_INPUT_ITEMS:
                raise make_error(
                    "invalid_request", f"at most {MAX_INPUT_ITEMS} input items", param="input"
                )
        return data

    @model_validator(mode="after")
    def _bounds_and_exclusions(self) -> ResponsesRequest:
        check_metadata(self.metadata or {})
        if self.conversation is not None and self.previous_response_id is not None:
            # As OpenAI: a turn continues either a conversation or a response chain.
            raise make_error(
                "invalid_request",
                "'conversation' and 'previous_response_id' cannot both be set: send one",
                param="conversation",
            )
        return self

    @property
    def conversation_id(self) -> str | None:
        ref = self.conversation
        return ref.id if isinstance(ref, ConversationRef) else ref

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.include and LOGPROBS_INCLUDE in self.include) or bool(self.top_logprobs)

    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.tools or [] if isinstance(t, FunctionTool)]


# Fields of OpenAI's Responses API that Tandem cannot honour; refused unless empty.
_REFUSED: dict[str, str] = {
    "prompt": "stored prompt templates are not supported",
    "prompt_cache_key": "prompt cache keys are not supported (routing is cache-aware already)",
    "prompt_cache_retention": "prompt cache retention is not configurable",
    "context_management": "context management is not supported",
}


def parse_responses_request(body: bytes | str) -> ResponsesRequest:
    try:
        return ResponsesRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _to_error(exc) from None


def _to_error(exc: ValidationError) -> TandemError:
    return validation_error(
        exc,
        rename=lambda param: param.replace("schema_", "schema"),
        unsupported=_refusable,
        part_code=lambda param: (
            "unsupported_parameter" if param.startswith("tools") else "unsupported_content_part"
        ),
    )


# Fields whose only failure is a value Tandem does not honour (not a malformed one).
_HONOURED_ONLY_EMPTY = (
    "reasoning",
    "truncation",
    "background",
    "service_tier",
    "max_tool_calls",
    "include",
    "text.verbosity",
    "stream_options.include_obfuscation",
)


def _refusable(param: str) -> bool:
    return any(param == p or param.startswith(p + ".") for p in _HONOURED_ONLY_EMPTY)
