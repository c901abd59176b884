"""The content blocks of a Messages request, as Anthropic's SDK sends them.

Each block type is its own strict model, and unknown fields are errors (``extra="forbid"``):
a field Tandem would ignore must not look honoured. ``cache_control`` is the one exception,
accepted on every block: it only asks for prompt caching, which the workers' prefix caches
do for every request anyway. Unions are tagged by the block's ``type`` (``~`` tags drop out
of error locations, as in ``endpoints/common/messages.py``), so an error names the block.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator
from pydantic_core import PydanticCustomError

from tandem.gateway.endpoints.common.messages import INVALID, UNSUPPORTED_PART

STRICT_FORBID_EXTRA = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


class _Block(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    cache_control: dict[str, Any] | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    # Citations are answers' metadata; a request may echo an empty list back.
    citations: list[Any] | None = Field(None, max_length=0)


class Base64Source(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class UrlSource(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    type: Literal["url"]
    url: str = Field(min_length=1)


def _source_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return {"base64": "~base64", "url": "~url"}.get(kind) if isinstance(kind, str) else None


ImageSource = Annotated[
    Annotated[Base64Source, Tag("~base64")] | Annotated[UrlSource, Tag("~url")],
    Discriminator(
        _source_tag,
        custom_error_type=INVALID,
        custom_error_message="an image source must be {'type': 'base64', 'media_type', 'data'} "
        "or {'type': 'url', 'url'}",
    ),
]


class ImageBlock(_Block):
    type: Literal["image"]
    source: ImageSource

    def url(self) -> str:
        """The URL chat's ``image_url`` part would carry: base64 data becomes a data URL."""
        source = self.source
        if isinstance(source, Base64Source):
            return f"data:{source.media_type};base64,{source.data}"
        return source.url


class ToolUseBlock(_Block):
    """A call an earlier assistant turn made."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]

    def arguments(self) -> str:
        return json.dumps(self.input, ensure_ascii=False)


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # Tandem signs nothing; whatever comes back is not checked


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


class _Unsupported(BaseModel):
    """Any block whose ``type`` Tandem does not take here; validation always fails."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: str

    @field_validator("type")
    @classmethod
    def _refuse(cls, value: str) -> str:
        raise PydanticCustomError(
            UNSUPPORTED_PART,
            "content block type '{block}' is not supported here",
            {"block": value},
        )


def _tagger(*kinds: str) -> Any:
    def tag(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if not isinstance(kind, str):
            return None
        return f"~{kind}" if kind in kinds else "~other"

    return tag


_BLOCK_ERROR = "each content block must be an object with a string 'type'"


def _str_or_list(value: Any) -> str | None:
    if isinstance(value, str):
        return "~str"
    return "~list" if isinstance(value, list) else None


_STR_OR_LIST = Discriminator(
    _str_or_list,
    custom_error_type=INVALID,
    custom_error_message="content must be a string or a list of content blocks",
)


_ResultBlock = Annotated[
    Annotated[TextBlock, Tag("~text")] | Annotated[_Unsupported, Tag("~other")],
    Discriminator(_tagger("text"), custom_error_type=INVALID, custom_error_message=_BLOCK_ERROR),
]
_ResultContent = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[_ResultBlock], Tag("~list")], _STR_OR_LIST
]


class ToolResultBlock(_Block):
    """A tool's answer, sent in a user turn; ``content`` a string or text blocks."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: _ResultContent | None = None
    is_error: bool = False

    def text(self) -> str:
        if self.content is None:
            body = ""
        elif isinstance(self.content, str):
            body = self.content
        else:
            body = "\n".join(block.text for block in self.content if isinstance(block, TextBlock))
        # The template has no field for a failed call: the model reads it in the text.
        return f"Error: {body}" if self.is_error else body


UserBlock = Annotated[
    Annotated[TextBlock, Tag("~text")]
    | Annotated[ImageBlock, Tag("~image")]
    | Annotated[ToolResultBlock, Tag("~tool_result")]
    | Annotated[_Unsupported, Tag("~other")],
    Discriminator(
        _tagger("text", "image", "tool_result"),
        custom_error_type=INVALID,
        custom_error_message=_BLOCK_ERROR,
    ),
]

AssistantBlock = Annotated[
    Annotated[TextBlock, Tag("~text")]
    | Annotated[ToolUseBlock, Tag("~tool_use")]
    | Annotated[ThinkingBlock, Tag("~thinking")]
    | Annotated[RedactedThinkingBlock, Tag("~redacted_thinking")]
    | Annotated[_Unsupported, Tag("~other")],
    Discriminator(
        _tagger("text", "tool_use", "thinking", "redacted_thinking"),
        custom_error_type=INVALID,
        custom_error_message=_BLOCK_ERROR,
    ),
]


class UserMessage(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    role: Literal["user"]
    content: Annotated[
        Annotated[str, Tag("~str")] | Annotated[list[UserBlock], Tag("~list")], _STR_OR_LIST
    ]


class AssistantMessage(BaseModel):
    model_config = STRICT_FORBID_EXTRA

    role: Literal["assistant"]
    content: Annotated[
        Annotated[str, Tag("~str")] | Annotated[list[AssistantBlock], Tag("~list")], _STR_OR_LIST
    ]


def _role_tag(value: Any) -> str | None:
    role = value.get("role") if isinstance(value, dict) else getattr(value, "role", None)
    return {"user": "~user", "assistant": "~assistant"}.get(role) if isinstance(role, str) else None


Message = Annotated[
    Annotated[UserMessage, Tag("~user")] | Annotated[AssistantMessage, Tag("~assistant")],
    Discriminator(
        _role_tag,
        custom_error_type=INVALID,
        custom_error_message="each message needs role 'user' or 'assistant' (the system "
        "prompt goes in 'system')",
    ),
]
