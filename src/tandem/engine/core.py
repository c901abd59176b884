"""The engine loop: one compute thread that prefills new requests and steps running ones.

Requests arrive from the asyncio world through a thread-safe inbox; every model
call happens on the compute thread, so the gRPC event loop never blocks on
torch. Running samples advance one token per loop turn in round-robin order,
which keeps concurrent streams moving together.

Structured outputs: each sample of a constrained request owns a grammar matcher. A step
masks the logits with it before the sampler's own processing (``engine/sampling.py``
gives the order), the matcher then takes the chosen token, and once the grammar is
complete (its stop token taken: the stop token is the sample's last output token) the
sample ends with ``stop``.

:class:`EmbeddedEngine` implements the worker's ``engine.protocol.Engine``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import torch

from tandem.engine.aborts import PendingAborts
from tandem.engine.block_keys import block_keys
from tandem.engine.kv_events import BlockSource
from tandem.engine.kv_store import KvStore
from tandem.engine.logprobs import TokenLogprob
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.runner import ModelRunner, SequenceState
from tandem.engine.sampling import Sampler, finish_reason
from tandem.engine.stats import EngineCounters, EngineStats, engine_counters
from tandem.engine.structured import CompiledConstraint, StructuredCompiler, TokenMatcher
from tandem.engine.structured_spec import Constraint
from tandem.engine.types import KVLayers, ModelShape

log = logging.getLogger("tandem.engine")

Sink = Callable[[EngineOutput | BaseException], None]


class GrammarViolation(RuntimeError):
    """The grammar matcher refused the token chosen under its own mask: an engine bug.

    It ends the whole request with an error (the servicer reports INTERNAL), never the
    engine loop: the other requests keep running.
    """


@dataclass(slots=True)
class _Sample:
    index: int
    state: SequenceState
    sampler: Sampler
    matcher: TokenMatcher | None = None
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # kept only when asked
    done: bool = False


@dataclass(slots=True)
class _Running:
    request: EngineRequest
    sink: Sink
    samples: list[_Sample]
    cached_tokens: int


class EmbeddedEngine:
    def __init__(
        self,
        runner: ModelRunner,
        prefix_cache: PrefixCache,
        kv_store: KvStore,
        block_size: int = 16,
        *,
        json_any_whitespace: bool = False,
    ) -> None:
        self.runner = runner
        self.prefix_cache = prefix_cache
        self.kv_store = kv_store
        self.block_size = block_size
        self.stats = EngineStats()
        self._inbox: queue.SimpleQueue[tuple[EngineRequest, Sink]] = queue.SimpleQueue()
        self._aborted = PendingAborts()
        self._running: dict[str, _Running] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tandem-engine", daemon=True)
        # Built on the first constrained request: a worker that never sees one never loads
        # xgrammar or the tokenizer.
        self._structured = StructuredCompiler(
            runner.info.model_dir, runner.shape.vocab_size, any_whitespace=json_any_whitespace
        )

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._inbox.qsize()

    @property
    def shape(self) -> ModelShape:
        return self.runner.shape

    def match_prefix(self, keys: Sequence[bytes]) -> tuple[int, KVLayers]:
        return self.prefix_cache.match(keys)

    def counters(self) -> EngineCounters:
        return engine_counters(
            self.stats,
            self.prefix_cache,
            self.kv_store,
            self.num_running,
            vision_encodes=self.runner.vision_encodes,
        )

    # -- structured outputs and logprobs ---------------------------------------------------

    def compile_constraint(
        self, constraint: Constraint, stop_token_ids: Sequence[int]
    ) -> CompiledConstraint:
        """Compile against this model's vocabulary (blocking; cached by the compiler).

        The matchers stop on the model's eos ids and the request's ``stop_token_ids``,
        as vLLM's matchers stop on its ``all_stop_token_ids``.
        """
        stops = [*self.runner.eos_token_ids, *stop_token_ids]
        return self._structured.compile(constraint, stops)

    @property
    def returns_logprobs(self) -> bool:
        return True

    # -- requests -----------------------------------------------------------------------

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Queue ``request``; ``sink`` is called on the compute thread for every output."""
        self._inbox.put((request, sink))

    def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Outputs of ``request`` as they come; cancelling the iteration aborts it."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[EngineOutput | BaseException] = asyncio.Queue()

        def sink(item: EngineOutput | BaseException) -> None:
            loop.call_soon_threadsafe(outputs.put_nowait, item)

        self.submit(request, sink)
        remaining = request.n
        try:
            while remaining:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    remaining -= 1
                yield item
        finally:
            if remaining:
                self.abort(request.request_id)

    # -- compute thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._admit(block=not self._running)
            self._apply_aborts()
            for running in list(self._running.values()):
                self._step(running)

    def _admit(self, block: bool) -> None:
        try:
            request, sink = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        if self._aborted.take(request.request_id):
            self._finish_aborted_before_start(request, sink)
            return
        try:
            self._running[request.request_id] = self._prefill(request, sink)
        except Exception as exc:
            log.warning("request %s failed in prefill: %s", request.request_id, exc)
            self.stats.count("error")
            sink(exc)

    def _apply_aborts(self) -> None:
        for rid in self._aborted.take_any(self._running.keys()):
            running = self._running.pop(rid)
            self._release_export(running.request)
            # Counted before the last frame goes out: a client may read the stats the
            # moment it sees that frame.
            self.stats.count("abort")
            for sample in running.samples:
                if not sample.done:
                    self._emit(running, sample, [], "abort")

    def _finish_aborted_before_start(self, request: EngineRequest, sink: Sink) -> None:
        self.stats.count("abort")
        for index in range(request.n):
            sink(EngineOutput(index, [], len(request.prompt_ids), 0, 0, "abort"))

    def _release_export(self, request: EngineRequest) -> None:
        # An aborted prefill leg will never be pulled: free its KV now, not at lease expiry.
        if request.export_transfer_id:
            self.kv_store.release(request.export_transfer_id)

    def _prefill(self, request: EngineRequest, sink: Sink) -> _Running:
        prompt = request.prompt_ids
        if not prompt:
            raise ValueError("the prompt has no tokens")
        if len(prompt) >= self.runner.shape.max_context:
            raise ValueError(
                f"prompt of {len(prompt)} tokens does not fit the model's context of "
                f"{self.runner.shape.max_context}"
            )
        items = request.media.items if request.media else []
        keys = block_keys(prompt, items, request.cache_salt, self.block_size)
        cached: KVLayers | None
        if request.imported_kv is not None:
            cached, cached_tokens = request.imported_kv, request.local_cached_tokens
        else:
            # The last prompt position is always recomputed: its logits pick the first token.
            usable = (len(prompt) - 1) // self.block_size
            n_blocks, kv = self.prefix_cache.match(keys[:usable])
            cached, cached_tokens = (kv if n_blocks else None), n_blocks * self.block_size
        computed_from = cached[0][0].shape[1] if cached else 0
        logits, state = self.runner.prefill(prompt, request.media, cached)
        self.stats.prompt_tokens += len(prompt)
        self.stats.prefill_computed_tokens += len(prompt) - computed_from
        source = BlockSource(prompt, items, request.cache_salt, self.block_size)
        self.prefix_cache.insert(keys, state.kv, source)
        if request.export_transfer_id:
            prompt_kv = [(k[:, : len(prompt)], v[:, : len(prompt)]) for k, v in state.kv]
            # The media description goes with the KV (the store drops the pixels): a decode
            # leg that carries no media reads it there (worker/kv_channel.py, Describe).
            self.kv_store.put(
                request.export_transfer_id, prompt_kv, prompt, keys, media=request.media
            )
        samples = []
        for index in range(request.n):
            sample_state = state if index == 0 else _clone_state(state)
            config = request.sampling
            if config.seed is not None and index:
                config = dataclasses.replace(config, seed=config.seed + index)
            matcher = request.constraint.matcher() if request.constraint else None
            samples.append(_Sample(index, sample_state, Sampler(config), matcher))
        running = _Running(request, sink, samples, cached_tokens)
        for sample in samples:
            self._choose(running, sample, logits)
        return running

    def _step(self, running: _Running) -> None:
        try:
            for sample in running.samples:
                if sample.done:
                    continue
                if sample.state.length + 1 >= self.runner.shape.max_context:
                    self._emit(running, sample, [], "length")
                    continue
                logits = self.runner.decode_step(sample.state, sample.generated[-1])
                self._choose(running, sample, logits)
        except Exception as exc:
            log.warning("request %s failed while decoding: %s", running.request.request_id, exc)
            self._running.pop(running.request.request_id, None)
            self.stats.count("error")
            running.sink(exc)
            return
        if all(sample.done for sample in running.samples):
            self._running.pop(running.request.request_id, None)
            self.stats.count("finished")

    def _choose(self, running: _Running, sample: _Sample, logits: torch.Tensor) -> None:
        eos = self.runner.eos_token_ids
        matcher = sample.matcher
        token, entry = sample.sampler.pick(
            logits,
            sample.generated,
            eos,
            prompt_ids=running.request.prompt_ids,
            constrain=matcher.apply_mask if matcher else None,
        )
        if matcher is not None and not matcher.accept(token):
            raise GrammarViolation(f"the grammar refused token {token} chosen under its mask")
        sample.generated.append(token)
        if entry is not None:
            sample.logprobs.append(entry)
        self.stats.generated_tokens += 1
        reason = finish_reason(token, len(sample.generated), sample.sampler.config, eos)
        if matcher is not None and matcher.terminated:
            # The grammar is complete: nothing can follow, whatever min_tokens or ignore_eos
            # say (the matcher only ends on one of its stop tokens).
            reason = "stop"
        self._emit(running, sample, [token], reason, [entry] if entry else [])

    def _emit(
        self,
        running: _Running,
        sample: _Sample,
        delta: list[int],
        reason: str | None,
        delta_logprobs: list[TokenLogprob] | None = None,
    ) -> None:
        if reason is not None:
            sample.done = True
        final = reason is not None
        running.sink(
            EngineOutput(
                index=sample.index,
                token_ids=delta,
                prompt_tokens=len(running.request.prompt_ids),
                completion_tokens=len(sample.generated),
                cached_tokens=running.cached_tokens,
                finish_reason=reason,
                output_ids=list(sample.generated) if final else [],
                logprobs=delta_logprobs or [],
                output_logprobs=list(sample.logprobs) if final else [],
            )
        )


def _clone_state(state: SequenceState) -> SequenceState:
    kv = [(k.clone(), v.clone()) for k, v in state.kv]
    return dataclasses.replace(state, kv=kv)
