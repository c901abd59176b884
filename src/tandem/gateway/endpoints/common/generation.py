"""What both generation routes take: sampling, stops, logprobs, output constraints.

``GenerationParams`` is the base of the chat and completions request models
(``endpoints/chat/schema.py``); :class:`SamplingSummary` is what the pipeline reads of it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tandem.ascii_int import ascii_int
from tandem.errors import make_error
from tandem.gateway.endpoints.common.messages import INVALID, STRICT_IGNORE_EXTRA, without_nulls
from tandem.gateway.endpoints.common.structured import request_constraint
from tandem.gateway.pipeline.generation_request import Constraint, SamplingSummary

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


class StreamOptions(BaseModel):
    model_config = STRICT_IGNORE_EXTRA

    include_usage: bool = False


class GenerationParams(BaseModel):
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

    # Output constraints in their several spellings (endpoints/common/structured.py reads them).
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    _constraint: Constraint | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _stream_options_need_a_stream(self) -> GenerationParams:
        # vLLM answers 400 here too: the options would be ignored by a JSON answer.
        if self.stream_options is not None and not self.stream:
            raise make_error(
                "invalid_request",
                "stream_options is only allowed with stream: true",
                param="stream_options",
            )
        return self

    @model_validator(mode="after")
    def _one_constraint(self) -> GenerationParams:
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
            token_id = ascii_int(key)
            if token_id is None or token_id > INT32_MAX:
                raise PydanticCustomError(
                    INVALID,
                    "logit_bias keys must be token ids (0 or more), got '{key}'",
                    {"key": key},
                )
        return value

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        return without_nulls(cls, data)

    @field_validator("stop", mode="before")
    @classmethod
    def _single_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def output_limit(self) -> int | None:
        return self.max_tokens

    def output_limit_param(self) -> str:
        """The field that set :meth:`output_limit`, for an error naming it."""
        return "max_tokens"

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
