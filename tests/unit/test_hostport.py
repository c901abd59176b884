"""host:port text: IPv6 in brackets wherever a port follows, and no guessing when it is not."""

from __future__ import annotations

import pytest

from tandem.hostport import (
    bare_host,
    canonical_address,
    check_host,
    is_wildcard,
    join_host_port,
    split_host_port,
    split_url,
)


@pytest.mark.parametrize(
    ("host", "port", "text"),
    [
        ("127.0.0.1", 50051, "127.0.0.1:50051"),
        ("localhost", 8000, "localhost:8000"),
        ("::1", 50051, "[::1]:50051"),
        ("[::1]", 50051, "[::1]:50051"),  # already bracketed: not bracketed twice
    ],
)
def test_join_and_split_round_trip(host: str, port: int, text: str) -> None:
    assert join_host_port(host, port) == text
    assert split_host_port(text) == (bare_host(host), port)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("::1:50051", "ambiguous"),  # ::1 port 50051, or the address ::1:50051?
        ("::1", "ambiguous"),
        ("localhost", "no port"),
        ("[::1]", r"\[IPv6\]:port"),
        ("[::1]50051", r"\[IPv6\]:port"),
        ("[localhost]:1", "not IPv6"),
        ("localhost:0", "1..65535"),
        ("localhost:65536", "1..65535"),
        ("localhost:http", "1..65535"),
        ("localhost:-1", "1..65535"),
        (":50051", "no host"),
        ("a b:1", "not a host name"),
        ("user@host:1", "not a host name"),
    ],
)
def test_split_refuses_what_is_no_address(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        split_host_port(text)


def test_urls_with_a_scheme_and_a_trailing_slash() -> None:
    assert split_url("http://[::1]:8998", "http") == ("::1", 8998)
    assert split_url("grpc://localhost:7000/", "grpc") == ("localhost", 7000)
    assert canonical_address("grpc://[::1]:7000/") == "[::1]:7000"
    assert canonical_address(" 127.0.0.1:7000 ") == "127.0.0.1:7000"
    with pytest.raises(ValueError, match="ambiguous"):
        canonical_address("grpc://::1:7000")


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "[::]", "0:0::0"])
def test_wildcards(host: str) -> None:
    assert is_wildcard(host)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "worker-1.example"])
def test_not_wildcards(host: str) -> None:
    assert not is_wildcard(host)


def test_check_host_takes_a_host_without_a_port() -> None:
    assert check_host("[::1]") == "::1"
    assert check_host("::1") == "::1"
    assert check_host("localhost") == "localhost"
    for bad in ("localhost:8000", "[localhost]", "a/b", "::1::2::3"):
        with pytest.raises(ValueError, match="--host"):
            check_host(bad, "--host")
