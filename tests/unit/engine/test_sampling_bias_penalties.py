"""logit_bias and the frequency / presence penalties change what the engine samples.

They used to be accepted on the wire and ignored by the embedded engine.
"""

from __future__ import annotations

import pytest
import torch

from tandem.engine.sampling import Sampler, SamplingConfig
from tandem.wire.proto import pb
from tandem.worker.vllm.inputs import sampling_config

LOGITS = torch.tensor([3.0, 2.5, 1.0, 0.0])


def greedy(**kw: object) -> Sampler:
    return Sampler(SamplingConfig(max_tokens=8, temperature=0.0, **kw))  # type: ignore[arg-type]


def test_logit_bias_steers_and_bans() -> None:
    assert greedy().next_token(LOGITS, [], []) == 0
    assert greedy(logit_bias=((3, 100.0),)).next_token(LOGITS, [], []) == 3
    assert greedy(logit_bias=((0, -100.0),)).next_token(LOGITS, [], []) == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        greedy(logit_bias=((9, 1.0),)).next_token(LOGITS, [], [])


def test_frequency_penalty_counts_each_occurrence() -> None:
    # Token 0 leads by 0.5: one occurrence at 0.4 keeps it, two (0.8) hand the lead to 1.
    assert greedy(frequency_penalty=0.4).next_token(LOGITS, [0], []) == 0
    assert greedy(frequency_penalty=0.4).next_token(LOGITS, [0, 0], []) == 1


def test_presence_penalty_counts_once() -> None:
    assert greedy(presence_penalty=0.6).next_token(LOGITS, [0], []) == 1
    assert greedy(presence_penalty=0.4).next_token(LOGITS, [0, 0, 0], []) == 0
    # A negative penalty favours what was already said.
    assert greedy(presence_penalty=-2.0).next_token(LOGITS, [1], []) == 1


@pytest.mark.parametrize(
    "kw",
    [{"frequency_penalty": 2.5}, {"presence_penalty": float("nan")}, {"logit_bias": ((1, 101.0),)}],
)
def test_out_of_range_values_are_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        SamplingConfig(max_tokens=1, **kw)


def test_the_wire_fields_reach_the_engine() -> None:
    params = pb.SamplingParams(max_tokens=4, frequency_penalty=0.5, presence_penalty=-0.5)
    params.logit_bias[7] = 5.0
    params.logit_bias[3] = -2.0
    config = sampling_config(params, prompt_len=10, max_context=100, vocab_size=16)
    assert config.frequency_penalty == 0.5 and config.presence_penalty == -0.5
    assert config.logit_bias == ((3, -2.0), (7, 5.0))
    params.logit_bias[99] = 1.0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sampling_config(params, prompt_len=10, max_context=100, vocab_size=16)
