"""The request body of ``POST /v1/completions`` (the legacy API), and its conversion.

Validated as chat's is (``endpoints/chat/schema.py``): strict types, unknown fields
ignored, a malformed body a coded 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tandem.errors import make_error
from tandem.gateway.endpoints.common.generation import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    MAX_COMPLETION_LOGPROBS,
    GenerationParams,
    TokenId,
)
from tandem.gateway.endpoints.common.messages import INVALID
from tandem.gateway.endpoints.common.unhonoured import refuse_unhonoured
from tandem.gateway.endpoints.common.validation_errors import parse_json
from tandem.gateway.pipeline.generation_request import GenerationRequest


def _unsupported(what: str) -> PydanticCustomError:
    return PydanticCustomError(INVALID, f"{what} are not supported")


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


def parse_completion_request(body: bytes | str) -> CompletionRequest:
    return parse_json(CompletionRequest, body)
