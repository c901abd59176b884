"""The gateway's content keys: a request's prompt keys the same blocks a worker announces,
and two different images of the same size never share a key (the red/blue probe)."""

from __future__ import annotations

import pytest
from kv_event_source import BLOCK, WorkerCache, image_prompt

from tandem.engine.types import MediaItem
from tandem.gateway.kv_events.index import KvEventIndex
from tandem.gateway.kv_events.keys import block_key, request_keys, root_key

RED, BLUE = "a1" * 16, "b2" * 16  # two images' mm hashes
PAD = 151655  # one placeholder id for every image, as a VL model has


def _indexed(prompt: list[int], media: list[MediaItem], salt: str | None = None) -> KvEventIndex:
    worker = WorkerCache()
    worker.prefill(prompt, media, salt)
    index = KvEventIndex()
    for batch in worker.new_batches():
        index.apply("w", batch.events)
    return index


def test_request_keys_match_what_a_worker_announces() -> None:
    # Text, an image run that straddles block edges, more text: 6 full blocks + a partial.
    prompt = image_prompt([1, 2, 3], PAD, 10, [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17])
    media = [MediaItem(RED, 3, 10)]
    index = _indexed(prompt, media)
    keys = request_keys(prompt, [(3, 10, RED)], BLOCK)
    assert len(keys) == len(prompt) // BLOCK == 6
    assert index.blocks("w") == 6
    assert index.leading_blocks(keys, ["w"]) == {"w": 6}


def test_red_and_blue_images_of_one_size_share_no_block() -> None:
    # Same text, same placeholder ids, same run: only the image differs.
    prompt = image_prompt([1, 2, 3, 4], PAD, 8, [5, 6, 7, 8])
    red = request_keys(prompt, [(4, 8, RED)], BLOCK)
    blue = request_keys(prompt, [(4, 8, BLUE)], BLOCK)
    assert red[0] == blue[0]  # the text block before the image is shared
    assert not set(red[1:]) & set(blue[1:])
    # Through the index: a worker that cached the red image holds nothing of the blue one
    # past the leading text.
    index = _indexed(prompt, [MediaItem(RED, 4, 8)])
    assert index.leading_blocks(red, ["w"]) == {"w": 4}
    assert index.leading_blocks(blue, ["w"]) == {"w": 1}


def test_two_images_in_one_prompt_swapped_do_not_match() -> None:
    prompt = image_prompt([1, 2, 3, 4], PAD, 8, [PAD] * 8 + [9, 9, 9, 9])
    runs_rb = [(4, 8, RED), (12, 8, BLUE)]
    runs_br = [(4, 8, BLUE), (12, 8, RED)]
    index = _indexed(prompt, [MediaItem(RED, 4, 8), MediaItem(BLUE, 12, 8)])
    assert index.leading_blocks(request_keys(prompt, runs_rb, BLOCK), ["w"]) == {"w": 6}
    assert index.leading_blocks(request_keys(prompt, runs_br, BLOCK), ["w"]) == {"w": 1}


def test_salt_lora_and_block_size_are_namespaces() -> None:
    ids = [1, 2, 3, 4]
    parent = root_key(BLOCK)
    plain = block_key(parent, None, None, ids, [])
    assert block_key(parent, "", None, ids, []) != plain  # "" is not "no salt"
    assert block_key(parent, "s", None, ids, []) != plain
    assert block_key(parent, None, "lora-a", ids, []) != plain
    assert block_key(root_key(8), None, None, ids, []) != plain
    # A salted prefill (a pixel-less leg's "mm:<hashes>") is found only under that salt.
    index = _indexed([1, 2, 3, 4, 5, 6, 7, 8], [], salt="mm:" + RED)
    unsalted = request_keys([1, 2, 3, 4, 5, 6, 7, 8], (), BLOCK)
    salted = request_keys([1, 2, 3, 4, 5, 6, 7, 8], (), BLOCK, cache_salt="mm:" + RED)
    assert index.leading_blocks(unsalted, ["w"]) == {"w": 0}
    assert index.leading_blocks(salted, ["w"]) == {"w": 2}


def test_partial_trailing_block_gets_no_key_and_bad_block_size_is_refused() -> None:
    assert len(request_keys(list(range(7)), (), 4)) == 1
    assert request_keys([1, 2, 3], (), 4) == []
    with pytest.raises(ValueError, match="block_size"):
        request_keys([1, 2], (), 0)
