"""Request bodies of ``POST /tokenize`` and ``POST /detokenize``, in vLLM's shapes.

``/tokenize`` takes either a prompt (``{"prompt": "..."}``) or chat messages
(``{"messages": [...]}``); a body with ``messages`` is the chat form. The chat form's
messages and tools are the chat route's own models, so a conversation that tokenizes is
one ``/v1/chat/completions`` accepts. As everywhere in the gateway, types are strict,
unknown fields are ignored, a JSON ``null`` means the default, and fields vLLM has whose
effect Tandem cannot give (a per-request chat template, its kwargs, processor options) are
refused with 400 ``unsupported_parameter`` rather than ignored (docs/operations.md,
"Tokenize and detokenize").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from tandem.errors import make_error
from tandem.gateway.endpoints.common.generation import TokenId
from tandem.gateway.endpoints.common.messages import (
    INVALID,
    STRICT_IGNORE_EXTRA,
    ChatMessage,
    TextPart,
    without_nulls,
)
from tandem.gateway.endpoints.common.tool_schemas import MAX_TOOLS, Tool, template_tools, tool_mode
from tandem.gateway.endpoints.common.validation_errors import validation_error

# vLLM's chat-form fields that would change the prompt in a way the gateway does not
# reproduce: the model's own template renders every conversation, as on the chat route.
UNHONOURED: dict[str, str] = {
    "chat_template": "a per-request chat template is not supported",
    "chat_template_kwargs": "chat template arguments are not supported",
    "mm_processor_kwargs": "per-request image processor options are not supported",
    "media_io_kwargs": "per-request media loading options are not supported",
}


def _unset(value: Any) -> bool:
    return value is None or value == {} or value == "" or value == []


class _Options(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    # Optional as in vLLM: the gateway serves one model; a name that is not it is a 404.
    model: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        return without_nulls(cls, data)


class TokenizePromptRequest(_Options):
    prompt: str
    # vLLM's default for a plain prompt: the tokenizer's special tokens (e.g. BOS) are added.
    add_special_tokens: bool = True
    return_token_strs: bool = False

    @model_validator(mode="before")
    @classmethod
    def _one_form(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("prompt") is None:
            raise make_error(
                "invalid_request",
                "'prompt' (a string) or 'messages' (a chat) is required",
                param="prompt",
            )
        return data


class TokenizeChatRequest(_Options):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # The template writes the special tokens itself: off by default, as the chat route does.
    add_special_tokens: bool = False
    return_token_strs: bool = False
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    _template_tools: list[dict[str, Any]] | None = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unhonoured(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        for name, why in UNHONOURED.items():
            if name in data and not _unset(data[name]):
                raise make_error("unsupported_parameter", f"{why}: remove '{name}'", param=name)
        if data.get("prompt") is not None:
            raise make_error(
                "invalid_request", "send either 'prompt' or 'messages', not both", param="prompt"
            )
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> TokenizeChatRequest:
        if self.continue_final_message and self.add_generation_prompt:
            # As vLLM: a generation prompt opens a new turn, which the final message then is not.
            raise make_error(
                "invalid_request",
                "continue_final_message and add_generation_prompt cannot both be true "
                "(add_generation_prompt defaults to true: set it to false)",
                param="continue_final_message",
            )
        # Unique names and JSON-Schema parameters, as on the chat route; the tools are
        # rendered as a chat request with tool_choice "auto" renders them.
        self._template_tools = template_tools(self.tools, tool_mode(self.tools, None, True))
        return self

    def template_tools(self) -> list[dict[str, Any]] | None:
        return self._template_tools

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.template_dict() for message in self.messages]

    def image_urls(self) -> list[str]:
        """Every image part's URL, in the order the client wrote them."""
        return [url for kind, url in self.media_parts() if kind == "image"]

    def media_parts(self) -> list[tuple[str, str]]:
        """``(modality, url)`` of every image and video part, in the order written."""
        return [part for message in self.messages for part in message.media_parts()]

    def final_text(self) -> str | None:
        """The text of the final message that ``continue_final_message`` continues."""
        content = self.messages[-1].content
        if isinstance(content, str):
            return content
        texts = [p.text for p in content or [] if isinstance(p, TextPart)]
        return texts[-1] if texts else None


class DetokenizeRequest(_Options):
    tokens: list[TokenId]


def _form(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    return "~chat" if "messages" in value else "~prompt"


TokenizeRequest = Annotated[
    Annotated[TokenizeChatRequest, Tag("~chat")] | Annotated[TokenizePromptRequest, Tag("~prompt")],
    Discriminator(
        _form,
        custom_error_type=INVALID,
        custom_error_message="request body must be a JSON object",
    ),
]
_TOKENIZE = TypeAdapter[TokenizeChatRequest | TokenizePromptRequest](TokenizeRequest)


def parse_tokenize_request(body: bytes | str) -> TokenizeChatRequest | TokenizePromptRequest:
    """The request; a 400 (``invalid_request`` with ``param``) for anything malformed."""
    try:
        return _TOKENIZE.validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None


def parse_detokenize_request(body: bytes | str) -> DetokenizeRequest:
    try:
        return DetokenizeRequest.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
