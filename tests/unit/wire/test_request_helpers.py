"""Request helpers on GenerateRequest (docs/pd-contract.md §7, §10)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tandem.wire.kv_params import (
    complete_kv_params_json,
    parse_kv_transfer_params,
    request_kv_params,
)
from tandem.wire.proto import GenerateComplete, GenerateRequest, MediaIdentity, Modality
from tandem.wire.requests import (
    apply_media_identity,
    clone_without_mm,
    clone_without_mm_pixels,
    has_kv_transfer_params,
    has_media_refs,
    has_mm_inputs,
    has_mrope_grids,
    prefill_leg_of,
    sampling_n,
    sanitize_sampling_for_prefill,
)
from tandem.wire.tensors import decode_tensor, encode_tensor

PIXELS = np.ones((4, 8), dtype=np.float32)


def router_path_request() -> GenerateRequest:
    """Test case 1's request: pixels, inline and payload-less grids, a flat grid."""
    req = GenerateRequest(request_id="req-1")
    req.tokenized.input_ids.extend([1, 2, 3, 151655, 151655, 151655, 151655, 4])
    batch = req.mm_inputs
    batch.pixel_values.CopyFrom(encode_tensor(PIXELS))
    tensors = batch.model_specific_tensors
    tensors["image_grid_thw"].CopyFrom(encode_tensor(np.array([[1, 2, 2]], dtype=np.int64)))
    tensors["video_grid_thw"].shape.extend([1, 3])  # no payload at all
    tensors["video_grid_thw"].dtype = "int64"
    tensors["aspect_ratios"].CopyFrom(encode_tensor(np.array([1.0], dtype=np.float32)))
    tensors["second_per_grid_ts"].CopyFrom(encode_tensor(np.array([0.5], dtype=np.float32)))
    tensors["ts_sizes"].CopyFrom(encode_tensor(np.array([1], dtype=np.int64)))
    tensors["video_second_per_grid"].CopyFrom(encode_tensor(np.array([0.5], dtype=np.float32)))
    batch.flat_keys["second_per_grid_ts"] = "ts_sizes"
    batch.im_token_id = 151655
    batch.mm_placeholders.add(offset=3, length=4)
    batch.mm_hashes.append("h1")
    batch.batched_keys.extend(["pixel_values", "image_grid_thw", "aspect_ratios"])
    batch.keep_on_cpu_keys.append("image_grid_thw")
    batch.modality = Modality.IMAGE
    req.sampling_params.max_tokens = 16
    req.kv_transfer_params_json = '{"do_remote_prefill":true}'
    return req


def test_case1_clone_keeps_identity_and_inline_grids_only() -> None:
    req = router_path_request()
    clone = clone_without_mm_pixels(req)
    # The original is untouched.
    assert req.mm_inputs.HasField("pixel_values")
    assert len(req.mm_inputs.model_specific_tensors) == 6
    # The clone has no pixels and exactly the inline grids (+ the flat grid's sizes).
    mm = clone.mm_inputs
    assert not mm.HasField("pixel_values")
    assert set(mm.model_specific_tensors) == {
        "image_grid_thw",
        "second_per_grid_ts",
        "ts_sizes",
        "video_second_per_grid",
    }
    assert list(mm.batched_keys) == ["image_grid_thw"]
    assert list(mm.keep_on_cpu_keys) == ["image_grid_thw"]
    assert dict(mm.flat_keys) == {"second_per_grid_ts": "ts_sizes"}
    assert list(mm.mm_hashes) == ["h1"]
    assert [(p.offset, p.length) for p in mm.mm_placeholders] == [(3, 4)]
    assert mm.im_token_id == 151655 and mm.modality == Modality.IMAGE
    # Everything else is copied.
    assert clone.request_id == "req-1"
    assert list(clone.tokenized.input_ids) == list(req.tokenized.input_ids)
    assert clone.sampling_params.max_tokens == 16
    assert clone.kv_transfer_params_json == req.kv_transfer_params_json
    assert decode_tensor(mm.model_specific_tensors["image_grid_thw"]).tolist() == [[1, 2, 2]]


def test_case5_flat_grid_with_non_inline_sizes_is_dropped(caplog) -> None:
    req = router_path_request()
    sizes = req.mm_inputs.model_specific_tensors["ts_sizes"]
    sizes.ClearField("inline")
    sizes.shm.name = "segment"
    with caplog.at_level(logging.WARNING, logger="tandem.wire"):
        clone = clone_without_mm_pixels(req)
    assert "second_per_grid_ts" not in clone.mm_inputs.model_specific_tensors
    assert "ts_sizes" not in clone.mm_inputs.model_specific_tensors
    assert "sizes tensor is not inline" in caplog.text


