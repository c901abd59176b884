"""The MLX request the gateway builds from a chat or completions body
(docs/worker-protocols.md): always tokenized, temperature always present, the other scalars
with 0 for off, ``logprobs`` counted as MLX's servicer counts it, the seed in int32, n > 1 as
n single-sample requests, and what the protocol cannot carry refused by name."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tandem.errors import TandemError
from tandem.gateway.backends.mlx.backend import MlxBackend
from tandem.gateway.backends.mlx.leg import MlxLeg, wrap_int32
from tandem.gateway.context import RequestContext
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.endpoints.completions.schema import CompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.wire.mlx import mpb

BACKEND = MlxBackend()
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    return ModelHandle.from_dir(request.getfixturevalue("qwen_meta_dir"), "tiny-qwen3-vl")


def chat_context(handle: ModelHandle, **fields: Any) -> RequestContext:
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )
    ctx = RequestContext("chat", "req-1", body.generation(), handle)
    build_prompt(ctx)
    return ctx


def leg(handle: ModelHandle, **fields: Any) -> MlxLeg:
    ctx = chat_context(handle, **fields)
    BACKEND.build_request(ctx)
    wire: MlxLeg = ctx.wire
    return wire


def refusal(ctx: RequestContext) -> TandemError:
    with pytest.raises(TandemError) as info:
        BACKEND.build_request(ctx)
    assert ctx.wire is None, "nothing is built for a refused request"
    return info.value


def test_unset_fields_read_as_the_servicer_expects(handle: ModelHandle) -> None:
    built = leg(handle)
    wire = built.request
    params = wire.sampling_params
    assert wire.request_id == "req-1" and not wire.stream
    assert wire.WhichOneof("input") == "tokenized"
    assert list(wire.tokenized.input_ids) == chat_context(handle).prompt_ids
    assert wire.tokenized.original_text.startswith("<|im_start|>")
    assert params.HasField("temperature") and params.temperature == 1.0
    assert (params.top_p, params.top_k, params.min_p) == (1.0, 0, 0.0)
    assert (params.repetition_penalty, params.frequency_penalty, params.presence_penalty) == (
        1.0,
        0.0,
        0.0,
    )
    # Unset: the servicer fills the context.
    assert not params.HasField("max_tokens")
    assert not params.HasField("logprobs") and not params.HasField("seed")
    assert not params.ignore_eos and not params.stop_token_ids and not params.logit_bias
    assert (built.n, built.alternatives) == (1, None)


def test_client_values_are_carried(handle: ModelHandle) -> None:
    built = leg(
        handle,
        temperature=0,
        top_p=0.5,
        top_k=7,
        min_p=0.1,
        repetition_penalty=1.2,
        frequency_penalty=0.5,
        presence_penalty=-0.25,
        max_completion_tokens=9,
        stop_token_ids=[5, 6],
        ignore_eos=True,
        seed=-(2**31),
        logprobs=True,
        top_logprobs=3,
        logit_bias={"11": 2.5, "12": -1},
        stream=True,
    )
    params = built.request.sampling_params
    assert params.HasField("temperature") and params.temperature == 0
    assert (params.top_p, params.top_k) == (0.5, 7)
    assert params.min_p == pytest.approx(0.1) and params.repetition_penalty == pytest.approx(1.2)
    assert (params.frequency_penalty, params.presence_penalty) == (0.5, -0.25)
    assert params.max_tokens == 9 and list(params.stop_token_ids) == [5, 6]
    assert params.ignore_eos and params.seed == -(2**31)
    assert dict(params.logit_bias) == {11: 2.5, 12: -1.0}
    assert params.logprobs == 3 and built.alternatives == 3
    assert built.request.stream


def test_stop_strings_stay_in_the_gateway_and_make_the_worker_stream(
    handle: ModelHandle,
) -> None:
    built = leg(handle, stop=["zz", "</s>"])
    assert built.request.stream  # the gateway drops the stream once every choice stopped
    assert not built.request.sampling_params.stop_token_ids  # nothing of them on the wire


def test_logprobs_without_alternatives_ask_for_one_and_show_none(handle: ModelHandle) -> None:
    """MLX's servicer returns no logprobs at all for 0; 1 is asked and trimmed away."""
    built = leg(handle, logprobs=True)
    assert built.request.sampling_params.logprobs == 1 and built.alternatives == 0


def test_completions_logprobs_count_alike(handle: ModelHandle) -> None:
    body = CompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "prompt": "Hi", "logprobs": 0, "max_tokens": 4}
    )
    ctx = RequestContext("completions", "cmpl-1", body.generation(), handle)
    build_prompt(ctx)
    BACKEND.build_request(ctx)
    assert ctx.wire.request.sampling_params.logprobs == 1 and ctx.wire.alternatives == 0
    assert ctx.wire.request.sampling_params.max_tokens == 4


