"""The TokenSpeed request the gateway builds from a chat body (docs/worker-protocols.md):
every sampling scalar written as present (TokenSpeed's defaults where the client said
nothing, an explicit 0 kept), the seed as ``sampling_seed``, the constraint in the oneof,
images as one item each, and what the path cannot carry refused by name."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tandem.errors import TandemError
from tandem.gateway.backends.scheduler.constraints import ANY_OBJECT_SCHEMA
from tandem.gateway.backends.tokenspeed.backend import TokenSpeedBackend
from tandem.gateway.backends.tokenspeed.mm_items import attach_images
from tandem.gateway.context import RequestContext
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.multimodal.process import ProcessedImages
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.wire.tokenspeed import IMAGE, content_hash, decode_tensor, tpb

BACKEND = TokenSpeedBackend()
OPTIONAL_SCALARS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)


@pytest.fixture(scope="module")
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    return ModelHandle.from_dir(request.getfixturevalue("qwen_meta_dir"), "tiny-qwen3-vl")


def leg(handle: ModelHandle, **fields: Any) -> tpb.GenerateRequest:
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )
    ctx = RequestContext("chat", "req-1", body.generation(), handle)
    build_prompt(ctx)
    BACKEND.build_request(ctx)
    wire: tpb.GenerateRequest = ctx.wire
    return wire


def test_unset_fields_are_present_with_tokenspeeds_defaults(handle: ModelHandle) -> None:
    wire = leg(handle)
    params = wire.sampling_params
    assert all(params.HasField(name) for name in OPTIONAL_SCALARS)
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.top_k == -1
    assert params.min_p == 0 and params.repetition_penalty == 1.0 and params.n == 1
    assert not params.HasField("max_new_tokens") and not params.HasField("sampling_seed")
    assert params.skip_special_tokens and params.spaces_between_special_tokens
    assert wire.HasField("logprob_start_len") and wire.logprob_start_len == -1
    assert not wire.return_logprob and not wire.mm_inputs.items
    assert not wire.HasField("kv_bootstrap_info") and not wire.HasField("data_parallel_rank")
    assert list(wire.tokenized.input_ids) and wire.tokenized.original_text


def test_client_values_are_carried_and_an_explicit_zero_stays(handle: ModelHandle) -> None:
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
        seed=2**31 - 1,
        logprobs=True,
        top_logprobs=3,
        logit_bias={"11": 2.5},
        presence_penalty=0.25,
    )
    params = wire.sampling_params
    assert params.HasField("temperature") and params.temperature == 0
    assert params.top_p == 0.5 and params.top_k == 7 and params.n == 2
    assert params.max_new_tokens == 9 and params.min_new_tokens == 2
    assert params.sampling_seed == 2**31 - 1
    # Stop strings stay in the gateway, as for every protocol it speaks.
    assert list(params.stop) == [] and list(params.stop_token_ids) == [5]
    assert dict(params.logit_bias) == {"11": 2.5} and params.presence_penalty == 0.25
    assert wire.return_logprob and wire.top_logprobs_num == 3


def test_a_negative_seed_is_refused_by_name(handle: ModelHandle) -> None:
    with pytest.raises(TandemError) as info:
        leg(handle, seed=-1)
    assert info.value.status == 400 and info.value.param == "seed"
    assert info.value.code == "invalid_request"
    assert "unsigned" in info.value.message


@pytest.mark.parametrize(
    ("fields", "kind", "value"),
    [
        ({"response_format": {"type": "json_object"}}, "json_schema", ANY_OBJECT_SCHEMA),
        ({"structured_outputs": {"regex": "a+"}}, "regex", "a+"),
        ({"structured_outputs": {"grammar": 'root ::= "x"'}}, "ebnf_grammar", 'root ::= "x"'),
        (
            {"structured_outputs": {"choice": ["yes", "no"]}},
            "ebnf_grammar",
            'root ::= "yes" | "no"',
        ),
    ],
)
def test_constraints_go_into_the_oneof(
    handle: ModelHandle, fields: dict[str, Any], kind: str, value: str
) -> None:
    params = leg(handle, **fields).sampling_params
    assert params.WhichOneof("constraint") == kind and getattr(params, kind) == value


def test_a_json_schema_is_sent_as_its_text(handle: ModelHandle) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    assert json.loads(leg(handle, response_format=fmt).sampling_params.json_schema) == schema


def test_fanout_splits_text_with_seeds_in_turn_and_keeps_images_whole(
    handle: ModelHandle,
) -> None:
    wire = leg(handle, n=3, seed=5)
    subs = BACKEND.fanout(wire, parallel=True)
    assert subs is not None
    assert [rid for rid, _ in subs] == ["req-1-0", "req-1-1", "req-1-2"]
    assert [sub.sampling_params.sampling_seed for _, sub in subs] == [5, 6, 7]
    assert all(sub.sampling_params.n == 1 and sub.request_id == rid for rid, sub in subs)
    assert wire.sampling_params.n == 3  # the request itself is left as it was
    wire.mm_inputs.items.add(modality=IMAGE)
    assert BACKEND.fanout(wire, parallel=True) is None
    assert BACKEND.fanout(leg(handle), parallel=True) is None


def test_images_become_one_item_each_with_their_own_tensors(handle: ModelHandle) -> None:
    info = handle.info
    anchor = info.anchor_token_id
    ids = [1, anchor, 2, anchor, 3]
    grids = np.array([[1, 4, 4], [1, 2, 4]], dtype=np.int64)
    rows = [int(g.prod()) for g in grids]
    pixels = np.arange(sum(rows) * 3, dtype=np.float32).reshape(sum(rows), 3)
    hashes = ["a" * 64, "b" * 64]
    processed = ProcessedImages(
        pixel_values=pixels,
        grids={"image_grid_thw": grids},
        tokens_per_image=[r // 4 for r in rows],
        patches_per_image=np.array(rows, dtype=np.int64),
        hashes=hashes,
        encoded_bytes=[10, 10],
    )
    request = tpb.GenerateRequest(request_id="r")
    request.tokenized.input_ids.extend(ids)
    expanded, ranges, payload = attach_images(request, ids, processed, info)
    assert list(request.tokenized.input_ids) == expanded and payload.shape == pixels.shape
    items = request.mm_inputs.items
    assert len(items) == 2
    for k, item in enumerate(items):
        assert item.modality == IMAGE and item.content_hash == content_hash(hashes[k])
        assert [(p.offset, p.length) for p in item.placeholders] == [ranges[k]]
        assert item.placeholder_token_id == info.image_token_id
        assert not item.HasField("encoder_input")  # the pixels stay beside the message
        grid = decode_tensor(item.model_specific_tensors["image_grid_thw"])
        assert grid.tolist() == [grids[k].tolist()]
        assert decode_tensor(item.model_specific_tensors["patches_per_image"]).tolist() == [rows[k]]
