"""What a worker needs from an engine: the seam between the gRPC servicer and the compute.

Two engines implement it: the embedded PyTorch engine (``core.EmbeddedEngine``) and the
benchmark engine that answers canned tokens (``null.NullEngine``). The worker (servicer,
PD handoff, KV side channel, process) is written against :class:`Engine` alone, so the two
stay interchangeable and a third needs nothing more than these members.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from tandem.engine.kv_store import KvStore
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.stats import EngineCounters
from tandem.engine.structured import CompiledConstraint
from tandem.engine.structured_spec import Constraint
from tandem.engine.types import KVLayers, ModelShape


@runtime_checkable
class PrefixLookup(Protocol):
    """The local prefix cache as a decode leg's KV import uses it (``worker/handoff.py``)."""

    @property
    def block_size(self) -> int:
        """Tokens per prefix-cache block; block keys are computed at this size."""
        ...

    def match_prefix(self, keys: Sequence[bytes]) -> tuple[int, KVLayers]:
        """How many leading blocks of ``keys`` are cached, and their KV (counted as a lookup)."""
        ...


@runtime_checkable
class Engine(PrefixLookup, Protocol):
    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def alive(self) -> bool:
        """False once stopped (or its compute thread died): the health check reports it."""
        ...

    # -- load ---------------------------------------------------------------------------

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    # -- the model ----------------------------------------------------------------------

    @property
    def shape(self) -> ModelShape:
        """Context, vocabulary and KV layout: request limits and the KV frames follow it."""
        ...

    # -- requests -----------------------------------------------------------------------

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Outputs of ``request`` as they come; closing the iteration early aborts it."""
        ...

    def abort(self, request_id: str) -> None:
        """Stop ``request_id``: its samples end with the finish reason ``abort``."""
        ...

    # -- structured outputs and logprobs ---------------------------------------------------

    def compile_constraint(
        self, constraint: Constraint, stop_token_ids: Sequence[int]
    ) -> CompiledConstraint:
        """The constraint compiled for ``EngineRequest.constraint``; blocking (call it off
        the event loop). A constraint it cannot honour raises ``StructuredOutputError``,
        whose ``code`` the servicer sends with INVALID_ARGUMENT."""
        ...

    @property
    def returns_logprobs(self) -> bool:
        """Whether requests may set ``SamplingConfig.logprobs`` (else they are refused)."""
        ...

    # -- PD handoff and stats -----------------------------------------------------------

    @property
    def kv_store(self) -> KvStore:
        """Prefill KV held under transfer ids, served to decode workers by the side channel."""
        ...

    def counters(self) -> EngineCounters:
        """The engine's part of the worker's Stats answer."""
        ...
