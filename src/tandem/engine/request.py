"""What the engine is asked to do and what it answers, one request at a time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tandem.engine.logprobs import TokenLogprob
from tandem.engine.sampling import SamplingConfig
from tandem.engine.types import KVLayers, MediaInputs

if TYPE_CHECKING:
    from tandem.engine.structured import CompiledConstraint


@dataclass(slots=True)
class EngineRequest:
    """One generate call, already validated and converted from the wire.

    ``imported_kv`` is the KV of ``prompt_ids[:imported_len]`` obtained from a
    prefill worker (decode leg); the engine then computes only the rest.
    ``export_transfer_id`` marks a prefill leg: its prompt KV is kept under that
    id for a decode worker to pull. ``constraint`` is a structured-output grammar
    already compiled for this engine (``Engine.compile_constraint``); each sample
    follows it with a matcher of its own.
    """

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingConfig
    media: MediaInputs | None = None
    n: int = 1
    cache_salt: str | None = None
    imported_kv: KVLayers | None = None
    export_transfer_id: str | None = None
    local_cached_tokens: int = 0  # prefix-cache hits found while assembling imported_kv
    constraint: CompiledConstraint | None = None


@dataclass(slots=True)
class EngineOutput:
    """A delta of one sample; the last one of each sample has ``finish_reason`` set.

    With ``sampling.logprobs`` set, ``logprobs`` holds one entry per token of the delta
    and the final delta's ``output_logprobs`` one per token of ``output_ids``; otherwise
    both stay empty.
    """

    index: int
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None = None
    output_ids: list[int] = field(default_factory=list)  # all tokens, on the final delta
    logprobs: list[TokenLogprob] = field(default_factory=list)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)  # on the final delta

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
