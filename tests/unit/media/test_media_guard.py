"""SSRF guard. Loopback targets only; public addresses are generated, never written down,
and check_url never connects, so none is ever contacted."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.media import (
    MediaError,
    MediaPolicy,
    MediaRefused,
    check_url,
    is_forbidden_address,
    url_scheme,
)

FAKE_HOST = "images.example.test"


class RecordingResolver:
    """Maps every name to fixed answers and records what it was asked."""

    def __init__(self, answers: Sequence[str]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return self.answers


async def _never_resolve(host: str, port: int) -> list[str]:
    raise AssertionError(f"resolver must not be called for {host!r}")


public_ipv4 = st.ip_addresses(v=4).filter(lambda ip: ip.is_global and not ip.is_multicast)


@pytest.mark.parametrize(
    "url",
    ["ftp://x.example.test/a.png", "gopher://x.example.test/", "file:///etc/passwd", "a.png", ""],
)
async def test_unaccepted_schemes_are_refused(url: str) -> None:
    with pytest.raises(MediaRefused) as info:
        await check_url(url, MediaPolicy(), _never_resolve)
    assert info.value.code == "media_url_refused"
    assert info.value.retryable is False


async def test_data_urls_are_not_network_fetchable() -> None:
    with pytest.raises(MediaRefused, match="cannot be fetched over the network"):
        await check_url("data:image/png;base64,AAAA", MediaPolicy(), _never_resolve)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/a.png",
        "http://127.0.0.1:8080/a.png",
        "https://127.10.20.30/a.png",
        "http://[::1]/a.png",
        "http://[::ffff:127.0.0.1]/a.png",
        "http://0.0.0.0/a.png",
        "http://[::]/a.png",
    ],
)
async def test_literal_internal_ips_are_refused_without_dns(url: str) -> None:
    with pytest.raises(MediaRefused, match="not publicly routable"):
        await check_url(url, MediaPolicy(), _never_resolve)


async def test_localhost_is_refused_through_the_system_resolver() -> None:
    with pytest.raises(MediaRefused, match="not publicly routable"):
        await check_url("http://localhost:9/a.png", MediaPolicy())


async def test_a_name_resolving_to_loopback_is_refused() -> None:
    resolver = RecordingResolver(["127.0.0.1"])
    with pytest.raises(MediaRefused) as info:
        await check_url(f"https://{FAKE_HOST}/a.png", MediaPolicy(), resolver)
    assert resolver.calls == [(FAKE_HOST, 443)]
    # A resolved internal address is not disclosed to the client.
    assert "127.0.0.1" not in str(info.value)


@settings(max_examples=50, deadline=None)
@given(public=public_ipv4)
def test_one_internal_answer_among_public_ones_is_enough_to_refuse(
    public: ipaddress.IPv4Address,
) -> None:
    url = f"http://{FAKE_HOST}:8080/a.png"
    ok = asyncio.run(check_url(url, MediaPolicy(), RecordingResolver([str(public)])))
    assert ok.addresses == (str(public),)
    assert (ok.host, ok.port, ok.scheme) == (FAKE_HOST, 8080, "http")
    for answers in ([str(public), "127.0.0.1"], ["::1", str(public)]):
        with pytest.raises(MediaRefused):
            asyncio.run(check_url(url, MediaPolicy(), RecordingResolver(answers)))


async def test_private_hosts_allowed_returns_resolved_addresses() -> None:
    policy = MediaPolicy(allow_private_hosts=True)
    vetted = await check_url("http://127.0.0.1:1234/a.png", policy, _never_resolve)
    assert vetted.addresses == ("127.0.0.1",)
    resolver = RecordingResolver(["127.0.0.1", "::1"])
    vetted = await check_url(f"http://{FAKE_HOST}/a.png", policy, resolver)
    assert vetted.addresses == ("127.0.0.1", "::1")
    assert vetted.port == 80


async def test_domain_allow_list_is_checked_before_resolving() -> None:
    policy = MediaPolicy(allow_private_hosts=True, allowed_domains=(FAKE_HOST,))
    with pytest.raises(MediaRefused, match="not in the allowed media domains"):
        await check_url("http://other.example.test/a.png", policy, _never_resolve)
    with pytest.raises(MediaRefused, match="not in the allowed media domains"):
        await check_url("http://127.0.0.1/a.png", policy, _never_resolve)
    resolver = RecordingResolver(["127.0.0.1"])
    vetted = await check_url(f"http://CDN.{FAKE_HOST.upper()}/a.png", policy, resolver)
    assert vetted.host == f"cdn.{FAKE_HOST}"


@pytest.mark.parametrize(
    "url",
    [
        "http://user:secret@images.example.test/a.png",
        "http:///a.png",
        "http://exa mple.test/a.png",
        "http://images.example.test/" + "a" * 9000,
    ],
)
async def test_malformed_or_credentialed_urls_are_refused(url: str) -> None:
    with pytest.raises(MediaRefused) as info:
        await check_url(url, MediaPolicy(allow_private_hosts=True), RecordingResolver(["::1"]))
    assert "secret" not in str(info.value)
    assert len(str(info.value)) < 400


def test_url_scheme_is_lowercased_prefix() -> None:
    assert url_scheme("HTTPS://x") == "https"
    assert url_scheme("Data:image/png;base64,") == "data"
    with pytest.raises(MediaRefused):
        url_scheme("//no-scheme")


@settings(max_examples=200, deadline=None)
@given(ip=st.ip_addresses())
def test_every_address_the_spec_lists_is_forbidden(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    flagged = (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )
    if flagged and not (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped):
        assert is_forbidden_address(ip)


@settings(max_examples=300, deadline=None)
@given(ip=st.ip_addresses(v=4))
def test_ipv4_mapped_ipv6_is_judged_like_the_ipv4_address(ip: ipaddress.IPv4Address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{ip}")
    assert is_forbidden_address(mapped) == is_forbidden_address(ip)


@settings(max_examples=100, deadline=None)
@given(ip=st.ip_addresses(v=4).filter(lambda ip: not ip.is_global))
def test_non_global_ipv4_is_forbidden_directly_and_via_6to4(ip: ipaddress.IPv4Address) -> None:
    assert is_forbidden_address(ip)
    six_to_four = ipaddress.IPv6Address((0x2002 << 112) | (int(ip) << 80))
    assert six_to_four.sixtofour == ip
    assert is_forbidden_address(six_to_four)


def test_loopback_range_and_ipv6_loopback_are_forbidden() -> None:
    for text in ("127.0.0.1", "127.255.255.254", "::1", "::ffff:127.0.0.1", "0.0.0.0", "::"):
        assert is_forbidden_address(ipaddress.ip_address(text)), text


@settings(max_examples=150, deadline=None)
@given(tail=st.text(max_size=60))
def test_check_url_raises_only_media_errors_on_arbitrary_input(tail: str) -> None:
    for prefix in ("http://", "https://", "", "data:", "file://"):
        with contextlib.suppress(MediaError):
            asyncio.run(check_url(prefix + tail, MediaPolicy(), RecordingResolver(["127.0.0.1"])))
