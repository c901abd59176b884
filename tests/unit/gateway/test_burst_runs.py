"""``chunk_runs`` against the frame-by-frame fold it replaced, over random bursts."""

from __future__ import annotations

import random
from collections.abc import Callable

from tandem.gateway.backends.frames import Frame
from tandem.gateway.logprobs import LogprobEntry
from tandem.gateway.pipeline.bursts import chunk_runs

Logprobs = Callable[[], list[LogprobEntry]]


def folded_one_by_one(frames: list[Frame]) -> list[Frame]:
    """The reference: each chunk folded into the previous one of its run as it comes."""
    out: list[Frame] = []
    for frame in frames:
        last = out[-1] if out else None
        if last is None or last.final or frame.final or last.index != frame.index:
            out.append(frame)
            continue
        first, then = last.logprobs, frame.logprobs
        both: Logprobs | None = None
        if first is not None or then is not None:

            def both(first: Logprobs | None = first, then: Logprobs | None = then) -> list:
                return (first() if first else []) + (then() if then else [])

        out[-1] = Frame(
            last.index,
            [*last.token_ids, *frame.token_ids],
            both,
            prompt_tokens=frame.prompt_tokens or last.prompt_tokens,
            cached_tokens=max(last.cached_tokens, frame.cached_tokens),
        )
    return out


def entries(token: int) -> Logprobs:
    return lambda: [LogprobEntry(token, -0.5, ((token, -0.5),))]


def random_burst(rng: random.Random) -> list[Frame]:
    frames = []
    for _ in range(rng.randint(0, 12)):
        ids = [rng.randint(0, 99) for _ in range(rng.randint(0, 3))]
        frames.append(
            Frame(
                rng.choice((0, 0, 1)),
                ids,
                entries(ids[0] if ids else -1) if rng.random() < 0.5 else None,
                final=rng.random() < 0.15,
                finish_reason="length",
                prompt_tokens=rng.choice((0, 0, 7, 9)),
                cached_tokens=rng.choice((0, 3, 5)),
            )
        )
    return frames


def as_tuple(frame: Frame) -> tuple:
    logprobs = frame.logprobs() if frame.logprobs is not None else None
    return (
        frame.index,
        list(frame.token_ids),
        logprobs,
        frame.final,
        frame.prompt_tokens,
        frame.cached_tokens,
    )


def test_runs_match_the_frame_by_frame_fold() -> None:
    rng = random.Random(37)
    runs_seen = 0
    for _ in range(2000):
        burst = random_burst(rng)
        got, want = chunk_runs(burst), folded_one_by_one(burst)
        assert [as_tuple(f) for f in got] == [as_tuple(f) for f in want]
        runs_seen += len(burst) - len(got)
    assert runs_seen > 1000  # the bursts did fold: the comparison is not of lone frames


def test_a_final_frame_and_a_change_of_choice_end_a_run() -> None:
    frames = [Frame(0, [1]), Frame(0, [2]), Frame(1, [3]), Frame(1, [4]), Frame(1, [], final=True)]
    got = chunk_runs(frames)
    assert [(f.index, list(f.token_ids), f.final) for f in got] == [
        (0, [1, 2], False),
        (1, [3, 4], False),
        (1, [], True),
    ]
    assert got[-1] is frames[-1]
