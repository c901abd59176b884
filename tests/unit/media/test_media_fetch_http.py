"""http(s) fetching against a real origin on 127.0.0.1 (see conftest.py). No httpx mocks."""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import quote

import httpx
import pytest
from media_origin_server import HUGE_TOTAL, LoopbackOrigin

from tandem.media import (
    MediaFetchFailed,
    MediaPolicy,
    MediaRefused,
    MediaTooLarge,
    VettedURL,
    check_url,
    decode_image,
    fetch_all,
    fetch_http,
    fetch_media,
    make_client,
    media_hash,
)

FAKE_HOST = "images.example.test"
LOOPBACK_OK = MediaPolicy(allow_private_hosts=True)


async def fake_dns(host: str, port: int) -> list[str]:
    """Resolves the made-up FAKE_HOST to loopback; nothing else resolves."""
    if host == FAKE_HOST:
        return ["127.0.0.1"]
    raise MediaFetchFailed(f"test resolver does not know {host!r}")


async def test_fetch_png_with_private_hosts_allowed(origin: LoopbackOrigin) -> None:
    fetched = await fetch_media(origin.url("/img.png"), LOOPBACK_OK)
    assert fetched.data == origin.state.png
    assert (fetched.content_type, fetched.source_scheme) == ("image/png", "http")
    assert media_hash(fetched.data) == media_hash(origin.state.png)
    assert decode_image(fetched.data, LOOPBACK_OK).size == (8, 6)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
async def test_loopback_is_refused_before_any_connection(origin: LoopbackOrigin, host: str) -> None:
    with pytest.raises(MediaRefused) as info:
        await fetch_media(origin.url("/img.png", host=host), MediaPolicy())
    assert info.value.code == "media_url_refused"
    assert origin.state.paths() == []


async def test_guarded_client_refuses_at_connect_time(origin: LoopbackOrigin) -> None:
    # Even used directly, without check_url in front, the client never opens a socket to
    # an internal address: the guard lives in its network backend.
    async with make_client(MediaPolicy()) as client:
        with pytest.raises(MediaRefused):
            await client.get(origin.url("/img.png"))
    assert origin.state.paths() == []


async def test_environment_proxies_do_not_bypass_the_guard(
    origin: LoopbackOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A proxy from the environment would receive every connection, so the backend would be
    # vetting the proxy instead of the origin. The guarded client ignores the environment.
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, origin.url(""))
    async with make_client(MediaPolicy(), resolver=fake_dns) as client:
        with pytest.raises(MediaRefused):
            await client.get(f"http://{FAKE_HOST}:{origin.port}/img.png")
    assert origin.state.paths() == []


async def test_name_that_rebinds_to_loopback_after_the_check_is_refused(
    origin: LoopbackOrigin,
) -> None:
    # Simulate DNS rebinding: the URL check was (wrongly) satisfied, then the name resolves
    # to loopback when the connection is made. The pinned backend re-vets and refuses.
    async def approve_everything(url: str | httpx.URL) -> VettedURL:
        parsed = httpx.URL(str(url))
        return VettedURL(parsed, "http", parsed.host, parsed.port or 80, ())

    url = f"http://{FAKE_HOST}:{origin.port}/img.png"
    with pytest.raises(MediaRefused):
        await fetch_http(url, MediaPolicy(), resolver=fake_dns, check=approve_everything)
    assert origin.state.paths() == []


async def test_injected_resolver_decides_where_the_transport_connects(
    origin: LoopbackOrigin,
) -> None:
    policy = MediaPolicy(allow_private_hosts=True, allowed_domains=(FAKE_HOST,))
    url = f"http://{FAKE_HOST}:{origin.port}/img.png"
    fetched = await fetch_media(url, policy, resolver=fake_dns)
    assert fetched.data == origin.state.png
    # The request still names the original host; only the socket goes to the vetted IP.
    assert origin.state.requests == [("/img.png", f"{FAKE_HOST}:{origin.port}")]


async def test_redirect_to_same_origin_is_followed(origin: LoopbackOrigin) -> None:
    fetched = await fetch_media(origin.url("/redirect-self"), LOOPBACK_OK)
    assert fetched.data == origin.state.png
    assert origin.state.paths() == ["/redirect-self", "/img.png"]


async def test_exactly_max_redirects_is_allowed(origin: LoopbackOrigin) -> None:
    policy = MediaPolicy(allow_private_hosts=True, max_redirects=3)
    assert (await fetch_media(origin.url("/chain/2"), policy)).data == origin.state.png


async def test_redirect_chain_longer_than_the_limit_fails(origin: LoopbackOrigin) -> None:
    policy = MediaPolicy(allow_private_hosts=True, max_redirects=3)
    with pytest.raises(MediaFetchFailed, match="too many redirects") as info:
        await fetch_media(origin.url("/loop/0"), policy)
    assert info.value.retryable is False
    assert origin.state.paths() == ["/loop/0", "/loop/1", "/loop/2", "/loop/3"]


async def test_redirect_out_of_the_allowed_domains_is_refused(origin: LoopbackOrigin) -> None:
    policy = MediaPolicy(allow_private_hosts=True, allowed_domains=(FAKE_HOST,))
    target = quote(origin.url("/img.png"), safe="")
    url = f"http://{FAKE_HOST}:{origin.port}/redirect-to?url={target}"
    with pytest.raises(MediaRefused, match="not in the allowed media domains"):
        await fetch_media(url, policy, resolver=fake_dns)
    assert origin.state.paths() == [f"/redirect-to?url={target}"]


