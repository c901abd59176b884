"""Property-based fuzzing of the OpenAI request parsers and the stages right after them.

Whatever a client sends, the answer is a parsed request or a client error (400/413) with
a catalogued code; a parsed request then always renders, tokenizes and becomes a wire
request. Anything else would be a 500 (or a crash) in front of a client.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tandem.errors import ERROR_CATALOGUE, TandemError, openai_error_body
from tandem.gateway.backends.vllm.request import build_wire_request
from tandem.gateway.context import RequestContext
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest, parse_chat_request
from tandem.gateway.endpoints.completions.schema import parse_completion_request
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.prompt import build_prompt

# Many generated cases each: left out of `make test-unit`, run by `make test`.
pytestmark = pytest.mark.fuzz

# Values at the edges of the types the fields travel as (int32, uint32, int64, float32).
EDGE_INTS = [0, 1, -1, 16, 17, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, -(2**63)]
EDGE_FLOATS = [0.0, -0.0, 1e-45, 1e-300, 0.5, 1.0, 2.0, 2.0000001, 3.4e38, 1e39, 1e308]
scalars = (
    st.none()
    | st.booleans()
    | st.sampled_from(EDGE_INTS)
    | st.integers()
    | st.sampled_from(EDGE_FLOATS)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=10,
)

PARAMS = [
    "stream", "stream_options", "n", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens", "frequency_penalty",
    "presence_penalty", "repetition_penalty", "skip_special_tokens", "logprobs", "user",
]  # fmt: skip
CHAT_ONLY = ["max_completion_tokens", "top_logprobs", "tools"]
COMPLETION_ONLY = ["echo", "suffix", "best_of"]

text_part = st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=40)})
image_part = st.fixed_dictionaries(
    {
        "type": st.just("image_url"),
        "image_url": st.just("data:,") | st.fixed_dictionaries({"url": st.text(max_size=20)}),
    }
)
hostile_part = st.dictionaries(st.just("type"), json_values) | json_values
good_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant"]),
        "content": st.text(max_size=60) | st.lists(text_part | image_part, max_size=3),
    }
)
hostile_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "tool", "x"]) | json_values},
    optional={
        "content": st.none() | st.lists(text_part | image_part | hostile_part, max_size=3),
        "name": st.text(max_size=8) | json_values,
    },
)
# Mostly well-formed, so that the sampling fields' own checks are what decides.
messages = st.one_of(
    st.lists(good_message, min_size=1, max_size=3),
    st.lists(good_message, min_size=1, max_size=3),
    st.lists(good_message | hostile_message, max_size=3),
    json_values,
)
prompt = st.one_of(
    st.text(min_size=1, max_size=60),
    st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=8),
    st.lists(st.integers(min_value=-5, max_value=2**32), max_size=4),
    st.lists(st.lists(st.integers(0, 300), max_size=3) | st.text(max_size=5), max_size=3),
    json_values,
)
# A field's value: plausible, at a type's edge, or anything at all.
field_values = st.one_of(
    st.sampled_from(EDGE_INTS),
    st.sampled_from(EDGE_INTS),
    st.sampled_from(EDGE_FLOATS),
    st.booleans(),
    st.lists(st.sampled_from(EDGE_INTS), max_size=3),
    st.lists(st.text(max_size=4), max_size=5) | st.text(max_size=4),
    json_values,
)


def body(required: dict[str, Any], extra: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    model = st.just("tiny-qwen3-vl") | json_values
    params = st.dictionaries(st.sampled_from(PARAMS + extra), field_values, max_size=3)
    return st.builds(
        lambda fixed, rest: {**rest, **fixed},
        st.fixed_dictionaries({"model": model, **required}),
        params,
    )


chat_bodies = body({"messages": messages}, CHAT_ONLY)
completion_bodies = body({"prompt": prompt}, COMPLETION_ONLY)


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )


@pytest.fixture(scope="module")
def model(qwen_meta_dir: Path) -> ModelHandle:
    return ModelHandle.from_dir(qwen_meta_dir, "tiny-qwen3-vl")


def assert_client_error(err: TandemError) -> None:
    assert err.status in (400, 413), err
    assert err.code in ERROR_CATALOGUE
    json.dumps(openai_error_body(err))  # renders as the OpenAI error JSON


def through_the_stages(parsed: Any, model: ModelHandle, route: str) -> None:
    """Render, tokenize and build the wire request: ok, or a 400."""
    ctx = RequestContext(route, "tandem-fuzz", parsed.generation(), model)
    try:
        build_prompt(ctx)
    except TandemError as err:
        assert_client_error(err)
        return
    wire = build_wire_request(ctx)
    assert wire.SerializeToString()
    if isinstance(parsed, ChatCompletionRequest):
        assert all(isinstance(url, str) for url in ctx.media_urls)


@fuzz(700)
@given(json_values)
@pytest.mark.parametrize("parse", [parse_chat_request, parse_completion_request])
def test_any_json_parses_or_is_a_client_error(parse, value: Any) -> None:
    try:
        parse(json.dumps(value))
    except TandemError as err:
        assert_client_error(err)


@fuzz(400)
@given(st.binary(max_size=200))
def test_any_bytes_parse_or_are_a_client_error(raw: bytes) -> None:
    for parse in (parse_chat_request, parse_completion_request):
        try:
            parse(raw)
        except TandemError as err:
            assert_client_error(err)


@fuzz(1700)
@given(chat_bodies)
def test_chat_bodies_parse_and_run_or_are_client_errors(model: ModelHandle, data: dict) -> None:
    try:
        parsed = parse_chat_request(json.dumps(data))
    except TandemError as err:
        assert_client_error(err)
        event("refused")
        return
    event("parsed")
    assert 1 <= parsed.n <= 16 and parsed.messages
    through_the_stages(parsed, model, "chat")


@fuzz(1300)
@given(completion_bodies)
def test_completion_bodies_parse_and_run_or_are_client_errors(
    model: ModelHandle, data: dict
) -> None:
    try:
        parsed = parse_completion_request(json.dumps(data))
    except TandemError as err:
        assert_client_error(err)
        event("refused")
        return
    event("parsed")
    through_the_stages(parsed, model, "completions")


@pytest.mark.parametrize("field", ["max_tokens", "min_tokens", "top_k", "max_completion_tokens"])
def test_counts_beyond_the_wire_width_are_400_not_500(field: str) -> None:
    data = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: 2**32}
    with pytest.raises(TandemError) as info:
        parse_chat_request(json.dumps(data))
    assert (info.value.status, info.value.param) == (400, field)
