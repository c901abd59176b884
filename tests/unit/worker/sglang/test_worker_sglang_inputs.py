"""SGLang's prompt, sampling and constraint fields as the engine takes them, or refused."""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from tandem.engine.refusals import RefusedField
from tandem.engine.structured_spec import Constraint
from tandem.wire.sglang import spb
from tandem.worker.sglang.inputs import (
    prefill_sampling,
    prompt_ids,
    refuse_unsupported,
    sampling_config,
    sampling_n,
    wire_constraint,
)

VOCAB, CONTEXT = 263, 100


def request(**params: object) -> spb.GenerateRequest:
    """As a gateway writes it: every number explicit (temperature, top_p, top_k, penalty)."""
    req = spb.GenerateRequest(request_id="r", logprob_start_len=-1)
    req.tokenized.input_ids.extend([1, 2, 3])
    sampling = req.sampling_params
    sampling.temperature, sampling.top_p, sampling.top_k = 1.0, 1.0, -1
    sampling.repetition_penalty = 1.0
    for name, value in params.items():
        if isinstance(value, list):
            getattr(sampling, name).extend(value)
        else:
            setattr(sampling, name, value)
    return req


def config(req: spb.GenerateRequest, prompt_len: int = 10):
    return sampling_config(req, prompt_len, CONTEXT, VOCAB)


def test_the_gateway_defaults_read_as_off() -> None:
    c = config(request(max_new_tokens=5))
    assert (c.max_tokens, c.temperature, c.top_p, c.top_k, c.repetition_penalty) == (
        5,
        1.0,
        1.0,
        0,
        1.0,
    )
    assert c.seed is None and c.logprobs is None and c.min_tokens == 0


def test_unset_max_new_tokens_fills_the_context_and_zero_is_refused() -> None:
    assert config(request(), prompt_len=10).max_tokens == CONTEXT - 10
    assert config(request(max_new_tokens=1000), prompt_len=10).max_tokens == CONTEXT - 10
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        config(request(max_new_tokens=0))
    with pytest.raises(ValueError, match="no room"):
        config(request(), prompt_len=CONTEXT)


def test_meaningless_zeros_are_off_but_temperature_zero_is_greedy() -> None:
    req = request(max_new_tokens=4)
    req.sampling_params.top_p = 0.0
    req.sampling_params.repetition_penalty = 0.0
    req.sampling_params.temperature = 0.0
    c = config(req)
    assert (c.top_p, c.repetition_penalty, c.greedy) == (1.0, 1.0, True)


def test_numbers_out_of_range_are_invalid() -> None:
    with pytest.raises(ValueError, match="temperature"):
        config(request(temperature=-1.0))
    with pytest.raises(ValueError, match="finite"):
        config(request(min_p=float("nan")))
    with pytest.raises(ValueError, match="stop_token_ids"):
        config(request(stop_token_ids=[VOCAB]))


def test_min_new_tokens_and_ignore_eos_reach_the_engine() -> None:
    c = config(request(max_new_tokens=4, min_new_tokens=9, ignore_eos=True, stop_token_ids=[7]))
    assert (c.min_tokens, c.ignore_eos, c.stop_token_ids) == (4, True, (7,))


def test_logit_bias_keys_are_decimal_token_ids() -> None:
    req = request(max_new_tokens=2)
    req.sampling_params.logit_bias["12"] = 2.5
    req.sampling_params.logit_bias["3"] = -1.0
    assert config(req).logit_bias == ((3, -1.0), (12, 2.5))
    for bad in ("x", "-1", "²", str(VOCAB)):
        req = request(max_new_tokens=2)
        req.sampling_params.logit_bias[bad] = 1.0
        with pytest.raises(ValueError, match="logit_bias key"):
            config(req)


def test_logprobs_follow_return_logprob() -> None:
    req = request(max_new_tokens=2)
    req.top_logprobs_num = 5
    assert config(req).logprobs is None  # not asked
    req.return_logprob = True
    assert config(req).logprobs == 5
    req.top_logprobs_num = 0
    assert config(req).logprobs == 0
    req.top_logprobs_num = 21
    with pytest.raises(ValueError, match="top_logprobs_num"):
        config(req)


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        ("regex", "regex"),
        ("json_schema", "json_schema"),
        ("ebnf_grammar", "grammar"),
        ("structural_tag", "structural_tag"),
    ],
)
def test_each_constraint_reaches_the_engine(field: str, kind: str) -> None:
    params = spb.SamplingParams(**{field: "spec"})  # type: ignore[arg-type]
    assert wire_constraint(params) == Constraint(kind, "spec")  # type: ignore[arg-type]
    assert wire_constraint(spb.SamplingParams()) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: r.sampling_params.stop.append("\n"), "sampling_params.stop"),
        (lambda r: r.sampling_params.custom_params.update({"a": 1}), "custom_params"),
        (lambda r: r.token_ids_logprob.append(5), "token_ids_logprob"),
        (lambda r: setattr(r, "return_hidden_states", True), "return_hidden_states"),
        (lambda r: r.input_embeds.append(0.5), "input_embeds"),
        (lambda r: setattr(r, "lora_id", "a"), "lora_id"),
        (lambda r: setattr(r, "custom_logit_processor", "p"), "custom_logit_processor"),
        (
            lambda r: (setattr(r, "return_logprob", True), setattr(r, "logprob_start_len", 0)),
            "logprob_start_len",
        ),
    ],
)
def test_fields_the_worker_cannot_honour_are_refused_by_name(change, words: str) -> None:
    req = request()
    change(req)
    with pytest.raises(RefusedField, match=words) as info:
        refuse_unsupported(req)
    assert info.value.code == "unsupported_parameter"


def test_fields_with_nothing_to_do_are_accepted() -> None:
    req = request(skip_special_tokens=True, no_stop_trim=True, stream_interval=3)
    req.sampling_params.custom_params.CopyFrom(struct_pb2.Struct())  # empty: nothing asked
    req.data_parallel_rank = 0
    req.require_reasoning = True
    req.log_metrics = True
    req.logprob_start_len = 0  # without return_logprob it asks for nothing
    refuse_unsupported(req)


def test_prompt_and_n() -> None:
    assert prompt_ids(request()) == [1, 2, 3]
    with pytest.raises(ValueError, match="tokenized input must be provided"):
        prompt_ids(spb.GenerateRequest())
    empty = spb.GenerateRequest()
    empty.tokenized.original_text = "text only"
    with pytest.raises(ValueError, match="input_ids is empty"):
        prompt_ids(empty)
    assert sampling_n(request()) == 1 and sampling_n(request(n=3)) == 3


def test_a_prefill_leg_runs_one_greedy_token_nothing_stops() -> None:
    c = prefill_sampling()
    assert (c.max_tokens, c.greedy, c.ignore_eos, c.logprobs) == (1, True, True, None)
