"""MLX's answer frames read into neutral frames: a chunk's delta with its logprobs, a
streamed complete (no ids) and a whole one, a response with neither, alternatives trimmed
to what the client asked for, and index 0 whatever the wire says (one sample a request)."""

from __future__ import annotations

from tandem.gateway.backends.mlx.frames import mlx_frame
from tandem.gateway.logprobs import LogprobEntry
from tandem.wire.mlx import mpb


def logprobs(tokens: list[int], alternatives: int) -> mpb.OutputLogProbs:
    message = mpb.OutputLogProbs(token_ids=tokens, token_logprobs=[-1.0] * len(tokens))
    for token in tokens:
        message.top_logprobs.add(
            token_ids=[token + j for j in range(alternatives)],
            values=[-0.5 * j for j in range(alternatives)],
        )
    return message


def test_a_chunk_is_its_delta_with_lazy_logprobs() -> None:
    chunk = mpb.GenerateStreamChunk(token_ids=[42], prompt_tokens=5, completion_tokens=3, index=4)
    chunk.output_logprobs.CopyFrom(logprobs([42], 3))
    frame = mlx_frame(mpb.GenerateResponse(chunk=chunk), alternatives=2)
    assert frame is not None and not frame.final
    assert (frame.index, list(frame.token_ids)) == (0, [42])
    assert frame.logprobs is not None
    assert frame.logprobs() == [LogprobEntry(42, -1.0, ((42, 0.0), (43, -0.5)))]
    plain = mlx_frame(mpb.GenerateResponse(chunk=mpb.GenerateStreamChunk(token_ids=[1])))
    assert plain is not None and plain.logprobs is None


def test_a_streamed_complete_and_a_whole_one() -> None:
    streamed = mpb.GenerateComplete(
        finish_reason="length", prompt_tokens=5, completion_tokens=8, cached_tokens=2
    )
    frame = mlx_frame(mpb.GenerateResponse(complete=streamed))
    assert frame is not None and frame.final and list(frame.token_ids) == []
    assert (frame.finish_reason, frame.prompt_tokens, frame.cached_tokens) == ("length", 5, 2)
    whole = mpb.GenerateComplete(output_ids=[7, 8, 2], prompt_tokens=5, matched_stop_token_id=2)
    whole.output_logprobs.CopyFrom(logprobs([7, 8, 2], 1))
    frame = mlx_frame(mpb.GenerateResponse(complete=whole), alternatives=None)
    assert frame is not None and list(frame.token_ids) == [7, 8, 2]
    assert frame.finish_reason == "stop", "an empty reason reads as stop"
    assert frame.logprobs is not None
    assert [e.top for e in frame.logprobs()] == [((7, 0.0),), ((8, 0.0),), ((2, 0.0),)]


def test_a_response_with_neither_carries_nothing() -> None:
    assert mlx_frame(mpb.GenerateResponse()) is None
