"""TensorRT-LLM's request fields as the engine takes them, or refused by name.

The sampling scalars are ``optional``: unset reads as TensorRT-LLM's default (greedy when
no sampling is named at all), a sent value as sent. Every field the worker cannot honour
is a ``RefusedField`` naming it.
"""

from __future__ import annotations

import math

import pytest

from tandem.engine.refusals import RefusedField
from tandem.engine.structured_spec import Constraint, StructuredOutputError
from tandem.wire.trtllm import trpb
from tandem.worker.trtllm.inputs import (
    cache_salt,
    embedding_bias,
    logprobs_of,
    prompt_ids,
    refuse_unsupported,
    wire_constraint,
)
from tandem.worker.trtllm.sampling import sampling_config, sampling_n

VOCAB, CONTEXT = 263, 100
GUIDE = trpb.GuidedDecodingParams
PD = trpb.DisaggregatedParams


def request(max_tokens: int = 8, **sampling: object) -> trpb.GenerateRequest:
    """As a gateway writes it: the prompt excluded from the output, only the named sampling
    fields set."""
    req = trpb.GenerateRequest(request_id="r", max_tokens=max_tokens)
    req.tokenized.input_token_ids.extend([1, 2, 3])
    req.output_config.exclude_input_from_output = True
    for name, value in sampling.items():
        if isinstance(value, list):
            getattr(req.sampling_config, name).extend(value)
        else:
            setattr(req.sampling_config, name, value)
    return req


def config(req: trpb.GenerateRequest, prompt_len: int = 10, **kwargs: object):
    return sampling_config(req, prompt_len, CONTEXT, VOCAB, **kwargs)  # type: ignore[arg-type]


def test_a_request_naming_no_sampling_decodes_greedily() -> None:
    c = config(request())
    assert c.greedy and c.temperature == 0.0
    assert (c.top_p, c.top_k, c.min_p) == (1.0, 0, 0.0)
    assert (c.frequency_penalty, c.presence_penalty, c.repetition_penalty) == (0.0, 0.0, 1.0)
    assert c.seed is None and c.min_tokens == 0 and c.max_tokens == 8
    assert sampling_n(request()) == 1


@pytest.mark.parametrize("named", [{"top_p": 0.9}, {"top_k": 5}])
def test_naming_top_p_or_top_k_samples_at_temperature_one(named: dict[str, object]) -> None:
    c = config(request(**named))
    assert c.temperature == 1.0 and not c.greedy


def test_explicit_values_are_taken_as_sent() -> None:
    c = config(
        request(
            temperature=0.7,
            top_p=0.5,
            top_k=7,
            min_p=0.1,
            repetition_penalty=1.2,
            presence_penalty=-0.5,
            frequency_penalty=0.5,
            seed=(1 << 64) - 1,
            min_tokens=3,
            num_return_sequences=3,
            beam_width=1,
        )
    )
    assert c.temperature == pytest.approx(0.7) and c.top_p == 0.5 and c.top_k == 7
    assert c.min_p == pytest.approx(0.1) and c.repetition_penalty == pytest.approx(1.2)
    assert (c.presence_penalty, c.frequency_penalty) == (-0.5, 0.5)
    assert c.seed == (1 << 64) - 1, "the whole uint64 seed"
    assert c.min_tokens == 3
    assert sampling_n(request(num_return_sequences=3)) == 3


def test_zero_and_negative_top_k_are_off() -> None:
    assert config(request(top_k=0)).top_k == 0
    assert config(request(top_k=-4)).top_k == 0


def test_stop_ids_ignore_eos_bias_and_logprobs_reach_the_engine() -> None:
    req = request()
    req.stop_token_ids.extend([5, 9])
    req.ignore_eos = True
    c = config(req, logit_bias=((4, 2.0),), logprobs=3)
    assert c.stop_token_ids == (5, 9) and c.ignore_eos
    assert c.logit_bias == ((4, 2.0),) and c.logprobs == 3


def test_max_tokens_is_clamped_to_the_context_and_zero_is_refused() -> None:
    assert config(request(max_tokens=2048), prompt_len=90).max_tokens == CONTEXT - 90
    with pytest.raises(ValueError, match="max_tokens is required"):
        config(request(max_tokens=0))
    with pytest.raises(ValueError, match="leaves no room"):
        config(request(), prompt_len=CONTEXT)