async def test_every_redirect_hop_is_checked_for_private_hosts(origin: LoopbackOrigin) -> None:
    # The first hop is approved by a stand-in check (loopback cannot be a "public" origin in a
    # test); the redirect target then goes through the real guard and must be refused.
    first = origin.url("/redirect-to?url=" + quote(origin.url("/img.png", "localhost"), safe=""))
    policy = MediaPolicy()
    checked: list[str] = []

    async def check(url: str | httpx.URL) -> VettedURL:
        checked.append(str(url))
        if str(url) == first:
            parsed = httpx.URL(first)
            return VettedURL(parsed, "http", "127.0.0.1", origin.port, ("127.0.0.1",))
        return await check_url(url, policy)

    async with httpx.AsyncClient(trust_env=False) as plain_client:
        with pytest.raises(MediaRefused, match="not publicly routable"):
            await fetch_http(first, policy, client=plain_client, check=check)
    assert len(checked) == 2
    assert origin.state.paths() == [httpx.URL(first).raw_path.decode()]


@pytest.mark.parametrize("target", ["data:image/png;base64,AAAA", "file:///etc/hostname"])
async def test_redirect_to_non_network_schemes_is_refused(
    origin: LoopbackOrigin, target: str
) -> None:
    url = origin.url("/redirect-to?url=" + quote(target, safe=""))
    with pytest.raises(MediaRefused):
        await fetch_media(url, LOOPBACK_OK)


async def test_streamed_body_is_abandoned_past_max_bytes(origin: LoopbackOrigin) -> None:
    policy = MediaPolicy(allow_private_hosts=True, max_bytes=256 * 1024)
    with pytest.raises(MediaTooLarge) as info:
        await fetch_media(origin.url("/huge"), policy)
    assert info.value.code == "media_too_large"
    assert origin.state.huge_done.wait(10)
    # The origin could push only what socket buffers hold before the client hung up.
    assert origin.state.huge_written < HUGE_TOTAL // 2


async def test_declared_oversized_body_is_refused_from_the_header(
    origin: LoopbackOrigin,
) -> None:
    policy = MediaPolicy(allow_private_hosts=True, max_bytes=1024 * 1024)
    with pytest.raises(MediaTooLarge, match="declares 1073741824 bytes"):
        await fetch_media(origin.url("/declared-huge"), policy)


async def test_read_timeout_is_retryable(origin: LoopbackOrigin) -> None:
    policy = MediaPolicy(allow_private_hosts=True, read_timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(MediaFetchFailed, match="timed out") as info:
        await fetch_media(origin.url("/slow"), policy)
    assert info.value.retryable is True
    assert time.monotonic() - started < 2


async def test_total_timeout_stops_a_dripping_origin(origin: LoopbackOrigin) -> None:
    policy = MediaPolicy(allow_private_hosts=True, read_timeout_s=1.0, total_timeout_s=0.4)
    started = time.monotonic()
    with pytest.raises(MediaFetchFailed, match=r"longer than 0\.4s") as info:
        await fetch_media(origin.url("/drip"), policy)
    assert info.value.retryable is True
    assert time.monotonic() - started < 2


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (503, True), (404, False)])
async def test_non_2xx_is_an_error(origin: LoopbackOrigin, status: int, retryable: bool) -> None:
    with pytest.raises(MediaFetchFailed, match=f"HTTP {status}") as info:
        await fetch_media(origin.url(f"/status/{status}"), LOOPBACK_OK)
    assert info.value.retryable is retryable


async def test_compressed_body_is_refused(origin: LoopbackOrigin) -> None:
    with pytest.raises(MediaFetchFailed, match="Content-Encoding"):
        await fetch_media(origin.url("/gzip"), LOOPBACK_OK)
    # We asked for the stored bytes.
    assert origin.state.paths() == ["/gzip"]


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Nothing listens on the port now.
    with pytest.raises(MediaFetchFailed) as info:
        await fetch_media(f"http://127.0.0.1:{port}/img.png", LOOPBACK_OK)
    assert info.value.retryable is True


async def test_fetch_all_preserves_order_across_schemes(origin: LoopbackOrigin) -> None:
    urls = [
        origin.url("/img.png"),
        "data:image/png;base64,AAEC",
        origin.url("/redirect-self"),
    ]
    results = await fetch_all(urls, LOOPBACK_OK)
    assert [r.data for r in results] == [origin.state.png, b"\x00\x01\x02", origin.state.png]
    assert [r.source_scheme for r in results] == ["http", "data", "http"]
    assert await fetch_all([], LOOPBACK_OK) == []


async def test_fetch_all_fails_fast_and_cancels_the_rest(origin: LoopbackOrigin) -> None:
    policy = MediaPolicy(allow_private_hosts=True, read_timeout_s=5.0)
    started = time.monotonic()
    urls = [origin.url("/slow"), origin.url("/status/404"), origin.url("/slow")]
    with pytest.raises(MediaFetchFailed, match="HTTP 404"):
        await fetch_all(urls, policy)
    # The 404 surfaced at once instead of after the /slow fetches finished.
    assert time.monotonic() - started < 1.5
    leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftovers == []


async def test_fetch_all_refuses_loopback_without_connecting(origin: LoopbackOrigin) -> None:
    with pytest.raises(MediaRefused):
        await fetch_all(["data:;base64,AAEC", origin.url("/img.png")], MediaPolicy())
    assert origin.state.paths() == []


async def test_caller_supplied_client_is_left_open(origin: LoopbackOrigin) -> None:
    async with make_client(LOOPBACK_OK) as client:
        first = await fetch_media(origin.url("/img.png"), LOOPBACK_OK, client=client)
        second = await fetch_media(origin.url("/img.png"), LOOPBACK_OK, client=client)
        assert first.data == second.data == origin.state.png
        assert not client.is_closed
