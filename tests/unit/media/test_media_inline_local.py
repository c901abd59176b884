"""data: URLs and file:// URLs (no network)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.media import (
    MediaDecodeFailed,
    MediaError,
    MediaPolicy,
    MediaRefused,
    MediaTooLarge,
    estimated_data_url_bytes,
    fetch_media,
    media_hash,
    parse_data_url,
)


def _data_url(payload: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(payload).decode()}"


async def test_data_url_decodes_to_the_exact_bytes() -> None:
    payload = bytes(range(256)) * 3
    fetched = await fetch_media(_data_url(payload), MediaPolicy())
    assert fetched.data == payload
    assert fetched.content_type == "image/png"
    assert fetched.source_scheme == "data"
    # The hash is over the base64-decoded payload, not the URL text.
    assert media_hash(fetched.data) == media_hash(payload)


def test_data_url_with_parameters_and_no_media_type() -> None:
    assert parse_data_url("data:;base64,AAEC", MediaPolicy()).data == b"\x00\x01\x02"
    assert parse_data_url("data:;base64,AAEC", MediaPolicy()).content_type is None
    fetched = parse_data_url("DATA:Image/PNG;name=a.png;BASE64,AAEC", MediaPolicy())
    assert (fetched.data, fetched.content_type) == (b"\x00\x01\x02", "image/png")


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png,rawbytes",
        "data:image/png;charset=utf-8,%00%01",
        "data:base64,AAEC",
        "data:image/png;base64",
        "data:" + "x" * 300 + ";base64,AAEC",
    ],
)
def test_non_base64_or_malformed_data_urls_are_refused(url: str) -> None:
    with pytest.raises(MediaRefused):
        parse_data_url(url, MediaPolicy())


@pytest.mark.parametrize("payload", ["AAE", "AA=C", "AA EC", "AA\nEC", "AAE*", "ÄÄÄÄ", "AAEC="])
def test_bad_base64_is_a_decode_failure(payload: str) -> None:
    with pytest.raises(MediaDecodeFailed) as info:
        parse_data_url(f"data:image/png;base64,{payload}", MediaPolicy())
    assert info.value.code == "multimodal_processing_failed"
    assert info.value.retryable is False


def test_size_cap_applies_to_the_estimate_before_decoding() -> None:
    policy = MediaPolicy(max_bytes=300)
    assert parse_data_url(_data_url(b"x" * 300), policy).data == b"x" * 300
    with pytest.raises(MediaTooLarge):
        parse_data_url(_data_url(b"x" * 301), policy)
    # Invalid base64 of an oversized length is refused for size: it is never decoded.
    garbage = "data:image/png;base64," + "*" * 1000
    with pytest.raises(MediaTooLarge) as info:
        parse_data_url(garbage, policy)
    assert info.value.code == "media_too_large"
    assert "*" * 20 not in str(info.value)


def test_estimated_size_matches_the_router_rule() -> None:
    assert estimated_data_url_bytes("data:image/png;base64," + "A" * 400) == 300
    assert estimated_data_url_bytes("data:text/plain," + "A" * 400) == 400


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_data_url_parser_raises_only_media_errors(text: str) -> None:
    for candidate in (text, "data:" + text, "data:image/png;base64," + text):
        with contextlib.suppress(MediaError):
            parse_data_url(candidate, MediaPolicy(max_bytes=64))


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=512))
def test_data_url_round_trips_any_bytes(payload: bytes) -> None:
    assert parse_data_url(_data_url(payload), MediaPolicy()).data == payload


def _binascii_strict(payload: str) -> bytes | None:
    """The reference rule: binascii's strict mode plus at most two '=' (inline.py)."""
    if len(payload) % 4 or len(payload) - len(payload.rstrip("=")) > 2:
        return None
    try:
        return binascii.a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


_B64_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n\té\x00"


@pytest.mark.fuzz
@settings(max_examples=2000, deadline=None)
@given(
    payload=st.binary(max_size=16),
    at=st.integers(min_value=0, max_value=40),
    char=st.sampled_from(_B64_CHARS),
    noise=st.text(alphabet=_B64_CHARS, max_size=12),
)
def test_data_urls_are_decoded_exactly_as_binascii_strict_mode_would(
    payload: bytes, at: int, char: str, noise: str
) -> None:
    """The SIMD decoder accepts and refuses what binascii's strict mode does, byte for byte:
    valid payloads, one character replaced anywhere, and arbitrary strings."""
    valid = base64.b64encode(payload).decode()
    mutated = valid[:at] + char + valid[at + 1 :] if at < len(valid) else valid + char
    for text in (valid, mutated, noise):
        want = _binascii_strict(text)
        try:
            got: bytes | None = parse_data_url("data:image/png;base64," + text, MediaPolicy()).data
        except MediaDecodeFailed:
            got = None
        assert got == want, text


