"""Logprob entries and where the sampler takes them: after the mask, before bias and penalties."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.engine.logprobs import token_logprob
from tandem.engine.sampling import Sampler, SamplingConfig

LOGITS = torch.tensor([1.0, 3.0, 3.0, 0.5, 3.0, -1.0])


def sampler(**kw: object) -> Sampler:
    return Sampler(SamplingConfig(max_tokens=4, temperature=0.0, **kw))  # type: ignore[arg-type]


def test_top_k_is_sorted_with_ties_to_the_lower_id() -> None:
    logprobs = torch.log_softmax(LOGITS, dim=0)
    entry = token_logprob(logprobs, 4, 4)
    assert entry.top_ids == (1, 2, 4, 0)
    assert list(entry.top_values) == sorted(entry.top_values, reverse=True)
    assert entry.logprob == pytest.approx(float(logprobs[4]))
    assert token_logprob(logprobs, 4, 2).top_ids == (1, 2)


def test_zero_alternatives_is_the_sampled_token_only() -> None:
    entry = token_logprob(torch.log_softmax(LOGITS, dim=0), 3, 0)
    assert entry.top_ids == () and entry.top_values == ()


def test_masked_tokens_are_minus_infinity_and_ties_go_low() -> None:
    scores = LOGITS.clone()
    scores[[1, 2, 4]] = -math.inf
    entry = token_logprob(torch.log_softmax(scores, dim=0), 0, 5)
    assert entry.top_ids == (0, 3, 5, 1, 2)
    assert entry.top_values[3:] == (-math.inf, -math.inf)
    assert math.fsum(math.exp(v) for v in entry.top_values) == pytest.approx(1.0)


def test_no_logprobs_unless_asked() -> None:
    token, entry = sampler().pick(LOGITS, [], [])
    assert token == 1 and entry is None


def test_greedy_token_is_the_top_alternative() -> None:
    token, entry = sampler(logprobs=3).pick(LOGITS, [], [])
    assert entry is not None
    assert token == entry.token_id == entry.top_ids[0] == 1
    assert entry.logprob == entry.top_values[0]


def test_logprobs_are_the_model_distribution_before_bias_and_penalties() -> None:
    raw = torch.log_softmax(LOGITS, dim=0)
    steered = sampler(logprobs=2, logit_bias=((5, 100.0),), frequency_penalty=2.0)
    token, entry = steered.pick(LOGITS, [1, 1], [])
    assert token == 5  # the bias decides the pick ...
    assert entry is not None
    assert entry.logprob == pytest.approx(float(raw[5]), abs=1e-6)  # ... not the logprob
    assert entry.top_ids == (1, 2)


def test_logprobs_see_the_mask_and_bias_cannot_lift_a_masked_token() -> None:
    def only_low_ids(scores: torch.Tensor) -> None:
        scores[3:] = -math.inf

    token, entry = sampler(logprobs=4, logit_bias=((4, 100.0),)).pick(
        LOGITS, [], [], constrain=only_low_ids
    )
    assert token == 1
    expected = torch.log_softmax(torch.tensor([1.0, 3.0, 3.0]), dim=0)
    assert entry is not None
    assert entry.top_ids == (1, 2, 0, 3)
    assert entry.top_values[:3] == pytest.approx(expected[[1, 2, 0]].tolist(), abs=1e-6)
    assert entry.top_values[3] == -math.inf


def test_sampled_tokens_report_their_own_logprob() -> None:
    seeded = Sampler(SamplingConfig(max_tokens=4, temperature=1.0, seed=5, logprobs=1))
    raw = torch.log_softmax(LOGITS, dim=0)
    for _ in range(20):
        token, entry = seeded.pick(LOGITS, [], [])
        assert entry is not None and entry.token_id == token
        assert entry.logprob == pytest.approx(float(raw[token]), abs=1e-6)
        assert entry.top_ids == (1,)


@pytest.mark.parametrize("value", [-1, 21, True, 2.0])
def test_logprobs_outside_0_to_20_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="logprobs"):
        SamplingConfig(max_tokens=1, logprobs=value)  # type: ignore[arg-type]
