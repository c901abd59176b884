"""Engine outputs as TensorRT-LLM frames: chunks and completes, both modes, n = 2,
logprobs, the stop token stripped or kept, perf metrics.

The outputs are written here as the engine emits them (a delta per token, the last with
its finish reason and every id), so each rule is checked on its own; the servicer tests
drive the same code through real engines.
"""

from __future__ import annotations

import time

from tandem.engine.logprobs import TokenLogprob
from tandem.engine.request import EngineOutput
from tandem.wire.trtllm import trpb
from tandem.worker.trtllm.answers import AnswerPlan, PerfClock, frames

EOS = 9


def entry(token: int) -> TokenLogprob:
    return TokenLogprob(token, -0.5 * token, (token, 1), (-0.5 * token, -3.0))


def outputs(index: int, tokens: list[int], reason: str) -> list[EngineOutput]:
    """One sequence's deltas, with logprob entries, as the embedded engine emits them."""
    out = []
    for k, token in enumerate(tokens, 1):
        final = k == len(tokens)
        out.append(
            EngineOutput(
                index=index,
                token_ids=[token],
                prompt_tokens=5,
                completion_tokens=k,
                cached_tokens=2,
                finish_reason=reason if final else None,
                output_ids=tokens[:k] if final else [],
                logprobs=[entry(token)],
                output_logprobs=[entry(t) for t in tokens[:k]] if final else [],
            )
        )
    return out


def interleaved() -> list[EngineOutput]:
    """Two sequences stepping together: one ends on EOS, the other at its length."""
    a, b = outputs(0, [3, 4, EOS], "stop"), outputs(1, [6, 7, 8], "length")
    return [o for pair in zip(a, b, strict=True) for o in pair]


def plan(stream: bool, keep: bool = False, perf: PerfClock | None = None) -> AnswerPlan:
    return AnswerPlan("rid", stream, frozenset({EOS}), keep, perf)


def run(p: AnswerPlan) -> list[trpb.GenerateResponse]:
    return [frame for out in interleaved() for frame in frames(out, p)]


def test_streamed_chunks_carry_deltas_and_each_sequence_ends_with_its_complete() -> None:
    answer = run(plan(stream=True))
    assert {f.request_id for f in answer} == {"rid"}
    chunks = [f.chunk for f in answer if f.HasField("chunk")]
    completes = {f.complete.sequence_index: f.complete for f in answer if f.HasField("complete")}
    by_seq = {i: [t for c in chunks if c.sequence_index == i for t in c.token_ids] for i in (0, 1)}
    assert by_seq == {0: [3, 4], 1: [6, 7, 8]}, "the stop token is stripped from the chunks"
    assert [c.completion_tokens for c in chunks if c.sequence_index == 1] == [1, 2, 3]
    assert all(c.prompt_tokens == 5 and c.cached_tokens == 2 for c in chunks)
    assert [len(c.logprobs) for c in chunks] == [1] * len(chunks)
    done = completes[0]
    assert list(done.output_token_ids) == [3, 4] and done.finish_reason == "stop"
    assert done.WhichOneof("matched_stop") == "matched_token_id" and done.matched_token_id == EOS
    assert done.completion_tokens == 3, "the stripped stop token was still generated"
    assert not done.logprobs, "streamed, the logprobs went in the chunks"
    length = completes[1]
    assert list(length.output_token_ids) == [6, 7, 8] and length.finish_reason == "length"
    assert length.WhichOneof("matched_stop") is None


def test_not_streamed_only_the_completes_come_with_every_logprob() -> None:
    answer = run(plan(stream=False))
    assert all(f.HasField("complete") for f in answer) and len(answer) == 2
    done = {f.complete.sequence_index: f.complete for f in answer}
    assert [lp.token_id for lp in done[0].logprobs] == [3, 4], "the stripped token's too"
    assert [lp.token_id for lp in done[1].logprobs] == [6, 7, 8]
    top = done[1].logprobs[0].top_logprobs
    assert [(t.token_id, t.logprob) for t in top] == [(6, -3.0), (1, -3.0)]


def test_include_stop_token_in_output_keeps_it_everywhere() -> None:
    streamed = run(plan(stream=True, keep=True))
    ids = [
        t
        for f in streamed
        if f.HasField("chunk") and f.chunk.sequence_index == 0
        for t in f.chunk.token_ids
    ]
    assert ids == [3, 4, EOS]
    whole = {f.complete.sequence_index: f.complete for f in run(plan(stream=False, keep=True))}
    assert list(whole[0].output_token_ids) == [3, 4, EOS] and whole[0].matched_token_id == EOS
    assert [lp.token_id for lp in whole[0].logprobs] == [3, 4, EOS]


def test_an_abort_ends_with_a_complete_and_no_chunk() -> None:
    aborted = EngineOutput(0, [], 5, 0, 0, "abort")
    (only,) = frames(aborted, plan(stream=True))
    assert only.complete.finish_reason == "abort" and not only.complete.output_token_ids
    assert only.complete.WhichOneof("matched_stop") is None


def test_perf_metrics_time_each_sequence() -> None:
    before = time.time()
    clock = PerfClock(arrival=before - 1.0, kv_bytes_per_token=100, scheduled=before)
    answer = run(plan(stream=True, perf=clock))
    done = {f.complete.sequence_index: f.complete for f in answer if f.HasField("complete")}
    for index, complete in done.items():
        metrics = complete.perf_metrics
        assert complete.HasField("perf_metrics")
        assert metrics.arrival_time == before - 1.0 and metrics.first_scheduled_time == before
        assert before <= metrics.first_token_time <= metrics.last_token_time <= time.time()
        assert metrics.kv_cache_size == (5 + 3) * 100, index
        assert metrics.kv_cache_transfer_start == metrics.kv_cache_transfer_end == 0
    assert not any(f.complete.HasField("perf_metrics") for f in run(plan(stream=False)))
