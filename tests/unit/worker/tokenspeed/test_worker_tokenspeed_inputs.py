"""TokenSpeed's prompt, sampling and constraint fields as the engine takes them, or refused.

TokenSpeed's sampling scalars are ``optional``: unset reads as TokenSpeed's default, a sent
0 as 0.
"""

from __future__ import annotations

import pytest
from google.protobuf import struct_pb2

from tandem.engine.refusals import RefusedField
from tandem.engine.structured_spec import Constraint
from tandem.wire.tokenspeed import tpb
from tandem.worker.tokenspeed.inputs import (
    prefill_sampling,
    prompt_ids,
    refuse_unsupported,
    sampling_config,
    sampling_n,
    wire_constraint,
)

VOCAB, CONTEXT = 263, 100


def request(**params: object) -> tpb.GenerateRequest:
    """Only the sampling fields named are set; every other optional scalar is unset."""
    req = tpb.GenerateRequest(request_id="r")
    req.tokenized.input_ids.extend([1, 2, 3])
    sampling = req.sampling_params
    for name, value in params.items():
        if isinstance(value, list):
            getattr(sampling, name).extend(value)
        else:
            setattr(sampling, name, value)
    return req


def config(req: tpb.GenerateRequest, prompt_len: int = 10):
    return sampling_config(req, prompt_len, CONTEXT, VOCAB)


def test_unset_scalars_read_as_tokenspeeds_defaults() -> None:
    c = config(request())
    assert c.max_tokens == CONTEXT - 10, "unset max_new_tokens fills the context"
    assert (c.temperature, c.top_p, c.top_k, c.min_p) == (1.0, 1.0, 0, 0.0)
    assert (c.frequency_penalty, c.presence_penalty, c.repetition_penalty) == (0.0, 0.0, 1.0)
    assert c.seed is None and c.logprobs is None and c.min_tokens == 0 and not c.greedy


def test_explicit_values_are_taken_as_sent() -> None:
    c = config(
        request(
            temperature=0.0,
            top_p=0.5,
            top_k=7,
            min_p=0.1,
            frequency_penalty=0.5,
            presence_penalty=-0.5,
            repetition_penalty=1.2,
            max_new_tokens=4,
        )
    )
    assert c.greedy and c.temperature == 0.0, "an explicit 0 temperature is greedy"
    assert (c.top_p, c.top_k, c.max_tokens) == (0.5, 7, 4)
    assert c.min_p == pytest.approx(0.1) and c.repetition_penalty == pytest.approx(1.2)
    assert (c.frequency_penalty, c.presence_penalty) == (0.5, -0.5)


@pytest.mark.parametrize("top_k", [0, -1, -5])
def test_top_k_zero_or_below_is_off(top_k: int) -> None:
    assert config(request(top_k=top_k)).top_k == 0


def test_explicit_zeros_that_mean_nothing_are_refused_not_rewritten() -> None:
    with pytest.raises(ValueError, match="top_p"):
        config(request(top_p=0.0))
    with pytest.raises(ValueError, match="repetition_penalty"):
        config(request(repetition_penalty=0.0))
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        config(request(max_new_tokens=0))


def test_the_sampling_seed_reaches_the_engine() -> None:
    assert config(request(sampling_seed=0)).seed == 0, "seed 0 is a seed"
    assert config(request(sampling_seed=(1 << 64) - 1)).seed == (1 << 64) - 1
    assert config(request()).seed is None


def test_limits_and_ranges() -> None:
    assert config(request(max_new_tokens=1000), prompt_len=10).max_tokens == CONTEXT - 10
    with pytest.raises(ValueError, match="no room"):
        config(request(), prompt_len=CONTEXT)
    with pytest.raises(ValueError, match="temperature"):
        config(request(temperature=-1.0))
    with pytest.raises(ValueError, match="finite"):
        config(request(min_p=float("nan")))
    with pytest.raises(ValueError, match="stop_token_ids"):
        config(request(stop_token_ids=[VOCAB]))
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
    assert config(req).logprobs is None
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
    params = tpb.SamplingParams(**{field: "spec"})  # type: ignore[arg-type]
    assert wire_constraint(params) == Constraint(kind, "spec")  # type: ignore[arg-type]
    assert wire_constraint(tpb.SamplingParams()) is None


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda r: r.sampling_params.stop.append("\n"), "sampling_params.stop"),
        (lambda r: r.sampling_params.custom_params.update({"a": 1}), "custom_params"),
        (lambda r: r.token_ids_logprob.append(5), "token_ids_logprob"),
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


def test_one_data_parallel_rank() -> None:
    req = request()
    req.data_parallel_rank = 0
    refuse_unsupported(req)
    req.data_parallel_rank = 1
    with pytest.raises(ValueError, match="data_parallel_rank 1") as info:
        refuse_unsupported(req)
    assert not isinstance(info.value, RefusedField)


def test_fields_with_nothing_to_do_are_accepted() -> None:
    req = request(skip_special_tokens=True, no_stop_trim=True, spaces_between_special_tokens=True)
    req.sampling_params.custom_params.CopyFrom(struct_pb2.Struct())  # empty: nothing asked
    req.logprob_start_len = 0  # without return_logprob it asks for nothing
    refuse_unsupported(req)
    req.return_logprob, req.logprob_start_len = True, -1  # smg's: no prompt logprobs
    refuse_unsupported(req)
    req.ClearField("logprob_start_len")  # unset: no prompt logprobs either
    refuse_unsupported(req)


def test_prompt_and_n() -> None:
    assert prompt_ids(request()) == [1, 2, 3]
    with pytest.raises(ValueError, match="tokenized input must be provided"):
        prompt_ids(tpb.GenerateRequest())
    empty = tpb.GenerateRequest()
    empty.tokenized.original_text = "text only"
    with pytest.raises(ValueError, match="input_ids is empty"):
        prompt_ids(empty)
    assert sampling_n(request()) == 1 and sampling_n(request(n=3)) == 3


def test_the_tokenized_field_numbers_are_tokenspeeds() -> None:
    """input_ids is field 1 and original_text field 2 (reversed from SGLang's)."""
    wire = tpb.TokenizedInput(input_ids=[5], original_text="a").SerializeToString()
    assert wire.startswith(b"\x0a")  # field 1, length-delimited (packed ids)


def test_a_prefill_leg_runs_one_greedy_token_nothing_stops() -> None:
    c = prefill_sampling()
    assert (c.max_tokens, c.greedy, c.ignore_eos, c.logprobs) == (1, True, True, None)