def test_case2_hashless_batch_is_dropped_whole() -> None:
    req = GenerateRequest(request_id="r2")
    req.mm_inputs.pixel_values.CopyFrom(encode_tensor(PIXELS))
    clone = clone_without_mm_pixels(req)
    assert not clone.HasField("mm_inputs")
    assert req.HasField("mm_inputs")
    assert clone.request_id == "r2"


def with_video_and_refs() -> GenerateRequest:
    req = GenerateRequest(request_id="r6")
    req.tokenized.original_text = "describe"
    req.tokenized.input_ids.extend([1, 2, 151655, 151655, 3])
    req.mm_inputs.pixel_values.CopyFrom(encode_tensor(PIXELS))
    req.mm_inputs.model_specific_tensors["image_grid_thw"].CopyFrom(
        encode_tensor(np.array([[1, 2, 2]], dtype=np.int64))
    )
    req.mm_inputs.im_token_id = 151655
    req.mm_inputs.mm_placeholders.add(offset=2, length=2)
    req.mm_inputs.mm_hashes.append("img-hash")
    req.mm_inputs.modality = Modality.IMAGE
    video = req.extra_mm_inputs.add()
    video.mm_hashes.append("vid-hash")
    video.modality = Modality.VIDEO
    video.pixel_values.CopyFrom(encode_tensor(PIXELS))
    req.kv_transfer_params_json = '{"do_remote_prefill":true}'
    req.media_refs.items.add(modality=Modality.IMAGE, url="data:image/png;base64,AAAA")
    return req


def test_case6_clone_without_mm_keeps_only_hashes_and_modality() -> None:
    req = with_video_and_refs()
    before = req.SerializeToString()
    clone = clone_without_mm(req)
    assert req.SerializeToString() == before
    assert list(clone.tokenized.input_ids) == [1, 2, 151655, 151655, 3]
    assert clone.tokenized.original_text == "describe"
    assert clone.kv_transfer_params_json == '{"do_remote_prefill":true}'
    assert not clone.HasField("media_refs")
    image = clone.mm_inputs
    assert list(image.mm_hashes) == ["img-hash"] and image.modality == Modality.IMAGE
    assert not image.mm_placeholders and not image.model_specific_tensors
    assert not image.HasField("im_token_id") and not image.HasField("pixel_values")
    assert not image.batched_keys and not image.keep_on_cpu_keys
    assert len(clone.extra_mm_inputs) == 1
    video = clone.extra_mm_inputs[0]
    assert list(video.mm_hashes) == ["vid-hash"] and video.modality == Modality.VIDEO
    assert not video.HasField("pixel_values")


def test_case7_clone_without_mm_drops_hashless_batch() -> None:
    req = GenerateRequest(request_id="r7")
    req.mm_inputs.pixel_values.CopyFrom(encode_tensor(PIXELS))
    assert not clone_without_mm(req).HasField("mm_inputs")


def test_clone_without_pixels_keeps_media_refs() -> None:
    req = with_video_and_refs()
    clone = clone_without_mm_pixels(req)
    assert clone.HasField("media_refs")
    assert not clone.mm_inputs.HasField("pixel_values")
    assert not clone.extra_mm_inputs[0].HasField("pixel_values")


def test_case8_mrope_grid_detection() -> None:
    hashes_only = GenerateRequest()
    hashes_only.mm_inputs.mm_hashes.append("h")
    assert not has_mrope_grids(hashes_only)
    extra_video = GenerateRequest()
    extra_video.mm_inputs.mm_hashes.append("h")
    extra_video.extra_mm_inputs.add().model_specific_tensors["video_grid_thw"].dtype = "int64"
    assert has_mrope_grids(extra_video)
    assert not has_mrope_grids(GenerateRequest())


def test_predicates() -> None:
    text = GenerateRequest()
    assert not has_mm_inputs(text) and not has_media_refs(text)
    extra_only = GenerateRequest()
    extra_only.extra_mm_inputs.add()
    assert has_mm_inputs(extra_only)
    assert has_media_refs(with_video_and_refs())


def test_case13_has_kv_transfer_params() -> None:
    assert not has_kv_transfer_params(GenerateRequest())
    assert has_kv_transfer_params(GenerateRequest(kv_transfer_params_json='{"a":1}'))
    typed = GenerateRequest()
    typed.kv_transfer_params.remote_host = "127.0.0.1"
    typed.kv_transfer_params.remote_port = 8998
    assert has_kv_transfer_params(typed)