# --- file:// ---------------------------------------------------------------------------


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    root = tmp_path / "media"
    (root / "sub").mkdir(parents=True)
    (root / "a.png").write_bytes(b"png-bytes")
    (root / "sub" / "b c.png").write_bytes(b"other-bytes")
    (tmp_path / "secret.txt").write_bytes(b"outside")
    return root


async def test_file_urls_are_refused_without_a_local_directory(media_dir: Path) -> None:
    with pytest.raises(MediaRefused, match="not accepted"):
        await fetch_media((media_dir / "a.png").as_uri(), MediaPolicy())


async def test_file_inside_the_directory_is_read(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_path=media_dir)
    fetched = await fetch_media((media_dir / "a.png").as_uri(), policy)
    assert (fetched.data, fetched.source_scheme) == (b"png-bytes", "file")
    # Percent-encoded names and the "localhost" authority both work.
    fetched = await fetch_media(f"file://localhost{media_dir}/sub/b%20c.png", policy)
    assert fetched.data == b"other-bytes"


@pytest.mark.parametrize(
    "suffix",
    ["/../secret.txt", "/sub/../../secret.txt", "/%2e%2e/secret.txt", ""],
)
async def test_dot_dot_cannot_leave_the_directory(media_dir: Path, suffix: str) -> None:
    policy = MediaPolicy(allowed_local_path=media_dir)
    with pytest.raises(MediaRefused):
        await fetch_media(f"file://{media_dir}{suffix}", policy)


async def test_symlink_escape_is_refused(media_dir: Path) -> None:
    (media_dir / "link.png").symlink_to(media_dir.parent / "secret.txt")
    (media_dir / "dirlink").symlink_to(media_dir.parent)
    policy = MediaPolicy(allowed_local_path=media_dir)
    for url in (f"file://{media_dir}/link.png", f"file://{media_dir}/dirlink/secret.txt"):
        with pytest.raises(MediaRefused, match="outside"):
            await fetch_media(url, policy)


async def test_symlink_that_stays_inside_is_allowed(media_dir: Path) -> None:
    (media_dir / "alias.png").symlink_to(media_dir / "a.png")
    policy = MediaPolicy(allowed_local_path=media_dir)
    assert (await fetch_media(f"file://{media_dir}/alias.png", policy)).data == b"png-bytes"


async def test_allowed_directory_reached_through_a_symlink(tmp_path: Path, media_dir: Path) -> None:
    alias = tmp_path / "alias-root"
    alias.symlink_to(media_dir)
    policy = MediaPolicy(allowed_local_path=alias)
    assert (await fetch_media(f"file://{alias}/a.png", policy)).data == b"png-bytes"


@pytest.mark.parametrize(
    "url",
    ["file://otherhost/x.png", "file:relative.png", "file:///x.png?q=1", "file:///%00x.png"],
)
async def test_malformed_file_urls_are_refused(media_dir: Path, url: str) -> None:
    with pytest.raises(MediaRefused):
        await fetch_media(url, MediaPolicy(allowed_local_path=media_dir))


async def test_file_size_cap_and_non_regular_files(media_dir: Path) -> None:
    (media_dir / "big.bin").write_bytes(b"x" * 101)
    policy = MediaPolicy(allowed_local_path=media_dir, max_bytes=100)
    with pytest.raises(MediaTooLarge):
        await fetch_media(f"file://{media_dir}/big.bin", policy)
    with pytest.raises(MediaRefused, match="not a regular file"):
        await fetch_media(f"file://{media_dir}/sub", policy)
    if hasattr(os, "mkfifo"):
        os.mkfifo(media_dir / "pipe")
        with pytest.raises(MediaRefused):
            await fetch_media(f"file://{media_dir}/pipe", policy)


async def test_missing_file_is_a_non_retryable_failure(media_dir: Path) -> None:
    policy = MediaPolicy(allowed_local_path=media_dir)
    with pytest.raises(MediaError) as info:
        await fetch_media(f"file://{media_dir}/nope.png", policy)
    assert info.value.retryable is False
