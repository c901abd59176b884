"""Decode-leg forms and the missing-KV guards (docs/pd-contract.md §7, §11)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tandem.errors import TandemError
from tandem.gateway.backends.vllm.connector import KvKind, KvMode, handoff
from tandem.gateway.backends.vllm.forms import (
    DecodeForm,
    build_decode_leg,
    decode_form,
    guard_identity_leg,
    guard_stripped_leg,
    is_stripped,
)
from tandem.wire.proto import GenerateRequest, Modality
from tandem.wire.requests import sampling_n
from tandem.wire.tensors import encode_tensor

PIXELS = np.ones((4, 6), dtype=np.float32)
GRID = np.array([[1, 2, 2]], dtype=np.int64)


def text_request(n: int | None = None) -> GenerateRequest:
    req = GenerateRequest(request_id="req-pd")
    req.tokenized.original_text = "hello"
    req.tokenized.input_ids.extend([1, 2, 3])
    if n is not None:
        req.sampling_params.n = n
    return req


def mm_request(n: int | None = None, *, grid: bool = False) -> GenerateRequest:
    """A router-path image request: expanded ids, pixels, one hash, optional M-RoPE grid."""
    req = text_request(n)
    del req.tokenized.input_ids[:]
    req.tokenized.input_ids.extend([1, 2, 151655, 151655, 3])
    batch = req.mm_inputs
    batch.pixel_values.CopyFrom(encode_tensor(PIXELS))
    batch.mm_hashes.append("img-hash")
    batch.mm_placeholders.add(offset=2, length=2)
    batch.im_token_id = 151655
    batch.modality = Modality.IMAGE
    batch.batched_keys.append("pixel_values")
    if grid:
        batch.model_specific_tensors["image_grid_thw"].CopyFrom(encode_tensor(GRID))
        batch.batched_keys.append("image_grid_thw")
    return req


def refs_request(n: int | None = None) -> GenerateRequest:
    req = text_request(n)
    req.media_refs.items.add(modality=Modality.IMAGE, url="data:image/png;base64,AAAA")
    return req


def form_for(req: GenerateRequest, lmo: bool) -> DecodeForm:
    return decode_form(req, decode_language_model_only=lmo, relay_kv_params=sampling_n(req) <= 1)


@pytest.mark.parametrize("n", [None, 0, 1])
def test_case9_vision_decode_is_identity_only_for_one_sample(n: int | None) -> None:
    assert form_for(mm_request(n, grid=True), lmo=False) is DecodeForm.IDENTITY_ONLY
    assert form_for(refs_request(n), lmo=False) is DecodeForm.IDENTITY_ONLY


def test_case9_vision_decode_is_full_for_n_samples() -> None:
    assert form_for(mm_request(2, grid=True), lmo=False) is DecodeForm.FULL
    assert form_for(refs_request(2), lmo=False) is DecodeForm.FULL
    assert form_for(text_request(2), lmo=False) is DecodeForm.FULL


def test_case10_lmo_decode_takes_text_plus_hashes() -> None:
    assert form_for(mm_request(1), lmo=True) is DecodeForm.TEXT_PLUS_HASHES
    assert form_for(text_request(1), lmo=True) is DecodeForm.TEXT_PLUS_HASHES
    assert form_for(text_request(2), lmo=True) is DecodeForm.TEXT_PLUS_HASHES


def _refusal(req: GenerateRequest) -> TandemError:
    with pytest.raises(TandemError) as info:
        form_for(req, lmo=True)
    err = info.value
    assert err.status == 400
    assert err.retryable is False
    assert "language-model-only" in err.message
    return err


def test_case11_lmo_refusals_in_order_grids_refs_n() -> None:
    assert _refusal(mm_request(1, grid=True)).code == "pd_decode_language_model_only_mrope"
    assert _refusal(refs_request(1)).code == "pd_decode_language_model_only_media_refs"
    assert _refusal(mm_request(2)).code == "pd_decode_language_model_only_n_samples"
    # Order: grids before refs before n.
    both = mm_request(2, grid=True)
    both.media_refs.items.add(modality=Modality.IMAGE, url="data:image/png;base64,AAAA")
    assert _refusal(both).code == "pd_decode_language_model_only_mrope"
    assert _refusal(refs_request(2)).code == "pd_decode_language_model_only_media_refs"


def test_case11_grid_counts_whatever_its_payload_and_batch() -> None:
    req = mm_request(1)
    video = req.extra_mm_inputs.add(mm_hashes=["vid-hash"], modality=Modality.VIDEO)
    video.model_specific_tensors["video_grid_thw"].dtype = "int64"  # no payload at all
    assert _refusal(req).code == "pd_decode_language_model_only_mrope"


def test_build_decode_leg_per_form_leaves_the_original_alone() -> None:
    req = mm_request(1, grid=True)
    before = req.SerializeToString()

    full = build_decode_leg(req, DecodeForm.FULL)
    assert full == req and full is not req
    full.mm_inputs.ClearField("pixel_values")
    assert req.mm_inputs.HasField("pixel_values")

    identity = build_decode_leg(req, DecodeForm.IDENTITY_ONLY)
    assert not identity.mm_inputs.HasField("pixel_values")
    assert set(identity.mm_inputs.model_specific_tensors) == {"image_grid_thw"}
    assert list(identity.mm_inputs.mm_hashes) == ["img-hash"]
    assert len(identity.mm_inputs.mm_placeholders) == 1

    stripped = build_decode_leg(refs_request(1), DecodeForm.TEXT_PLUS_HASHES)
    assert not stripped.HasField("media_refs")
    text_plus = build_decode_leg(req, DecodeForm.TEXT_PLUS_HASHES)
    assert text_plus.mm_inputs.mm_hashes == ["img-hash"]
    assert text_plus.mm_inputs.modality == Modality.IMAGE
    assert not text_plus.mm_inputs.mm_placeholders
    assert not text_plus.mm_inputs.model_specific_tensors
    assert list(text_plus.tokenized.input_ids) == [1, 2, 151655, 151655, 3]
    assert req.SerializeToString() == before


def test_is_stripped_only_for_text_plus_hashes_of_an_image_request() -> None:
    assert is_stripped(mm_request(1), DecodeForm.TEXT_PLUS_HASHES)
    assert not is_stripped(text_request(1), DecodeForm.TEXT_PLUS_HASHES)
    assert not is_stripped(mm_request(1), DecodeForm.IDENTITY_ONLY)
    assert not is_stripped(mm_request(2), DecodeForm.FULL)


NIXL = KvMode(KvKind.NIXL, "127.0.0.1", 50051)


def _lmo_leg_after_nixl_returned_nothing(req: GenerateRequest) -> tuple[GenerateRequest, bool]:
    form = form_for(req, lmo=True)
    leg = build_decode_leg(req, form)
    assert handoff(NIXL, True, None, None, leg) is False
    return leg, is_stripped(req, form)


def test_case12_stripped_image_leg_without_kv_is_a_502(caplog: pytest.LogCaptureFixture) -> None:
    leg, stripped = _lmo_leg_after_nixl_returned_nothing(mm_request(1))
    with caplog.at_level(logging.ERROR), pytest.raises(TandemError) as info:
        guard_stripped_leg(leg, stripped, "req-pd")
    err = info.value
    assert (err.code, err.status, err.retryable) == (
        "pd_decode_missing_kv_transfer_params",
        502,
        False,
    )
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "stripped multimodal decode leg has no kv_transfer_params to pull from" in (
        errors[0].getMessage()
    )
    assert "req-pd" in errors[0].getMessage()


def test_case12_text_request_on_lmo_decode_keeps_local_recompute() -> None:
    leg, stripped = _lmo_leg_after_nixl_returned_nothing(text_request(1))
    guard_stripped_leg(leg, stripped, "req-pd")  # no error: decode recomputes the prompt


def test_case12_stripped_leg_with_either_kv_form_passes() -> None:
    leg = build_decode_leg(mm_request(1), DecodeForm.TEXT_PLUS_HASHES)
    leg.kv_transfer_params_json = '{"do_remote_prefill":true}'
    guard_stripped_leg(leg, True, "req-pd")
    legacy = build_decode_leg(mm_request(1), DecodeForm.TEXT_PLUS_HASHES)
    legacy.kv_transfer_params.remote_host = "127.0.0.1"
    legacy.kv_transfer_params.remote_port = 8998
    guard_stripped_leg(legacy, True, "req-pd")


def test_identity_leg_without_kv_is_refused_not_answered_blind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    req = mm_request(1)  # grid-less: smg would recompute it as text (docs/pd-contract.md §18)
    leg = build_decode_leg(req, DecodeForm.IDENTITY_ONLY)
    assert handoff(NIXL, True, None, None, leg) is False
    with caplog.at_level(logging.ERROR), pytest.raises(TandemError) as info:
        guard_identity_leg(leg, DecodeForm.IDENTITY_ONLY, "req-pd")
    assert (info.value.code, info.value.status, info.value.retryable) == (
        "pd_decode_missing_kv_transfer_params",
        502,
        False,
    )
    assert any("req-pd" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


def test_identity_leg_guard_sees_hash_less_batches_through_the_original() -> None:
    req = text_request(1)
    req.mm_inputs.pixel_values.CopyFrom(encode_tensor(PIXELS))  # no hashes: the clone drops it
    leg = build_decode_leg(req, DecodeForm.IDENTITY_ONLY)
    guard_identity_leg(leg, DecodeForm.IDENTITY_ONLY, "req-pd")  # the leg alone looks like text
    with pytest.raises(TandemError, match="no kv_transfer_params"):
        guard_identity_leg(leg, DecodeForm.IDENTITY_ONLY, "req-pd", original_has_mm=True)


def test_identity_leg_guard_lets_through_what_decode_can_serve() -> None:
    with_kv = build_decode_leg(mm_request(1), DecodeForm.IDENTITY_ONLY)
    with_kv.kv_transfer_params_json = '{"do_remote_prefill":true}'
    guard_identity_leg(with_kv, DecodeForm.IDENTITY_ONLY, "r", original_has_mm=True)
    # Worker path: the leg keeps its refs, so decode processes the media itself.
    refs_leg = build_decode_leg(refs_request(1), DecodeForm.IDENTITY_ONLY)
    guard_identity_leg(refs_leg, DecodeForm.IDENTITY_ONLY, "r")
    text_leg = build_decode_leg(text_request(1), DecodeForm.IDENTITY_ONLY)
    guard_identity_leg(text_leg, DecodeForm.IDENTITY_ONLY, "r")
    full = build_decode_leg(mm_request(2), DecodeForm.FULL)
    guard_identity_leg(full, DecodeForm.FULL, "r", original_has_mm=True)
