"""The ``null`` engine: answers at once with canned tokens, so that a gateway's cost is measured.

It implements the worker's ``engine.protocol.Engine``, as the embedded engine does, and
loads no model weights. The gRPC protocol and the PD handoff are the real ones: a prefill
leg stores a tiny placeholder KV (one layer, one head, one dimension: 8 bytes a token)
under its transfer id, and the decode leg pulls it over the side channel exactly as with
the embedded engine. The imported KV is then ignored.

Outputs are one token a delta, cycling over the bytes of ``CANNED_TEXT`` (the built-in
models' byte-level ids), stopping at ``max_tokens``; ``token_delay_s`` paces them to act
as a slow worker.

Canned tokens follow no grammar and come from no distribution: a constrained request, or
one asking for logprobs, is refused (INVALID_ARGUMENT, ``unsupported_parameter``), never
answered as if the field were not there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import torch

from tandem.engine.kv_store import KvStore
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.refusals import RefusedField
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.stats import EngineCounters, EngineStats, engine_counters
from tandem.engine.structured import CompiledConstraint
from tandem.engine.structured_spec import Constraint, StructuredOutputError
from tandem.engine.types import KVLayers, ModelShape
from tandem.models.info import ModelInfo

CANNED_TEXT = b"null engine "
NO_CONSTRAINTS = (
    "the null engine (--engine null) answers canned tokens and cannot honour structured "
    "outputs (json_schema, regex, grammar, structural_tag, json_object, choice); send the "
    "request to an embedded or vLLM worker"
)
NO_LOGPROBS = (
    "the null engine (--engine null) answers canned tokens and has no logprobs; send the "
    "request to an embedded or vLLM worker"
)


def null_shape(info: ModelInfo) -> ModelShape:
    """The model's vocabulary and context with a placeholder KV of one float a token."""
    return ModelShape(
        num_layers=1,
        num_kv_heads=1,
        head_dim=1,
        vocab_size=info.vocab_size,
        max_context=info.max_context,
    )


class NullEngine:
    def __init__(
        self,
        info: ModelInfo,
        kv_store: KvStore,
        token_delay_s: float = 0.0,
        block_size: int = 16,
    ) -> None:
        if token_delay_s < 0:
            raise ValueError("token_delay_s must be >= 0")
        shape = kv_store.shape
        self._shape = shape
        # Disabled (no budget): nothing to reuse, but a decode leg's lookups still count.
        self._prefix_cache = PrefixCache(shape, 0, block_size)
        self.kv_store = kv_store
        self.token_delay_s = token_delay_s
        self.stats = EngineStats()
        self._running: set[str] = set()
        self._aborted: set[str] = set()
        self._alive = False
        canned = [b for b in CANNED_TEXT if b not in info.eos_token_ids]
        self._canned = [b for b in canned if b < shape.vocab_size] or [0]

    def start(self) -> None:
        self._alive = True

    def stop(self) -> None:
        self._alive = False

    @property
    def alive(self) -> bool:
        return self._alive

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return 0

    @property
    def shape(self) -> ModelShape:
        return self._shape

    @property
    def block_size(self) -> int:
        return self._prefix_cache.block_size

    @property
    def prefix_cache(self) -> PrefixCache:
        """Always empty (no budget); the worker's KV-event publisher listens to it all the same."""
        return self._prefix_cache

    def match_prefix(self, keys: Sequence[bytes]) -> tuple[int, KVLayers]:
        return self._prefix_cache.match(keys)

    def counters(self) -> EngineCounters:
        return engine_counters(
            self.stats, self._prefix_cache, self.kv_store, self.num_running, vision_encodes=0
        )

    def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)

    def compile_constraint(
        self, constraint: Constraint, stop_token_ids: Sequence[int]
    ) -> CompiledConstraint:
        raise StructuredOutputError(NO_CONSTRAINTS, "unsupported_parameter")

    @property
    def returns_logprobs(self) -> bool:
        return False

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        prompt = request.prompt_ids
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) >= self._shape.max_context:
            raise ValueError(
                f"prompt of {len(prompt)} tokens does not fit the model's context of "
                f"{self._shape.max_context}"
            )
        if request.constraint is not None:
            raise StructuredOutputError(NO_CONSTRAINTS, "unsupported_parameter")
        if request.sampling.logprobs is not None:
            raise RefusedField(NO_LOGPROBS)
        rid = request.request_id
        self._running.add(rid)
        self.stats.prompt_tokens += len(prompt)
        outcome = "abort"
        try:
            if request.export_transfer_id:
                self._export(request)
            async for out in self._samples(request):
                yield out
            outcome = "abort" if rid in self._aborted else "finished"
        finally:
            self._running.discard(rid)
            self._aborted.discard(rid)
            if outcome == "abort" and request.export_transfer_id:
                self.kv_store.release(request.export_transfer_id)
            self.stats.count(outcome)

    def _export(self, request: EngineRequest) -> None:
        zeros = torch.zeros(1, len(request.prompt_ids), 1)
        transfer_id = request.export_transfer_id or ""
        # The media description goes with the KV as the embedded engine's does: a decode leg
        # that carries no media of its own (or only metadata to check) reads it there.
        self.kv_store.put(
            transfer_id, [(zeros, zeros)], request.prompt_ids, [], media=request.media
        )

    async def _samples(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        cached = request.local_cached_tokens
        generated: list[list[int]] = [[] for _ in range(request.n)]
        limit = request.sampling.max_tokens
        for step in range(limit):
            if self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            elif step:
                await asyncio.sleep(0)
            aborted = request.request_id in self._aborted
            token = self._canned[step % len(self._canned)]
            for index, tokens in enumerate(generated):
                if aborted:
                    yield EngineOutput(index, [], len(request.prompt_ids), len(tokens), 0, "abort")
                    continue
                tokens.append(token)
                self.stats.generated_tokens += 1
                reason = "length" if len(tokens) >= limit else None
                yield EngineOutput(
                    index=index,
                    token_ids=[token],
                    prompt_tokens=len(request.prompt_ids),
                    completion_tokens=len(tokens),
                    cached_tokens=cached,
                    finish_reason=reason,
                    output_ids=list(tokens) if reason else [],
                )
            if aborted:
                return
