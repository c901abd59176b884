"""The media-identity relay to the decode leg (docs/pd-contract.md §10)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tandem.gateway.backends.vllm.forms import DecodeForm, build_decode_leg
from tandem.gateway.backends.vllm.identity_relay import apply_prefill_media_identity
from tandem.wire.proto import GenerateRequest, MediaIdentity, Modality
from tandem.wire.tensors import decode_tensor, encode_tensor

RID = "req-ident-7"
GRID = np.array([[1, 2, 2], [1, 4, 6]], dtype=np.int64)


def worker_path_request() -> GenerateRequest:
    """Prompt "describe <|image|>" with one unexpanded anchor per item and two refs."""
    req = GenerateRequest(request_id=RID)
    req.tokenized.original_text = "describe <|image|>"
    req.tokenized.input_ids.extend([7, 8, 9])
    for _ in range(2):
        req.media_refs.items.add(modality=Modality.IMAGE, url="data:image/png;base64,AAAA")
    req.kv_transfer_params_json = '{"do_remote_prefill":true}'
    return req


def decode_leg() -> GenerateRequest:
    return build_decode_leg(worker_path_request(), DecodeForm.IDENTITY_ONLY)


def identity() -> MediaIdentity:
    ident = MediaIdentity()
    ident.prompt_token_ids.extend([7, 8, 100, 100, 100, 9])
    batch = ident.mm_inputs
    batch.mm_hashes.extend(["h1", "h2"])
    batch.mm_placeholders.add(offset=2, length=2)
    batch.mm_placeholders.add(offset=4, length=1)
    batch.modality = Modality.IMAGE
    batch.model_specific_tensors["image_grid_thw"].CopyFrom(encode_tensor(GRID))
    batch.batched_keys.append("image_grid_thw")
    return ident


def relay(
    leg: GenerateRequest,
    ident: MediaIdentity | None,
    *,
    handed_off: bool = True,
    relay: bool = True,
    solicited: bool = True,
) -> bool:
    return apply_prefill_media_identity(
        leg, ident, handed_off=handed_off, relay=relay, solicited=solicited, request_id=RID
    )


def assert_refs_kept(leg: GenerateRequest) -> None:
    assert len(leg.media_refs.items) == 2
    assert not leg.HasField("mm_inputs")
    assert list(leg.tokenized.input_ids) == [7, 8, 9]


def test_case22_not_applied_for_n_samples() -> None:
    leg = decode_leg()
    assert relay(leg, identity(), handed_off=False, relay=False) is False
    assert_refs_kept(leg)


def test_case23_legacy_mooncake_n_samples_keeps_refs() -> None:
    # Legacy Mooncake hands off host/port even for n > 1; the relay gate must still hold.
    leg = decode_leg()
    assert relay(leg, identity(), handed_off=True, relay=False) is False
    assert_refs_kept(leg)


def test_case24_no_handoff_keeps_refs(caplog: pytest.LogCaptureFixture) -> None:
    leg = decode_leg()
    with caplog.at_level(logging.WARNING):
        assert relay(leg, identity(), handed_off=False) is False
    assert_refs_kept(leg)
    assert not caplog.records


def test_case25_identity_applied() -> None:
    original = worker_path_request()
    before = original.SerializeToString()
    leg = build_decode_leg(original, DecodeForm.IDENTITY_ONLY)
    assert relay(leg, identity()) is True
    assert not leg.HasField("media_refs")
    assert list(leg.tokenized.input_ids) == [7, 8, 100, 100, 100, 9]
    assert leg.tokenized.original_text == "describe <|image|>"
    batch = leg.mm_inputs
    assert not batch.HasField("pixel_values")
    assert list(batch.mm_hashes) == ["h1", "h2"]
    assert [(p.offset, p.length) for p in batch.mm_placeholders] == [(2, 2), (4, 1)]
    assert decode_tensor(batch.model_specific_tensors["image_grid_thw"]).tolist() == GRID.tolist()
    assert leg.kv_transfer_params_json == '{"do_remote_prefill":true}'
    assert original.SerializeToString() == before  # the prefill leg keeps its refs


def test_router_path_leg_has_nothing_to_replace() -> None:
    leg = GenerateRequest(request_id=RID)
    leg.tokenized.input_ids.extend([1, 2])
    leg.mm_inputs.mm_hashes.append("h")
    before = leg.SerializeToString()
    assert relay(leg, identity()) is False
    assert leg.SerializeToString() == before


@pytest.mark.parametrize("kind", ["empty_ids", "text_leg"])
def test_case26_unusable_identity_leaves_leg_unchanged(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    leg, ident = decode_leg(), identity()
    if kind == "empty_ids":
        del ident.prompt_token_ids[:]
    else:
        leg.text = "describe <|image|>"  # the oneof: the leg is no longer tokenized
    before = leg.SerializeToString()
    with caplog.at_level(logging.WARNING):
        assert relay(leg, ident) is False
    assert leg.SerializeToString() == before
    assert leg.WhichOneof("input") == ("tokenized" if kind == "empty_ids" else "text")
    assert len(leg.media_refs.items) == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "media identity is unusable" in warnings[0]


def test_case27_missing_identity_warns_once_only_when_solicited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leg = decode_leg()
    with caplog.at_level(logging.DEBUG):
        assert relay(leg, None, solicited=True) is False
    assert_refs_kept(leg)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert RID in message
    assert "prefill worker returned no media identity; decode leg will reprocess media" in message

    caplog.clear()
    quiet = decode_leg()
    with caplog.at_level(logging.DEBUG):
        assert relay(quiet, None, solicited=False) is False
    assert_refs_kept(quiet)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
