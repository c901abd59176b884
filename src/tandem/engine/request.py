"""What the engine is asked to do and what it answers, one request at a time."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.engine.sampling import SamplingConfig
from tandem.engine.types import KVLayers, MediaInputs


@dataclass(slots=True)
class EngineRequest:
    """One generate call, already validated and converted from the wire.

    ``imported_kv`` is the KV of ``prompt_ids[:imported_len]`` obtained from a
    prefill worker (decode leg); the engine then computes only the rest.
    ``export_transfer_id`` marks a prefill leg: its prompt KV is kept under that
    id for a decode worker to pull.
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


@dataclass(slots=True)
class EngineOutput:
    """A delta of one sample; the last one of each sample has ``finish_reason`` set."""

    index: int
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: str | None = None
    output_ids: list[int] = field(default_factory=list)  # all tokens, on the final delta

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
