"""Chat messages and their content parts, as the OpenAI SDK sends them.

Unions are tagged by a callable discriminator so pydantic validates only the
member the value's shape selects: an error then points at the real culprit
(``messages.0.content.1.text``) instead of listing every union member. Tags start
with ``~`` so ``validation_errors.error_param`` can drop them from
error locations.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, field_validator
from pydantic_core import PydanticCustomError

# Strict: a number where a string belongs is an error, not a silent coercion.
# allow_inf_nan=False: JSON NaN/Infinity must not slip past range checks.
STRICT_IGNORE_EXTRA = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

# Error types raised by Tandem's own validators; their messages are complete sentences.
INVALID = "tandem_invalid"
UNSUPPORTED_PART = "tandem_unsupported_content_part"

Role = Literal["system", "user", "assistant", "tool", "developer"]


def without_nulls(model: type[BaseModel], data: Any) -> Any:
    """A body's explicit nulls dropped, so each optional field takes its default.

    The SDK and many clients send ``null`` for unset options. A null in a required field is
    kept so that it fails as a type error. For ``mode="before"`` model validators.
    """
    if not isinstance(data, dict):
        return data
    fields = model.model_fields
    return {
        k: v for k, v in data.items() if v is not None or (k in fields and fields[k].is_required())
    }


class TextPart(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    url: str
    detail: str | None = None


class ImagePart(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    type: Literal["image_url"]
    image_url: ImageURL

    @field_validator("image_url", mode="before")
    @classmethod
    def _bare_url(cls, value: Any) -> Any:
        # Some clients send {"image_url": "https://..."}; read it as {"url": ...}.
        return {"url": value} if isinstance(value, str) else value


class VideoURL(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    url: str


class VideoPart(BaseModel):
    """``{"type": "video_url", "video_url": {"url": ...}}``, as vLLM's server takes it."""

    model_config = STRICT_IGNORE_EXTRA

    type: Literal["video_url"]
    video_url: VideoURL

    @field_validator("video_url", mode="before")
    @classmethod
    def _bare_url(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value


class _UnsupportedPart(BaseModel):
    """Any part whose ``type`` is a string Tandem does not know; validation always fails."""

    model_config = STRICT_IGNORE_EXTRA

    type: str

    @field_validator("type")
    @classmethod
    def _refuse(cls, value: str) -> str:
        raise PydanticCustomError(
            UNSUPPORTED_PART,
            "content part type '{part_type}' is not supported "
            "(use 'text', 'image_url' or 'video_url')",
            {"part_type": value},
        )


def _part_tag(value: Any) -> str | None:
    part_type = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if part_type == "text":
        return "~text"
    if part_type == "image_url":
        return "~image_url"
    if part_type == "video_url":
        return "~video_url"
    return "~other" if isinstance(part_type, str) else None


ContentPart = Annotated[
    Annotated[TextPart, Tag("~text")]
    | Annotated[ImagePart, Tag("~image_url")]
    | Annotated[VideoPart, Tag("~video_url")]
    | Annotated[_UnsupportedPart, Tag("~other")],
    Discriminator(
        _part_tag,
        custom_error_type=INVALID,
        custom_error_message="each content part must be an object with a string 'type'",
    ),
]


def _content_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "~str"
    return "~list" if isinstance(value, list) else None


MessageContent = (
    Annotated[
        Annotated[str, Tag("~str")] | Annotated[list[ContentPart], Tag("~list")],
        Discriminator(
            _content_tag,
            custom_error_type=INVALID,
            custom_error_message="message content must be a string, a list of parts or null",
        ),
    ]
    | None
)


class CalledFunction(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    name: str
    arguments: str  # JSON text, as OpenAI sends it; templates print it as it is


class MessageToolCall(BaseModel):
    """A call an earlier assistant turn made, sent back so the template can render it."""

    model_config = STRICT_IGNORE_EXTRA

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    role: Role
    content: MessageContent = None
    # Everything the chat templates read: the speaker's name, an assistant turn's calls
    # (and its reasoning, which thinking templates may render), a tool turn's call id.
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def media_parts(self) -> list[tuple[str, str]]:
        """``(modality, url)`` of each image and video part, in the order written."""
        if not isinstance(self.content, list):
            return []
        parts: list[tuple[str, str]] = []
        for part in self.content:
            if isinstance(part, ImagePart):
                parts.append(("image", part.image_url.url))
            elif isinstance(part, VideoPart):
                parts.append(("video", part.video_url.url))
        return parts

    def template_dict(self) -> dict[str, Any]:
        """The message as a plain dict for the chat template (unset optional fields left out)."""
        data = self.model_dump(exclude_none=True)
        data.setdefault("content", None)  # templates index message['content'] unconditionally
        return data
