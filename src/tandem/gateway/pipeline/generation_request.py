"""The pipeline's own request, in no endpoint's dialect (issue 31, docs/architecture.md).

Each endpoint validates its body against its own schema and converts it into one
:class:`GenerationRequest` (chat, completions, the Responses API, next the Messages API);
from then on nothing reads the endpoint's schema. The stages fill in what they compute
(the prompt's ids, the media path, the worker protocol's message) on the request's
:class:`~tandem.gateway.context.RequestContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# structural_tag is never a request's own (response_format's is refused): the gateway builds
# one for tool_choice auto beside a response_format (gateway/pipeline/answer_or_calls.py).
ConstraintKind = Literal[
    "json_schema", "regex", "grammar", "json_object", "choice", "structural_tag"
]
ToolChoiceKind = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class Constraint:
    """One output constraint; ``param`` names the request field it came from."""

    kind: ConstraintKind
    # JSON schema text, regex or grammar; the choices; None for json_object.
    value: str | tuple[str, ...] | None
    param: str


@dataclass(frozen=True, slots=True)
class ToolMode:
    """How one request treats its tools; ``name`` is set for a named choice."""

    kind: ToolChoiceKind
    name: str | None = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.kind in ("required", "named")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One offered function: its name and its arguments' JSON schema (always an object)."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Tools:
    """The functions offered (empty: none) and how the answer may use them."""

    mode: ToolMode = ToolMode("none")
    specs: tuple[ToolSpec, ...] = ()


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


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A conversation, as the model's chat template takes it."""

    messages: list[dict[str, Any]]
    # The tool definitions the template lists; None: they stay out of the prompt.
    template_tools: list[dict[str, Any]] | None = None
    # (modality, URL) of every image and video part, in the order written.
    media: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What to generate: the prompt, how to sample, what the answer may be, how to send it.

    ``prompt`` is a conversation (chat-shaped answers: reasoning, tool calls), a text, or
    token ids. ``output_limit_param`` names the field behind ``sampling.max_tokens``, for
    the 400 that names it.
    """

    model: str
    prompt: ChatPrompt | str | list[int]
    sampling: SamplingSummary
    stream: bool = False
    include_usage: bool = False
    tools: Tools = Tools()
    output_limit_param: str = "max_tokens"

    @property
    def chat(self) -> bool:
        return isinstance(self.prompt, ChatPrompt)
