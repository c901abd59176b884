"""Input items and their content parts, as the Responses API takes them.

Unions are tagged by a callable discriminator (as ``endpoints/common/messages.py`` does), so an
error points at the culprit (``input.0.content.1``) instead of listing every member; the
``_Other*`` members refuse any other ``type`` by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from tandem.gateway.endpoints.common.messages import INVALID, STRICT_IGNORE_EXTRA, UNSUPPORTED_PART

InputRole = Literal["user", "assistant", "system", "developer"]


class InputText(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["input_text"]
    text: str


class OutputText(BaseModel):
    """Text of an earlier assistant turn, as a client (or a stored response) sends it back."""

    model_config = STRICT_IGNORE_EXTRA
    type: Literal["output_text"]
    text: str


class Refusal(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["refusal"]
    refusal: str


class InputImage(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None

    @model_validator(mode="after")
    def _by_url(self) -> InputImage:
        if self.file_id is not None:
            raise PydanticCustomError(
                UNSUPPORTED_PART,
                "images by file_id are not supported (there is no Files API): "
                "send 'image_url' as a data: URL or an http(s) URL",
            )
        if self.image_url is None:
            raise PydanticCustomError(INVALID, "an input_image needs 'image_url'")
        return self


class _OtherPart(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> _OtherPart:
        raise PydanticCustomError(
            UNSUPPORTED_PART,
            "content part type '{t}' is not supported (use input_text, input_image, "
            "output_text or refusal)",
            {"t": self.type},
        )


_PART_TAGS = {"input_text", "output_text", "refusal", "input_image"}


def _part_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return None
    return f"~{kind}" if kind in _PART_TAGS else "~other"


Part = Annotated[
    Annotated[InputText, Tag("~input_text")]
    | Annotated[OutputText, Tag("~output_text")]
    | Annotated[Refusal, Tag("~refusal")]
    | Annotated[InputImage, Tag("~input_image")]
    | Annotated[_OtherPart, Tag("~other")],
    Discriminator(
        _part_tag,
        custom_error_type=INVALID,
        custom_error_message="each content part must be an object with a string 'type'",
    ),
]


def text_or_list(value: Any) -> str | None:
    if isinstance(value, str):
        return "~str"
    return "~list" if isinstance(value, list) else None


# ``str | list[...]`` tagged by shape, so an error points into the list, not at ``str``.
Content = Annotated[
    Annotated[str, Tag("~str")] | Annotated[list[Part], Tag("~list")],
    Discriminator(
        text_or_list,
        custom_error_type=INVALID,
        custom_error_message="content must be a string or a list of parts",
    ),
]


class MessageItem(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["message"] = "message"
    id: str | None = None
    role: InputRole
    content: Content


class FunctionCallItem(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["function_call"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1)
    output: Content


class ReasoningText(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(BaseModel):
    """An earlier turn's reasoning, sent back; it reaches the template as reasoning_content."""

    model_config = STRICT_IGNORE_EXTRA
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None

    @model_validator(mode="after")
    def _readable(self) -> ReasoningItem:
        if self.encrypted_content:
            raise PydanticCustomError(INVALID, "encrypted reasoning content is not supported")
        return self


class _OtherItem(BaseModel):
    model_config = STRICT_IGNORE_EXTRA
    type: str

    @model_validator(mode="after")
    def _refuse(self) -> _OtherItem:
        raise PydanticCustomError(
            UNSUPPORTED_PART,
            "input item type '{t}' is not supported (use message, function_call, "
            "function_call_output or reasoning)",
            {"t": self.type},
        )


_ITEM_TAGS = {"message", "function_call", "function_call_output", "reasoning"}


def _item_tag(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type", "message")  # an "easy" message leaves type out
    if not isinstance(kind, str):
        return None
    return f"~{kind}" if kind in _ITEM_TAGS else "~other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("~message")]
    | Annotated[FunctionCallItem, Tag("~function_call")]
    | Annotated[FunctionCallOutputItem, Tag("~function_call_output")]
    | Annotated[ReasoningItem, Tag("~reasoning")]
    | Annotated[_OtherItem, Tag("~other")],
    Discriminator(
        _item_tag,
        custom_error_type=INVALID,
        custom_error_message="each input item must be an object",
    ),
]