def test_n_becomes_single_sample_requests_with_seeds_in_turn(handle: ModelHandle) -> None:
    built = leg(handle, n=3, seed=2**31 - 2)
    subs = built.samples()
    assert [s.request_id for s in subs] == ["req-1-0", "req-1-1", "req-1-2"]
    # Wrapping within int32, the wire's type.
    assert [s.sampling_params.seed for s in subs] == [2**31 - 2, 2**31 - 1, -(2**31)]
    assert built.request.sampling_params.seed == 2**31 - 2, "the leg itself is unchanged"
    fanned = BACKEND.fanout(built, parallel=True)
    assert fanned is not None
    assert [rid for rid, _ in fanned] == ["req-1-0", "req-1-1", "req-1-2"]
    assert all(sub.n == 1 and sub.request_id == rid for rid, sub in fanned)
    unseeded = leg(handle, n=2).samples()
    assert not any(s.sampling_params.HasField("seed") for s in unseeded)
    assert BACKEND.fanout(leg(handle), parallel=True) is None
    assert leg(handle).samples() == [leg(handle).request]


def test_wrap_int32() -> None:
    assert [wrap_int32(v) for v in (0, -1, 2**31, -(2**31) - 1, 2**32 + 5)] == [
        0,
        -1,
        -(2**31),
        2**31 - 1,
        5,
    ]


def test_a_retry_renames_the_leg_and_its_samples(handle: ModelHandle) -> None:
    built = leg(handle, n=2)
    BACKEND.sender.rename(built, "req-1-retry1")
    assert [s.request_id for s in built.samples()] == ["req-1-retry1-0", "req-1-retry1-1"]


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_an_image_is_refused_before_any_media_work(handle: ModelHandle) -> None:
    ctx = chat_context(
        handle, messages=[{"role": "user", "content": [IMAGE, {"type": "text", "text": "?"}]}]
    )
    err = refusal(ctx)
    assert (err.status, err.code) == (400, "multimodal_not_supported")
    assert "not supported over the mlx worker protocol" in err.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "object"}},
                }
            },
            "response_format",
        ),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
        ({"tools": [TOOL], "tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [TOOL],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
            "tool_choice",
        ),
    ],
)
def test_a_constraint_is_refused_naming_its_field(
    handle: ModelHandle, fields: dict[str, Any], param: str
) -> None:
    err = refusal(chat_context(handle, **fields))
    assert (err.status, err.code) == (400, "unsupported_parameter")
    assert err.param is not None and err.param.startswith(param)
    assert "mlx worker protocol" in err.message


def test_tools_the_model_may_call_freely_are_sent(handle: ModelHandle) -> None:
    built = leg(handle, tools=[TOOL], tool_choice="auto")
    assert built.request.tokenized.input_ids  # no constraint: the answer is parsed here


def test_min_tokens_is_refused_by_name(handle: ModelHandle) -> None:
    err = refusal(chat_context(handle, min_tokens=2))
    assert (err.code, err.param) == ("unsupported_parameter", "min_tokens")


def _with_sampling(ctx: RequestContext, **changes: Any) -> RequestContext:
    sampling = dataclasses.replace(ctx.request.sampling, **changes)
    ctx.request = dataclasses.replace(ctx.request, sampling=sampling)
    return ctx


@pytest.mark.parametrize("seed", [2**31, -(2**31) - 1])
def test_a_seed_outside_int32_is_refused_by_name(handle: ModelHandle, seed: int) -> None:
    """The endpoints' own bounds stop such a seed already; the builder does not rely on it."""
    err = refusal(_with_sampling(chat_context(handle), seed=seed))
    assert (err.status, err.code, err.param) == (400, "invalid_request", "seed")
    assert "int32" in err.message


def test_more_alternatives_than_mlx_returns_are_refused_by_name(handle: ModelHandle) -> None:
    err = refusal(_with_sampling(chat_context(handle, logprobs=True), logprobs=21))
    assert (err.status, err.param) == (400, "top_logprobs")
    assert leg(handle, logprobs=True, top_logprobs=20).request.sampling_params.logprobs == 20


def test_logit_bias_outside_the_vocabulary_is_refused(handle: ModelHandle) -> None:
    err = refusal(chat_context(handle, logit_bias={str(handle.info.vocab_size): 1}))
    assert (err.code, err.param) == ("invalid_request", "logit_bias")


def test_the_message_round_trips(handle: ModelHandle) -> None:
    wire = leg(handle, max_tokens=3, seed=4).request
    assert mpb.GenerateRequest.FromString(wire.SerializeToString()) == wire
