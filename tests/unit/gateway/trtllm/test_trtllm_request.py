"""The TensorRT-LLM request the gateway builds from a chat or completions body
(docs/worker-protocols.md): every field of the wire contract present or absent as it says,
the defaults, and what the protocol cannot carry refused by name before any leg."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from blake3 import blake3

from tandem.errors import TandemError
from tandem.gateway.backends.scheduler.constraints import ANY_OBJECT_SCHEMA
from tandem.gateway.backends.trtllm.backend import TrtllmBackend
from tandem.gateway.backends.trtllm.request import cache_salt_id
from tandem.gateway.context import RequestContext
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.endpoints.completions.schema import CompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.generation_request import Constraint, SamplingSummary
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.wire.ebnf import choice_grammar
from tandem.wire.trtllm import trpb

BACKEND = TrtllmBackend()
GUIDE = trpb.GuidedDecodingParams
UNUSED_FIELDS = (
    "lora_config",
    "prompt_tuning_config",
    "multimodal_input",
    "kv_cache_retention",
    "disaggregated_params",
    "lookahead_config",
    "cache_salt_id",
    "arrival_time",
    "guided_decoding",
)
UNSET_SAMPLING = (
    "top_k",
    "top_p_min",
    "top_p_reset_ids",
    "top_p_decay",
    "seed",
    "min_tokens",
    "beam_search_diversity_rate",
    "prompt_ignore_length",
    "length_penalty",
    "early_stopping",
    "no_repeat_ngram_size",
)


@pytest.fixture(scope="module")
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    return ModelHandle.from_dir(request.getfixturevalue("qwen_meta_dir"), "tiny-qwen3-vl")


def context(handle: ModelHandle, **fields: Any) -> RequestContext:
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )
    ctx = RequestContext("chat", "req-1", body.generation(), handle)
    build_prompt(ctx)
    return ctx


def leg(handle: ModelHandle, **fields: Any) -> trpb.GenerateRequest:
    ctx = context(handle, **fields)
    BACKEND.build_request(ctx)
    wire: trpb.GenerateRequest = ctx.wire
    return wire


def refusal(handle: ModelHandle, **fields: Any) -> TandemError:
    with pytest.raises(TandemError) as info:
        leg(handle, **fields)
    return info.value


def test_an_unset_request_carries_the_defaults(handle: ModelHandle) -> None:
    ctx = context(handle)
    BACKEND.build_request(ctx)
    wire: trpb.GenerateRequest = ctx.wire
    assert wire.request_id == "req-1" and not wire.streaming
    assert wire.tokenized.original_text == ctx.prompt_text != ""
    assert list(wire.tokenized.input_token_ids) == ctx.prompt_ids
    assert list(wire.tokenized.query_token_ids) == []
    config = wire.sampling_config
    assert config.beam_width == 1 and config.num_return_sequences == 1
    for name in ("temperature", "top_p", "repetition_penalty", "min_p"):
        assert config.HasField(name), name
    assert config.temperature == 1.0 and config.top_p == 1.0
    assert config.repetition_penalty == 1.0 and config.min_p == 0
    assert config.HasField("presence_penalty") and config.presence_penalty == 0
    assert config.HasField("frequency_penalty") and config.frequency_penalty == 0
    for name in UNSET_SAMPLING:
        assert not config.HasField(name), name
    assert list(config.beam_width_array) == []
    out = wire.output_config
    assert not out.HasField("logprobs") and not out.HasField("prompt_logprobs")
    assert out.exclude_input_from_output
    assert not (out.return_context_logits or out.return_generation_logits)
    assert not (out.return_encoder_output or out.return_perf_metrics)
    # Unset: up to the model's context, the prompt taken off.
    assert wire.max_tokens == handle.info.max_context - len(ctx.prompt_ids) > 0
    for name in UNUSED_FIELDS:
        assert not wire.HasField(name), name
    assert list(wire.stop) == [] and list(wire.stop_token_ids) == []
    assert list(wire.bad) == [] and list(wire.bad_token_ids) == []
    assert list(wire.embedding_bias) == []
    assert not wire.ignore_eos and wire.include_stop_token_in_output


def test_client_values_are_carried(handle: ModelHandle) -> None:
    wire = leg(
        handle,
        temperature=0,
        top_p=0.5,
        top_k=7,
        min_p=0.05,
        max_completion_tokens=9,
        min_tokens=2,
        stop=["zz"],
        stop_token_ids=[5, 6],
        ignore_eos=True,
        n=3,
        seed=2**31 - 1,
        presence_penalty=0.25,
        frequency_penalty=-0.5,
        repetition_penalty=1.3,
    )
    config = wire.sampling_config
    assert config.HasField("temperature") and config.temperature == 0  # an explicit 0 stays
    assert config.top_p == 0.5 and config.top_k == 7
    assert config.min_p == pytest.approx(0.05) and config.min_tokens == 2
    assert config.num_return_sequences == 3 and config.beam_width == 1
    assert config.seed == 2**31 - 1  # smg drops a chat seed; Tandem sends it
    assert config.presence_penalty == 0.25 and config.frequency_penalty == -0.5
    assert config.repetition_penalty == pytest.approx(1.3)
    assert wire.max_tokens == 9
    # The gateway applies stop strings itself (so the worker streams); the ids go on.
    assert list(wire.stop) == [] and wire.streaming
    assert list(wire.stop_token_ids) == [5, 6] and wire.ignore_eos
    assert wire.include_stop_token_in_output  # counted as on the other protocols


def test_a_streamed_request_streams(handle: ModelHandle) -> None:
    assert leg(handle, stream=True).streaming


@pytest.mark.parametrize(("fields", "alternatives"), [({}, 0), ({"top_logprobs": 4}, 4)])
def test_logprobs_ask_for_the_alternatives(
    handle: ModelHandle, fields: dict[str, Any], alternatives: int
) -> None:
    out = leg(handle, logprobs=True, **fields).output_config
    assert out.HasField("logprobs") and out.logprobs == alternatives
    assert not out.HasField("prompt_logprobs") and out.exclude_input_from_output


def test_a_top_k_beyond_int32_keeps_its_meaning(handle: ModelHandle) -> None:
    assert leg(handle, top_k=2**32 - 1).sampling_config.top_k == 2**31 - 1


def test_a_negative_seed_is_refused_by_name(handle: ModelHandle) -> None:
    err = refusal(handle, seed=-1)
    assert (err.status, err.code, err.param) == (400, "invalid_request", "seed")
    assert "unsigned" in err.message and "trtllm" in err.message


def test_logit_bias_is_a_dense_vector_over_the_vocabulary(handle: ModelHandle) -> None:
    wire = leg(handle, logit_bias={"11": 2.5, "0": -1.0})
    bias = list(wire.embedding_bias)
    assert len(bias) == handle.info.vocab_size > 12
    assert bias[11] == 2.5 and bias[0] == -1.0
    assert sum(1 for value in bias if value != 0) == 2


def test_logit_bias_outside_the_vocabulary_is_refused(handle: ModelHandle) -> None:
    err = refusal(handle, logit_bias={str(handle.info.vocab_size): 1.0})
    assert (err.status, err.param) == (400, "logit_bias")


def test_logit_bias_over_an_unknown_vocabulary_is_refused(handle: ModelHandle) -> None:
    unknown = dataclasses.replace(handle.info, vocab_size=0)
    model = ModelHandle("m", unknown, handle.tokenizer, handle.template, None)
    with pytest.raises(TandemError) as info:
        leg(model, logit_bias={"3": 1.0})
    assert (info.value.status, info.value.param) == (400, "logit_bias")
    assert "vocabulary size is unknown" in info.value.message
    assert list(leg(model).embedding_bias) == []  # no bias asked: nothing to carry


def test_max_tokens_with_an_unknown_context_is_2048(handle: ModelHandle) -> None:
    unknown = dataclasses.replace(handle.info, max_context=0)
    model = ModelHandle("m", unknown, handle.tokenizer, handle.template, None)
    assert leg(model).max_tokens == 2048
    assert leg(model, max_tokens=3000).max_tokens == 3000


def test_completions_carry_their_own_default_limit(handle: ModelHandle) -> None:
    body = CompletionRequest.model_validate({"model": "tiny-qwen3-vl", "prompt": "Hi"})
    ctx = RequestContext("completions", "cmpl-1", body.generation(), handle)
    build_prompt(ctx)
    BACKEND.build_request(ctx)
    assert ctx.wire.max_tokens == 16 and ctx.wire.tokenized.original_text == "Hi"


@pytest.mark.parametrize(
    ("fields", "guide_type", "guide"),
    [
        ({"response_format": {"type": "json_object"}}, GUIDE.GUIDE_TYPE_JSON_SCHEMA, None),
        ({"structured_outputs": {"regex": "a+"}}, GUIDE.GUIDE_TYPE_REGEX, "a+"),
        (
            {"structured_outputs": {"grammar": 'root ::= "x"'}},
            GUIDE.GUIDE_TYPE_EBNF_GRAMMAR,
            'root ::= "x"',
        ),
        (
            {"structured_outputs": {"choice": ["yes", "no"]}},
            GUIDE.GUIDE_TYPE_EBNF_GRAMMAR,
            choice_grammar(("yes", "no")),
        ),
    ],
)
def test_constraints_become_guided_decoding(
    handle: ModelHandle, fields: dict[str, Any], guide_type: int, guide: str | None
) -> None:
    guided = leg(handle, **fields).guided_decoding
    assert guided.guide_type == guide_type != GUIDE.GUIDE_TYPE_JSON
    assert guided.guide == (ANY_OBJECT_SCHEMA if guide is None else guide)
    if guide is None:
        assert json.loads(guided.guide) == {"type": "object"}


def test_a_json_schema_is_sent_as_its_text(handle: ModelHandle) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    guided = leg(handle, response_format=fmt).guided_decoding
    assert guided.guide_type == GUIDE.GUIDE_TYPE_JSON_SCHEMA
    assert json.loads(guided.guide) == schema


def test_a_structural_tag_is_sent_as_one(handle: ModelHandle) -> None:
    ctx = context(handle)
    tag = json.dumps({"type": "structural_tag", "format": {"type": "any_text"}})
    sampling = dataclasses.replace(
        ctx.sampling, constraint=Constraint("structural_tag", tag, "tool_choice")
    )
    ctx.request = dataclasses.replace(ctx.request, sampling=sampling)
    BACKEND.build_request(ctx)
    guided = ctx.wire.guided_decoding
    assert (guided.guide_type, guided.guide) == (GUIDE.GUIDE_TYPE_STRUCTURAL_TAG, tag)


def test_a_choice_with_a_nul_is_refused(handle: ModelHandle) -> None:
    err = refusal(handle, structured_outputs={"choice": ["a\x00b"]})
    assert err.status == 400 and err.code == "invalid_structured_output"


@dataclasses.dataclass(frozen=True, slots=True)
class SaltedSampling(SamplingSummary):
    """The neutral sampling with a cache salt, as it will read once the endpoints pass one
    (today they refuse ``cache_salt``: no other protocol here carries it)."""

    cache_salt: str | None = None


def salted(handle: ModelHandle, salt: str) -> trpb.GenerateRequest:
    ctx = context(handle)
    fields = {f.name: getattr(ctx.sampling, f.name) for f in dataclasses.fields(SamplingSummary)}
    ctx.request = dataclasses.replace(
        ctx.request, sampling=SaltedSampling(**fields, cache_salt=salt)
    )
    BACKEND.build_request(ctx)
    wire: trpb.GenerateRequest = ctx.wire
    return wire


def test_a_cache_salt_travels_as_a_stable_signed_int64(handle: ModelHandle) -> None:
    tenant_a, tenant_b = salted(handle, "tenant-a"), salted(handle, "tenant-b")
    expected = int.from_bytes(blake3(b"tenant-a").digest()[:8], "little", signed=True)
    assert tenant_a.HasField("cache_salt_id") and tenant_a.cache_salt_id == expected
    assert tenant_b.cache_salt_id != tenant_a.cache_salt_id
    assert salted(handle, "tenant-a").cache_salt_id == expected  # the same every time
    assert cache_salt_id("tenant-a") == expected
    values = [cache_salt_id(f"t{i}") for i in range(64)]
    assert all(-(2**63) <= v < 2**63 for v in values) and min(values) < 0 < max(values)
    assert not leg(handle).HasField("cache_salt_id")
