"""The bodies of ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Unlike chat (whose models ignore extras, as OpenAI clients send many), every field here is
known or refused by name: Anthropic's API is one vendor's, and a field Tandem does not know
would otherwise change nothing while the client believes it did. Fields that exist but
are not honoured (``service_tier`` or ``speed`` beyond their do-nothing values,
``container``, ``mcp_servers``, ``inference_geo``) get ``unsupported_parameter`` naming
them; unknown ones too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from tandem.errors import make_error
from tandem.gateway.endpoints.common.generation import MAX_STOP_CHARS, UINT32_MAX, TokenCount
from tandem.gateway.endpoints.common.messages import INVALID, without_nulls
from tandem.gateway.endpoints.common.tool_schemas import MAX_TOOLS
from tandem.gateway.endpoints.common.validation_errors import parse_json
from tandem.gateway.endpoints.messages.blocks import STRICT_FORBID_EXTRA, Message, TextBlock

# Tandem's stop strings are matched by the gateway (gateway/stops.py) against every piece
# of text; chat allows 4, and the Messages API maps onto the same request.
MAX_STOP_SEQUENCES = 4


class CustomTool(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    # Anthropic's server tools (bash, web search, …) have other types: refused by value.
    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class _Choice(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    disable_parallel_tool_use: bool = False


class AutoChoice(_Choice):
    type: Literal["auto"]


class AnyChoice(_Choice):
    type: Literal["any"]


class NamedChoice(_Choice):
    type: Literal["tool"]
    name: str


class NoChoice(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    type: Literal["none"]


def _choice_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"~{kind}" if kind in ("auto", "any", "tool", "none") else None


ToolChoice = Annotated[
    Annotated[AutoChoice, Tag("~auto")]
    | Annotated[AnyChoice, Tag("~any")]
    | Annotated[NamedChoice, Tag("~tool")]
    | Annotated[NoChoice, Tag("~none")],
    Discriminator(
        _choice_tag,
        custom_error_type=INVALID,
        custom_error_message="tool_choice must be {'type': 'auto' | 'any' | 'tool' | 'none'}",
    ),
]


class ThinkingEnabled(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    type: Literal["enabled"]
    # Anthropic's bounds; the budget is not enforced apart from max_tokens (see convert.py).
    budget_tokens: int = Field(ge=1024, le=UINT32_MAX)


class ThinkingAdaptive(BaseModel):
    """The model decides how long to think: with a reasoning parser, as ``enabled``."""

    model_config = STRICT_FORBID_EXTRA

    type: Literal["adaptive"]
    # "omitted" (thinking withheld but signed) has no meaning without signatures.
    display: Literal["summarized"] | None = None


class ThinkingDisabled(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    type: Literal["disabled"]


def _thinking_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"~{kind}" if kind in ("enabled", "adaptive", "disabled") else None


Thinking = Annotated[
    Annotated[ThinkingEnabled, Tag("~enabled")]
    | Annotated[ThinkingAdaptive, Tag("~adaptive")]
    | Annotated[ThinkingDisabled, Tag("~disabled")],
    Discriminator(
        _thinking_tag,
        custom_error_type=INVALID,
        custom_error_message="thinking must be {'type': 'enabled', 'budget_tokens'}, "
        "{'type': 'adaptive'} or {'type': 'disabled'}",
    ),
]


class Metadata(BaseModel):
    """Accepted for Anthropic's clients; it never changes the answer."""

    model_config = STRICT_FORBID_EXTRA

    user_id: str | None = Field(None, max_length=256)


class JsonOutputFormat(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    """Structured output: ``format`` becomes chat's ``response_format`` json_schema."""

    model_config = STRICT_FORBID_EXTRA

    format: JsonOutputFormat | None = None
    # No effort control on these models: only its absence is accepted.
    effort: None = None


def _ephemeral(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") == "ephemeral"


# field -> whether a value leaves it doing nothing (anything else is refused by name).
_DO_NOTHING: dict[str, Callable[[Any], bool]] = {
    # One tier only: both of Anthropic's values ask for what every request gets.
    "service_tier": lambda value: value in ("auto", "standard_only"),
    "container": lambda value: False,
    "mcp_servers": lambda value: value == [],
    "inference_geo": lambda value: False,
    # One speed: "standard" is what every request gets.
    "speed": lambda value: value == "standard",
    # Prompt caching needs no marker: the workers' prefix caches keep every prompt.
    "cache_control": _ephemeral,
}


class CountTokensRequest(BaseModel):
    """What both routes take: the conversation and what is rendered with it."""

    model_config = STRICT_FORBID_EXTRA

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[CustomTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_fields_only(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = without_nulls(cls, data)
        for name, value in list(data.items()):
            if name in _DO_NOTHING:
                if not _DO_NOTHING[name](value):
                    raise make_error(
                        "unsupported_parameter",
                        f"'{name}' is not supported by this gateway: remove it",
                        param=name,
                    )
                del data[name]
            elif name not in cls.model_fields:
                raise make_error(
                    "unsupported_parameter",
                    f"unknown field '{name}' (the Messages API takes only Anthropic's fields)",
                    param=name,
                )
        return data

    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        return "\n\n".join(block.text for block in self.system) or None


class MessagesRequest(CountTokensRequest):
    max_tokens: TokenCount
    stop_sequences: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]] = Field(
        default_factory=list, max_length=MAX_STOP_SEQUENCES
    )
    stream: bool = False
    # Anthropic's range; unset leaves the worker's default, as chat does.
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=UINT32_MAX)
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None


def parse_messages_request(body: bytes | str) -> MessagesRequest:
    return parse_json(MessagesRequest, body)


def parse_count_tokens_request(body: bytes | str) -> CountTokensRequest:
    return parse_json(CountTokensRequest, body)