def test_case14_sanitize_sampling_for_prefill() -> None:
    req = GenerateRequest()
    params = req.sampling_params
    params.max_tokens, params.min_tokens, params.n = 128, 16, 4
    params.stop.append("</s>")
    params.stop_token_ids.append(2)
    sanitize_sampling_for_prefill(req)
    assert (params.max_tokens, params.min_tokens, params.n) == (1, 0, 1)
    assert not params.stop and not params.stop_token_ids and params.ignore_eos


@pytest.mark.parametrize("field", ["json_schema", "regex", "grammar", "json_object", "choice"])
def test_prefill_leg_carries_no_constraint_nor_logprobs(field: str) -> None:
    # docs/pd-contract.md §20: the prefill leg's token is thrown away; the decode leg keeps both.
    req = GenerateRequest(request_id="r")
    params = req.sampling_params
    if field == "choice":
        params.choice.choices.extend(["a", "b"])
    elif field == "json_object":
        params.json_object = True
    else:
        setattr(params, field, "x")
    params.logprobs, params.prompt_logprobs = 3, 1
    leg = prefill_leg_of(req)
    assert leg.sampling_params.WhichOneof("constraint") is None
    assert not leg.sampling_params.HasField("logprobs")
    assert not leg.sampling_params.HasField("prompt_logprobs")
    # The client's request (and so the decode leg built from it) keeps them.
    assert params.WhichOneof("constraint") == field and params.logprobs == 3


def test_case15_sampling_n() -> None:
    assert sampling_n(GenerateRequest()) == 1
    req = GenerateRequest()
    req.sampling_params.n = 4
    assert sampling_n(req) == 4


def test_case19_complete_kv_params_accessor() -> None:
    assert complete_kv_params_json(GenerateComplete(kv_transfer_params_json="{}")) == "{}"
    assert complete_kv_params_json(GenerateComplete(kv_transfer_params_json="")) is None
    assert complete_kv_params_json(GenerateComplete()) is None


def test_kv_params_must_be_a_json_object() -> None:
    assert parse_kv_transfer_params('{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_kv_transfer_params("{nope")
    with pytest.raises(ValueError, match="JSON object"):
        parse_kv_transfer_params("[1]")
    legacy = GenerateRequest()
    legacy.kv_transfer_params.remote_host = "127.0.0.1"
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        request_kv_params(legacy)


def identity_for_case25() -> MediaIdentity:
    identity = MediaIdentity(prompt_token_ids=[7, 8, 100, 100, 100, 9])
    identity.mm_inputs.mm_hashes.extend(["h1", "h2"])
    identity.mm_inputs.mm_placeholders.add(offset=2, length=2)
    identity.mm_inputs.mm_placeholders.add(offset=4, length=1)
    identity.mm_inputs.model_specific_tensors["image_grid_thw"].CopyFrom(
        encode_tensor(np.array([[1, 2, 2], [1, 2, 2]], dtype=np.int64))
    )
    return identity


def refs_leg() -> GenerateRequest:
    req = GenerateRequest(request_id="r25")
    req.tokenized.original_text = "describe <|image|>"
    req.tokenized.input_ids.extend([7, 8, 9])
    req.media_refs.items.add(modality=Modality.IMAGE, url="data:image/png;base64,AAAA")
    return req


def test_case25_identity_applied() -> None:
    leg = refs_leg()
    assert apply_media_identity(leg, identity_for_case25())
    assert not leg.HasField("media_refs")
    assert list(leg.tokenized.input_ids) == [7, 8, 100, 100, 100, 9]
    assert leg.tokenized.original_text == "describe <|image|>"
    assert list(leg.mm_inputs.mm_hashes) == ["h1", "h2"]
    assert len(leg.mm_inputs.mm_placeholders) == 2
    assert "image_grid_thw" in leg.mm_inputs.model_specific_tensors
    assert not leg.mm_inputs.HasField("pixel_values")


def test_case26_unusable_identity_leaves_leg_unchanged(caplog) -> None:
    empty = identity_for_case25()
    del empty.prompt_token_ids[:]
    leg = refs_leg()
    before = leg.SerializeToString()
    with caplog.at_level(logging.WARNING, logger="tandem.wire"):
        assert not apply_media_identity(leg, empty)
    assert leg.SerializeToString() == before
    text_leg = GenerateRequest(request_id="r26", text="describe")
    text_leg.media_refs.items.add(modality=Modality.IMAGE, url="data:,x")
    assert not apply_media_identity(text_leg, identity_for_case25())
    assert text_leg.WhichOneof("input") == "text" and text_leg.HasField("media_refs")
    assert caplog.text.count("unusable") == 2 and "r26" in caplog.text