def test_min_tokens_above_max_tokens_is_refused_and_the_context_bounds_it() -> None:
    with pytest.raises(ValueError, match=r"min_tokens \(9\) must not exceed max_tokens \(8\)"):
        config(request(max_tokens=8, min_tokens=9))
    assert config(request(max_tokens=50, min_tokens=40), prompt_len=95).min_tokens == 5


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("temperature", math.nan, "temperature must be finite"),
        ("repetition_penalty", 0.0, "repetition_penalty must be finite and > 0"),
        ("presence_penalty", 3.0, "presence_penalty must be in [-2, 2]"),
        ("min_p", 2.0, "min_p must be in [0, 1]"),
    ],
)
def test_out_of_range_sampling_is_refused_naming_the_field(field, value, words) -> None:
    with pytest.raises(ValueError) as info:
        config(request(**{field: value}))
    assert str(info.value).startswith("sampling_config: ") and words in str(info.value)


def test_stop_token_ids_outside_the_vocabulary_are_refused() -> None:
    req = request()
    req.stop_token_ids.append(VOCAB)
    with pytest.raises(ValueError, match=r"stop_token_ids \[263\] are outside the vocabulary"):
        config(req)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("top_p_min", 0.1),
        ("top_p_reset_ids", 2),
        ("top_p_decay", 0.9),
        ("beam_search_diversity_rate", 0.5),
        ("prompt_ignore_length", 4),
        ("length_penalty", 1.0),
        ("early_stopping", 1),
        ("no_repeat_ngram_size", 3),
        ("beam_width_array", [2, 4]),
        ("beam_width", 4),
    ],
)
def test_beam_search_and_top_p_decay_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(RefusedField) as info:
        config(request(**{field: value}))
    assert f"sampling_config.{field}" in str(info.value)
    assert info.value.code == "unsupported_parameter"


def _set(req: trpb.GenerateRequest, path: str, value: object) -> None:
    *parents, name = path.split(".")
    target: object = req
    for parent in parents:
        target = getattr(target, parent)
    field = getattr(target, name)
    if isinstance(value, list):
        field.extend(value)
    elif hasattr(field, "SetInParent"):
        field.SetInParent()
    else:
        setattr(target, name, value)


@pytest.mark.parametrize(
    ("path", "value", "words"),
    [
        ("stop", ["\n"], "stop: this worker does not detokenize"),
        ("bad", ["foo"], "bad: this worker does not tokenize bad-word strings"),
        ("bad_token_ids", [5], "bad_token_ids: this worker's logit bias stops at -100"),
        ("lora_config", None, "lora_config: LoRA adapters"),
        ("prompt_tuning_config", None, "prompt_tuning_config: prompt tuning"),
        ("kv_cache_retention", None, "kv_cache_retention"),
        ("lookahead_config", None, "lookahead_config: lookahead decoding"),
        ("tokenized.query_token_ids", [4], "tokenized.query_token_ids: star attention"),
        ("output_config.prompt_logprobs", 0, "output_config.prompt_logprobs"),
        ("output_config.return_context_logits", True, "output_config.return_context_logits"),
        (
            "output_config.return_generation_logits",
            True,
            "output_config.return_generation_logits",
        ),
        ("output_config.return_encoder_output", True, "output_config.return_encoder_output"),
        (
            "output_config.exclude_input_from_output",
            False,
            "output_config.exclude_input_from_output is false",
        ),
    ],
)
def test_fields_the_worker_cannot_honour_are_refused_by_name(path, value, words) -> None:
    req = request()
    _set(req, path, value)
    with pytest.raises(RefusedField) as info:
        refuse_unsupported(req)
    assert words in str(info.value) and info.value.code == "unsupported_parameter"


def test_a_request_without_output_config_reads_as_tensorrt_llms_defaults() -> None:
    req = request()
    req.ClearField("output_config")
    refuse_unsupported(req)  # the prompt is excluded by default: nothing to refuse
    assert logprobs_of(req) is None


@pytest.mark.parametrize("kind", [PD.REQUEST_TYPE_CONTEXT_ONLY, PD.REQUEST_TYPE_GENERATION_ONLY])
def test_a_pd_phase_is_refused_with_the_pd_code(kind: int) -> None:
    req = request()
    req.disaggregated_params.request_type = kind  # type: ignore[assignment]
    with pytest.raises(RefusedField) as info:
        refuse_unsupported(req)
    assert str(info.value).startswith("disaggregated_params.request_type REQUEST_TYPE_")
    assert info.value.code == "runtime_pd_not_supported"
    whole = request()
    whole.disaggregated_params.ctx_request_id = "c"  # a whole request: nothing to refuse
    refuse_unsupported(whole)
    whole.disaggregated_params.context_phase_params.first_gen_token_id = 3
    with pytest.raises(RefusedField, match=r"disaggregated_params\.context_phase_params"):
        refuse_unsupported(whole)


