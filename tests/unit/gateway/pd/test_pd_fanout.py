"""Fan-out of n > 1 text requests under parallel dispatch (docs/pd-contract.md §13)."""

from __future__ import annotations

import pytest

from tandem.gateway.backends.vllm.connector import mint_transfer_id
from tandem.gateway.backends.vllm.fanout import fanout_requests, fanout_width
from tandem.wire.proto import GenerateRequest, Modality


def text_request(n: int | None = None, seed: int | None = None) -> GenerateRequest:
    req = GenerateRequest(request_id="req")
    req.tokenized.input_ids.extend([1, 2, 3])
    req.sampling_params.max_tokens = 16
    if n is not None:
        req.sampling_params.n = n
    if seed is not None:
        req.sampling_params.seed = seed
    return req


def test_case20_media_refs_never_fan_out() -> None:
    req = text_request(3)
    req.media_refs.items.add(modality=Modality.IMAGE, url="data:image/png;base64,AAAA")
    assert fanout_width(req, parallel=True) is None


def test_case20_text_width_follows_n_under_parallel_dispatch() -> None:
    assert fanout_width(text_request(3), parallel=True) == 3
    assert fanout_width(text_request(1), parallel=True) is None
    assert fanout_width(text_request(0), parallel=True) is None
    assert fanout_width(text_request(), parallel=True) is None


def test_case20_mm_batches_never_fan_out() -> None:
    primary = text_request(3)
    primary.mm_inputs.mm_hashes.append("h1")
    assert fanout_width(primary, parallel=True) is None
    extra_only = text_request(3)
    extra_only.extra_mm_inputs.add(mm_hashes=["v1"], modality=Modality.VIDEO)
    assert fanout_width(extra_only, parallel=True) is None


def test_case20_sequential_dispatch_never_fans_out() -> None:
    assert fanout_width(text_request(3), parallel=False) is None


def test_case21_sub_requests() -> None:
    req = text_request(3, seed=7)
    before = req.SerializeToString()
    subs = fanout_requests(req, 3)
    assert [s.request_id for s in subs] == ["req-0", "req-1", "req-2"]
    assert [s.sampling_params.n for s in subs] == [1, 1, 1]
    assert [s.sampling_params.seed for s in subs] == [7, 8, 9]
    assert all(list(s.tokenized.input_ids) == [1, 2, 3] for s in subs)
    assert all(s.sampling_params.max_tokens == 16 for s in subs)
    assert req.SerializeToString() == before  # the original keeps n=3
    subs[0].tokenized.input_ids.append(4)  # copies, not shared messages
    assert list(subs[1].tokenized.input_ids) == [1, 2, 3]
    assert list(req.tokenized.input_ids) == [1, 2, 3]
    # Each pair gets its own transfer id from the caller.
    assert len({mint_transfer_id() for _ in subs}) == 3


def test_case21_unset_seed_stays_unset() -> None:
    subs = fanout_requests(text_request(2), 2)
    assert not any(s.sampling_params.HasField("seed") for s in subs)


def test_case21_seed_wraps_within_int32() -> None:
    seeds = [s.sampling_params.seed for s in fanout_requests(text_request(3, 2**31 - 1), 3)]
    assert seeds == [2**31 - 1, -(2**31), -(2**31) + 1]
    zero_based = [s.sampling_params.seed for s in fanout_requests(text_request(2, -1), 2)]
    assert zero_based == [-1, 0]


def test_fanout_refuses_what_it_must_never_copy() -> None:
    mm = text_request(2)
    mm.mm_inputs.mm_hashes.append("h1")
    with pytest.raises(ValueError):
        fanout_requests(mm, 2)
    with pytest.raises(ValueError):
        fanout_requests(text_request(2), 0)
