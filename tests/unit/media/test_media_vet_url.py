"""vet_media_url: the up-front refusals a forwarding gateway applies to media_refs."""

from __future__ import annotations

from pathlib import Path

import pytest
from media_origin_server import LoopbackOrigin

from tandem.media import MediaPolicy, MediaRefused, MediaTooLarge, vet_media_url

FAKE_HOST = "images.example.test"


async def _loopback_dns(host: str, port: int) -> list[str]:
    return ["127.0.0.1"]


async def test_loopback_refs_are_refused_and_nothing_connects(origin: LoopbackOrigin) -> None:
    for url in (origin.url("/img.png"), origin.url("/img.png", "localhost")):
        with pytest.raises(MediaRefused):
            await vet_media_url(url, MediaPolicy())
    with pytest.raises(MediaRefused):
        await vet_media_url(f"http://{FAKE_HOST}/a.png", MediaPolicy(), _loopback_dns)
    assert origin.state.paths() == []


async def test_accepted_refs_return_their_scheme(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"x")
    policy = MediaPolicy(allow_private_hosts=True, allowed_local_path=tmp_path)
    assert await vet_media_url("HTTP://127.0.0.1:1/a.png", policy) == "http"
    assert await vet_media_url("data:image/png;base64,AAEC", policy) == "data"
    assert await vet_media_url(f"file://{tmp_path}/a.png", policy) == "file"


async def test_data_refs_are_checked_for_form_and_estimated_size() -> None:
    policy = MediaPolicy(max_bytes=3)
    assert await vet_media_url("data:image/png;base64,AAEC", policy) == "data"
    with pytest.raises(MediaTooLarge):
        await vet_media_url("data:image/png;base64,AAECAAEC", policy)
    with pytest.raises(MediaRefused):
        await vet_media_url("data:image/png,AAEC", policy)


async def test_file_refs_outside_the_directory_or_unconfigured_are_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "secret").write_bytes(b"x")
    inside = tmp_path / "media"
    inside.mkdir()
    with pytest.raises(MediaRefused):
        await vet_media_url(f"file://{tmp_path}/secret", MediaPolicy())
    with pytest.raises(MediaRefused):
        await vet_media_url(f"file://{inside}/../secret", MediaPolicy(allowed_local_path=inside))


async def test_unknown_schemes_are_refused() -> None:
    with pytest.raises(MediaRefused, match="accepted: http,https,data"):
        await vet_media_url("ftp://files.example.test/a.png", MediaPolicy())
