"""Sampling: validation, greedy, filters, seeded determinism, min_tokens, finish reasons."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.engine.sampling import Sampler, SamplingConfig, finish_reason

EOS = (0,)


def cfg(**kw: object) -> SamplingConfig:
    kw.setdefault("max_tokens", 16)
    return SamplingConfig(**kw)  # type: ignore[arg-type]


def random_logits(vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 17}, "must not exceed max_tokens"),
        ({"stop_token_ids": (-3,)}, "stop_token_ids"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_invalid_configs_are_rejected_with_the_field_named(kw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cfg(**kw)


def test_stop_token_ids_list_becomes_tuple_and_defaults_are_valid() -> None:
    c = cfg(stop_token_ids=[5, 6])
    assert c.stop_token_ids == (5, 6)
    assert c.top_k == 0 and c.top_p == 1.0 and c.seed is None and not c.greedy


# -- greedy and filters that reduce to greedy ------------------------------------------


def test_greedy_picks_argmax_and_breaks_ties_to_lowest_id() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 3.0])
    assert Sampler(cfg(temperature=0.0)).next_token(logits, [], EOS) == 1


def test_greedy_does_not_modify_callers_logits() -> None:
    logits = torch.tensor([5.0, 1.0, 2.0])
    before = logits.clone()
    Sampler(cfg(temperature=0.0, min_tokens=3)).next_token(logits, [], EOS)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("seed", range(5))
def test_top_k_one_and_tiny_top_p_equal_greedy(seed: int) -> None:
    logits = random_logits(seed=seed)
    greedy = int(torch.argmax(logits))
    for c in (cfg(top_k=1, seed=seed), cfg(top_p=1e-6, seed=seed), cfg(min_p=1.0, seed=seed)):
        sampler = Sampler(c)
        assert {sampler.next_token(logits, [], EOS) for _ in range(20)} == {greedy}


def test_top_k_one_with_tie_matches_greedy_tie_break() -> None:
    logits = torch.tensor([1.0, 4.0, 4.0, 0.0])
    assert Sampler(cfg(top_k=1, seed=1)).next_token(logits, [], EOS) == 1


def test_top_k_limits_support_to_k_highest() -> None:
    logits = random_logits(seed=3)
    top3 = set(torch.topk(logits, 3).indices.tolist())
    sampler = Sampler(cfg(top_k=3, temperature=5.0, seed=3))
    seen = {sampler.next_token(logits, [], EOS) for _ in range(300)}
    assert seen == top3  # high temperature: all three show up, nothing else does


def test_sampling_follows_the_distribution_roughly() -> None:
    probs = torch.tensor([0.7, 0.2, 0.1])
    sampler = Sampler(cfg(seed=123))
    counts = [0, 0, 0]
    for _ in range(2000):
        counts[sampler.next_token(probs.log(), [], ())] += 1
    assert abs(counts[0] / 2000 - 0.7) < 0.05
    assert abs(counts[2] / 2000 - 0.1) < 0.04


def test_top_p_keeps_nucleus() -> None:
    # probs 0.5, 0.3, 0.15, 0.05: top_p=0.7 keeps {0, 1} (mass before id 2 is 0.8).
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    sampler = Sampler(cfg(top_p=0.7, seed=0))
    assert {sampler.next_token(logits, [], ()) for _ in range(300)} == {0, 1}


def test_min_p_drops_tokens_below_fraction_of_top() -> None:
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    sampler = Sampler(cfg(min_p=0.25, seed=0))  # threshold 0.125 -> keeps 0, 1, 2
    assert {sampler.next_token(logits, [], ()) for _ in range(400)} == {0, 1, 2}


# -- determinism ------------------------------------------------------------------------


def run(sampler: Sampler, steps: int = 30) -> list[int]:
    out: list[int] = []
    for step in range(steps):
        out.append(sampler.next_token(random_logits(seed=step), out, ()))
    return out


def test_same_seed_gives_same_tokens_different_seed_differs() -> None:
    a = run(Sampler(cfg(seed=7, max_tokens=30)))
    b = run(Sampler(cfg(seed=7, max_tokens=30)))
    c = run(Sampler(cfg(seed=8, max_tokens=30)))
    assert a == b
    assert a != c


def test_negative_seed_is_accepted_and_deterministic() -> None:
    assert run(Sampler(cfg(seed=-5))) == run(Sampler(cfg(seed=-5)))


# -- min_tokens -------------------------------------------------------------------------


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = torch.tensor([10.0, 0.0, 9.0, 1.0])  # eos 0 best, stop id 2 next
    sampler = Sampler(cfg(temperature=0.0, min_tokens=2, stop_token_ids=(2,)))
    assert sampler.next_token(logits, [], EOS) == 3
    assert sampler.next_token(logits, [3], EOS) == 3
    assert sampler.next_token(logits, [3, 3], EOS) == 0


def test_min_tokens_does_not_mask_eos_when_ignored() -> None:
    logits = torch.tensor([10.0, 0.0, 9.0])
    sampler = Sampler(cfg(temperature=0.0, min_tokens=2, ignore_eos=True))
    assert sampler.next_token(logits, [], EOS) == 0


def test_min_tokens_yields_when_everything_would_be_masked() -> None:
    logits = torch.tensor([1.0, 2.0, -math.inf])
    sampler = Sampler(cfg(temperature=0.0, min_tokens=1, stop_token_ids=(1,)))
    assert sampler.next_token(logits, [], EOS) == 1


def test_repetition_penalty_discourages_seen_tokens() -> None:
    logits = torch.tensor([2.0, 1.9, -1.0])
    sampler = Sampler(cfg(temperature=0.0, repetition_penalty=1.5))
    assert sampler.next_token(logits, [0], ()) == 1
    assert Sampler(cfg(temperature=0.0)).next_token(logits, [0], ()) == 0


def test_bad_logits_are_rejected() -> None:
    sampler = Sampler(cfg(temperature=0.0))
    with pytest.raises(ValueError, match="1-D"):
        sampler.next_token(torch.zeros(2, 3), [], ())
    with pytest.raises(ValueError, match="no finite"):
        sampler.next_token(torch.full((3,), math.nan), [], ())


# -- property: the sampled id is always allowed -----------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    # Half-integer logits: ties happen, yet temperature scaling never merges two values.
    halves=st.lists(st.integers(-40, 40), min_size=1, max_size=40),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 4.0]),
    top_k=st.integers(-1, 8),
    top_p=st.floats(0.01, 1.0),
    min_p=st.floats(0.0, 1.0),
    min_tokens=st.integers(0, 3),
    n_generated=st.integers(0, 4),
    seed=st.integers(-(2**31), 2**31 - 1),
)
def test_sampled_id_is_in_allowed_set(
    halves: list[int],
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    min_tokens: int,
    n_generated: int,
    seed: int,
) -> None:
    values = [h / 2 for h in halves]
    logits = torch.tensor(values)
    vocab = len(values)
    eos = {0}
    stops = (vocab - 1,)
    c = cfg(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        min_tokens=min_tokens,
        stop_token_ids=stops,
        seed=seed,
    )
    token = Sampler(c).next_token(logits, [1] * n_generated, eos)

    # Independent statement of the allowed set (no sorting tricks): mask, then rank.
    banned = eos | set(stops) if n_generated < min_tokens else set()
    if len(banned) == vocab:
        banned = set()
    candidates = [i for i in range(vocab) if i not in banned]
    assert token in candidates
    best = max(values[i] for i in candidates)
    if temperature == 0.0 or top_k == 1:
        assert token == min(i for i in candidates if values[i] == best)
    if top_k > 0:
        # Fewer than top_k candidates score strictly higher than the sampled token.
        assert sum(values[i] > values[token] for i in candidates) < top_k
    if min_p > 0 and temperature > 0:
        # Up to float rounding, p(token) >= min_p * p(best).
        assert (values[token] - best) / temperature >= math.log(min_p) - 1e-4


# -- finish_reason ----------------------------------------------------------------------


def test_finish_reason_stop_length_and_min_tokens() -> None:
    c = cfg(max_tokens=4, min_tokens=2, stop_token_ids=(9,))
    assert finish_reason(0, 1, c, EOS) is None  # eos before min_tokens
    assert finish_reason(0, 2, c, EOS) == "stop"
    assert finish_reason(9, 3, c, EOS) == "stop"
    assert finish_reason(5, 3, c, EOS) is None
    assert finish_reason(5, 4, c, EOS) == "length"
    assert finish_reason(9, 4, c, EOS) == "stop"  # stop wins over length


def test_finish_reason_ignore_eos_still_honours_stop_ids() -> None:
    c = cfg(max_tokens=8, ignore_eos=True, stop_token_ids=(9,))
    assert finish_reason(0, 1, c, EOS) is None
    assert finish_reason(9, 1, c, EOS) == "stop"
