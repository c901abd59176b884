"""Engine outputs as TensorRT-LLM's answer frames.

Streamed: a ``chunk`` per engine output with tokens (the new ids, the sequence's
``sequence_index``, the counts cumulative, the new tokens' logprobs when asked), then one
``complete`` per sequence with all of its ids and no logprobs (they went in the chunks).
Not streamed: only the completes, each with every id and logprob. With n > 1 every
sequence has its own index and its own complete.

A sequence that ended on a stop token (EOS, or one of ``stop_token_ids``) names it in
``matched_token_id``; unless ``include_stop_token_in_output``, the token (and its
logprob) is left out of the ids, as TensorRT-LLM strips it. ``completion_tokens`` still
counts it: it was generated, and every Tandem adapter counts it so.

``perf_metrics`` (``output_config.return_perf_metrics``) are wall-clock Unix times taken
here: the arrival (the request's ``arrival_time`` when sent), the hand-over to the engine,
the sequence's first and last tokens, and ``kv_cache_size``, the bytes of KV its tokens
hold. No KV moves between workers, so the transfer times stay 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.engine.request import EngineOutput
from tandem.wire.trtllm import trpb
from tandem.worker.trtllm.logprobs import wire_logprobs


@dataclass(slots=True)
class PerfClock:
    """When a request arrived, reached the engine, and each sequence's tokens came."""

    arrival: float
    kv_bytes_per_token: int
    scheduled: float = 0.0
    first: dict[int, float] = field(default_factory=dict)
    last: dict[int, float] = field(default_factory=dict)

    def saw(self, out: EngineOutput) -> None:
        if out.token_ids:
            now = time.time()
            self.first.setdefault(out.index, now)
            self.last[out.index] = now

    def metrics(self, out: EngineOutput) -> trpb.PerfMetrics:
        return trpb.PerfMetrics(
            arrival_time=self.arrival,
            first_scheduled_time=self.scheduled,
            first_token_time=self.first.get(out.index, 0.0),
            last_token_time=self.last.get(out.index, 0.0),
            kv_cache_size=(out.prompt_tokens + out.completion_tokens) * self.kv_bytes_per_token,
        )


@dataclass(slots=True)
class AnswerPlan:
    """How one request's outputs are written."""

    request_id: str
    stream: bool
    stop_ids: frozenset[int]  # a "stop" ending on one of these names it
    keep_stop_token: bool  # include_stop_token_in_output
    perf: PerfClock | None = None


def _matched(out: EngineOutput, plan: AnswerPlan) -> int | None:
    last = out.output_ids[-1] if out.output_ids else None
    if out.finish_reason == "stop" and last is not None and last in plan.stop_ids:
        return last
    return None


def frames(out: EngineOutput, plan: AnswerPlan) -> list[trpb.GenerateResponse]:
    """What one engine output puts on the wire (nothing, a chunk, a complete, or both)."""
    if plan.perf is not None:
        plan.perf.saw(out)
    matched = _matched(out, plan) if out.finished else None
    trim = matched is not None and not plan.keep_stop_token
    answers = []
    if plan.stream and out.token_ids:
        keep = len(out.token_ids) - 1 if trim else len(out.token_ids)
        # Trimmed: the stop token is the last of the final delta, with its entry.
        ids, entries = list(out.token_ids[:keep]), list(out.logprobs[:keep])
        if ids:
            chunk = trpb.GenerateStreamChunk(
                token_ids=ids,
                sequence_index=out.index,
                prompt_tokens=out.prompt_tokens,
                completion_tokens=out.completion_tokens,
                cached_tokens=out.cached_tokens,
                logprobs=wire_logprobs(entries),
            )
            answers.append(trpb.GenerateResponse(request_id=plan.request_id, chunk=chunk))
    if out.finished:
        complete = _complete(out, plan, matched, trim)
        answers.append(trpb.GenerateResponse(request_id=plan.request_id, complete=complete))
    return answers


def _complete(
    out: EngineOutput, plan: AnswerPlan, matched: int | None, trim: bool
) -> trpb.GenerateComplete:
    ids = out.output_ids[:-1] if trim else out.output_ids
    complete = trpb.GenerateComplete(
        output_token_ids=ids,
        sequence_index=out.index,
        finish_reason=out.finish_reason or "stop",
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
    )
    if matched is not None:
        complete.matched_token_id = matched
    if not plan.stream:  # streamed, every entry went out with its chunk already
        complete.logprobs.extend(wire_logprobs(out.output_logprobs[: len(ids)]))
    if plan.perf is not None:
        complete.perf_metrics.CopyFrom(plan.perf.metrics(out))
    return complete
