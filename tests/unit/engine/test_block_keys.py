"""Block keys: chaining, media identity, salt, determinism across processes."""

from __future__ import annotations

import pytest

from tandem.engine.block_keys import DEFAULT_BLOCK_SIZE, block_keys, hash_salt
from tandem.engine.types import MediaItem

BS = 4
PAD = 99  # the image placeholder id: identical for every same-size image
GOLDEN = "27f97eaa5dfcdddc1c362f44c4a4ec1815ecf781710e128f253f069b8ebdaa38"


def prompt_with_image() -> list[int]:
    # 6 text tokens, 8 placeholders at [6, 14), 5 text tokens: 19 tokens -> 4 full blocks.
    return [1, 2, 3, 4, 5, 6] + [PAD] * 8 + [7, 8, 9, 10, 11]


def test_one_key_per_full_block_and_no_key_for_partial_tail() -> None:
    assert len(block_keys(list(range(19)), [], None, BS)) == 4
    assert len(block_keys(list(range(20)), [], None, BS)) == 5
    assert block_keys([1, 2, 3], [], None, BS) == []
    assert len(block_keys(list(range(40)), [], None)) == 40 // DEFAULT_BLOCK_SIZE


def test_keys_are_fixed_size_bytes_and_distinct() -> None:
    keys = block_keys([5] * 16, [], None, BS)  # identical blocks: chaining separates them
    assert all(isinstance(k, bytes) and len(k) == 32 for k in keys)
    assert len(set(keys)) == 4


def test_different_image_same_tokens_diverges_from_first_image_block() -> None:
    ids = prompt_with_image()
    a = block_keys(ids, [MediaItem("img-a", 6, 8)], None, BS)
    b = block_keys(ids, [MediaItem("img-b", 6, 8)], None, BS)
    assert a[0] == b[0]  # block [0, 4) is text only
    # Block [4, 8) holds the first placeholders; every later key chains on it.
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True))


def test_same_image_gives_same_keys() -> None:
    ids = prompt_with_image()
    assert block_keys(ids, [MediaItem("img-a", 6, 8)], None, BS) == block_keys(
        ids, [MediaItem("img-a", 6, 8)], None, BS
    )


def test_media_is_part_of_the_key_not_just_the_tokens() -> None:
    ids = prompt_with_image()
    assert block_keys(ids, [], None, BS) != block_keys(ids, [MediaItem("h", 6, 8)], None, BS)


def test_position_of_the_image_matters() -> None:
    ids = [PAD] * 16
    a = block_keys(ids, [MediaItem("h", 0, 8), MediaItem("g", 8, 8)], None, BS)
    b = block_keys(ids, [MediaItem("g", 0, 8), MediaItem("h", 8, 8)], None, BS)
    assert a[0] != b[0]
    # Which item comes first in the list must not matter, only where it sits.
    c = block_keys(ids, [MediaItem("g", 8, 8), MediaItem("h", 0, 8)], None, BS)
    assert a == c


def test_salt_changes_every_key() -> None:
    ids = list(range(12))
    plain = block_keys(ids, [], None, BS)
    salted = block_keys(ids, [], "mm:h1", BS)
    other = block_keys(ids, [], "mm:h2", BS)
    assert all(len({x, y, z}) == 3 for x, y, z in zip(plain, salted, other, strict=True))


def test_empty_salt_is_distinct_from_no_salt() -> None:
    assert block_keys([1] * 4, [], "", BS) != block_keys([1] * 4, [], None, BS)


def test_block_size_is_part_of_the_key() -> None:
    ids = list(range(8))
    assert block_keys(ids, [], None, 4)[1] != block_keys(ids, [], None, 8)[0]


def test_prefix_property_keys_of_a_prefix_are_a_prefix_of_keys() -> None:
    ids = list(range(30))
    assert block_keys(ids[:13], [], "s", BS) == block_keys(ids, [], "s", BS)[:3]


def test_keys_are_pinned_across_processes_and_versions() -> None:
    # A golden value computed once in another interpreter: keys must not depend on the
    # process (no hash()) and must not drift silently, or prefill and decode workers of
    # the same deployment would stop sharing cache entries.
    keys = block_keys(list(range(12)), [MediaItem("x", 2, 5)], "mm:x", 4)
    assert keys[-1].hex() == GOLDEN


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="block_size"):
        block_keys([1, 2], [], None, 0)
    with pytest.raises(ValueError, match="negative"):
        block_keys([1, 2], [MediaItem("h", -1, 2)], None, 1)


def test_hash_salt() -> None:
    assert hash_salt([]) is None
    assert hash_salt(["h1"]) == "mm:h1"
    assert hash_salt(["h1", "h2"]) == "mm:h1,h2"
    assert hash_salt(["h2", "h1"]) != hash_salt(["h1", "h2"])