def test_prompt_ids_are_required_and_in_the_vocabulary() -> None:
    assert prompt_ids(request(), VOCAB) == [1, 2, 3]
    with pytest.raises(ValueError, match="tokenized input must be provided"):
        prompt_ids(trpb.GenerateRequest(max_tokens=1), VOCAB)
    empty = request()
    del empty.tokenized.input_token_ids[:]
    with pytest.raises(ValueError, match=r"tokenized\.input_token_ids is empty"):
        prompt_ids(empty, VOCAB)
    empty.tokenized.input_token_ids.extend([1, VOCAB + 5])
    with pytest.raises(ValueError, match=r"holds \[268\], outside the vocabulary of 263"):
        prompt_ids(empty, VOCAB)


def test_logprobs_are_the_alternatives_asked_for() -> None:
    req = request()
    assert logprobs_of(req) is None
    req.output_config.logprobs = 0
    assert logprobs_of(req) == 0, "0: the sampled token's logprob alone"
    req.output_config.logprobs = 20
    assert logprobs_of(req) == 20
    for wrong in (21, -1):
        req.output_config.logprobs = wrong
        with pytest.raises(ValueError, match=r"output_config.logprobs must be in 0..20"):
            logprobs_of(req)


@pytest.mark.parametrize(
    ("guide_type", "guide", "expected"),
    [
        (
            GUIDE.GUIDE_TYPE_JSON_SCHEMA,
            '{"type": "object"}',
            Constraint("json_schema", '{"type": "object"}'),
        ),
        (GUIDE.GUIDE_TYPE_REGEX, "[a-z]+", Constraint("regex", "[a-z]+")),
        (GUIDE.GUIDE_TYPE_EBNF_GRAMMAR, 'root ::= "a"', Constraint("grammar", 'root ::= "a"')),
        (GUIDE.GUIDE_TYPE_STRUCTURAL_TAG, "{}", Constraint("structural_tag", "{}")),
        (GUIDE.GUIDE_TYPE_JSON, "", Constraint("json_object")),
    ],
)
def test_guided_decoding_maps_onto_the_engines_constraints(guide_type, guide, expected) -> None:
    req = request()
    assert wire_constraint(req) is None
    req.guided_decoding.guide_type = guide_type
    req.guided_decoding.guide = guide
    assert wire_constraint(req) == expected


def test_unspecified_guides_and_json_with_a_guide_are_refused() -> None:
    req = request()
    req.guided_decoding.SetInParent()
    with pytest.raises(StructuredOutputError, match="guide_type GUIDE_TYPE_UNSPECIFIED"):
        wire_constraint(req)
    req.guided_decoding.guide_type = GUIDE.GUIDE_TYPE_JSON
    req.guided_decoding.guide = '{"type": "object"}'
    with pytest.raises(StructuredOutputError, match="must be empty with GUIDE_TYPE_JSON"):
        wire_constraint(req)


def test_the_dense_embedding_bias_becomes_the_sparse_logit_bias() -> None:
    req = request()
    assert embedding_bias(req, VOCAB) == ()
    dense = [0.0] * VOCAB
    dense[7], dense[200] = -100.0, 2.5
    req.embedding_bias.extend(dense)
    assert embedding_bias(req, VOCAB) == ((7, -100.0), (200, 2.5))


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ([0.0] * (VOCAB - 1), "embedding_bias has 262 values; it is one per token"),
        ([0.0] * 10 + [-math.inf] + [0.0] * (VOCAB - 11), "embedding_bias[10] is -inf"),
        ([0.0] * 3 + [101.0] + [0.0] * (VOCAB - 4), "embedding_bias[3] is 101.0"),
    ],
)
def test_a_malformed_embedding_bias_is_refused(values: list[float], words: str) -> None:
    req = request()
    req.embedding_bias.extend(values)
    with pytest.raises(ValueError) as info:
        embedding_bias(req, VOCAB)
    assert words in str(info.value)


def test_the_cache_salt_is_the_ids_decimal_text() -> None:
    req = request()
    assert cache_salt(req) is None
    req.cache_salt_id = -(1 << 63)
    assert cache_salt(req) == str(-(1 << 63))
    req.cache_salt_id = 0
    assert cache_salt(req) == "0", "a present 0 still salts"
