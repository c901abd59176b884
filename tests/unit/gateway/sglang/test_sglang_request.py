"""The SGLang request the gateway builds from a chat body (docs/worker-protocols.md): every
sampling field written out as SGLang reads it, the constraint in SGLang's oneof, and what
the protocol cannot carry refused by name before anything is sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tandem.errors import TandemError
from tandem.gateway.backends.sglang.backend import SglangBackend
from tandem.gateway.backends.sglang.request import ANY_OBJECT_SCHEMA
from tandem.gateway.context import RequestContext
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.wire.sglang import spb

BACKEND = SglangBackend()


@pytest.fixture(scope="module")
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    return ModelHandle.from_dir(request.getfixturevalue("qwen_meta_dir"), "tiny-qwen3-vl")


def leg(handle: ModelHandle, **fields: Any) -> spb.GenerateRequest:
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )
    ctx = RequestContext("chat", "req-1", body.generation(), handle)
    build_prompt(ctx)
    BACKEND.build_request(ctx)
    wire: spb.GenerateRequest = ctx.wire
    return wire


def test_unset_fields_are_written_as_sglang_reads_them(handle: ModelHandle) -> None:
    wire = leg(handle)
    params = wire.sampling_params
    assert wire.request_id == "req-1"
    assert list(wire.tokenized.input_ids) and wire.tokenized.original_text
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.top_k == -1
    assert params.repetition_penalty == 1.0 and params.n == 1
    assert not params.HasField("max_new_tokens")
    assert params.WhichOneof("constraint") is None
    assert not wire.return_logprob and wire.logprob_start_len == -1
    assert not wire.HasField("disaggregated_params") and not wire.HasField("mm_inputs")


def test_client_values_are_carried(handle: ModelHandle) -> None:
    wire = leg(
        handle,
        temperature=0,
        top_p=0.5,
        top_k=7,
        max_completion_tokens=9,
        min_tokens=2,
        stop=["</s>", "zz"],
        stop_token_ids=[5],
        n=2,
        logprobs=True,
        top_logprobs=3,
        logit_bias={"11": 2.5},
        presence_penalty=0.25,
    )
    params = wire.sampling_params
    assert params.temperature == 0 and params.top_p == 0.5 and params.top_k == 7
    assert params.max_new_tokens == 9 and params.min_new_tokens == 2 and params.n == 2
    # Stop strings stay in the gateway: SGLang gets none, whatever the client asked.
    assert list(params.stop) == [] and list(params.stop_token_ids) == [5]
    assert dict(params.logit_bias) == {"11": 2.5}
    assert params.presence_penalty == 0.25
    assert wire.return_logprob and wire.top_logprobs_num == 3 and wire.logprob_start_len == -1


@pytest.mark.parametrize(
    ("fields", "kind", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_schema", ANY_OBJECT_SCHEMA),
        ({"structured_outputs": {"regex": "a+"}}, "regex", "a+"),
        ({"structured_outputs": {"grammar": 'root ::= "x"'}}, "ebnf_grammar", 'root ::= "x"'),
        ({"structured_outputs": {"choice": ["yes", 'n"o']}}, "ebnf_grammar", None),
    ],
)
def test_constraints_go_into_sglangs_oneof(
    handle: ModelHandle, fields: dict[str, Any], kind: str, value: str | None
) -> None:
    params = leg(handle, **fields).sampling_params
    assert params.WhichOneof("constraint") == kind
    if value is not None:
        assert getattr(params, kind) == value
    else:
        assert params.ebnf_grammar == 'root ::= "yes" | "n\\"o"'


def test_a_json_schema_is_sent_as_its_text(handle: ModelHandle) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    params = leg(handle, response_format=fmt).sampling_params
    assert json.loads(params.json_schema) == schema


def test_seed_is_refused_by_name(handle: ModelHandle) -> None:
    with pytest.raises(TandemError) as info:
        leg(handle, seed=3)
    assert info.value.status == 400 and info.value.code == "unsupported_parameter"
    assert info.value.param == "seed" and "sglang" in info.value.message


def test_fanout_splits_text_and_keeps_images_whole(handle: ModelHandle) -> None:
    wire = leg(handle, n=3)
    subs = BACKEND.fanout(wire, parallel=False)
    assert subs is not None
    assert [rid for rid, _ in subs] == ["req-1-0", "req-1-1", "req-1-2"]
    assert all(sub.sampling_params.n == 1 and sub.request_id == rid for rid, sub in subs)
    assert wire.sampling_params.n == 3  # the request itself is left as it was
    wire.mm_inputs.im_token_id = 1
    assert BACKEND.fanout(wire, parallel=True) is None
    assert BACKEND.fanout(leg(handle), parallel=True) is None
