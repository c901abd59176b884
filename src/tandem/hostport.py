"""Host and port text: the one place that writes and reads ``host:port``.

An IPv6 literal is written in brackets (``[::1]:50051``) wherever a port follows it: in
gRPC targets and bind addresses, READY lines, worker URLs and ``http://`` bootstrap
addresses. A bare host (a flag's value, the ``remote_host`` of KV params) is kept without
brackets. ``::1:50051`` is refused rather than guessed at: it could be the address
``::1:50051`` or ``::1`` port 50051 (docs/operations.md, "Addresses").
"""

from __future__ import annotations

import ipaddress

from tandem.ascii_int import ascii_int

# Characters a host name may hold; anything else (spaces, "/", "@", "?") is a typo or a URL.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


def bare_host(host: str) -> str:
    """``[::1]`` → ``::1``; any other host unchanged."""
    if len(host) >= 2 and host[0] == "[" and host[-1] == "]":
        return host[1:-1]
    return host


def is_wildcard(host: str) -> bool:
    """True for a bind-everything host (``0.0.0.0``, ``::``, empty): nobody can dial it."""
    host = bare_host(host)
    if not host:
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def check_host(host: str, flag: str = "host") -> str:
    """A host as a flag names it (name, IPv4, IPv6 with or without brackets), made bare.

    Raises ValueError for text that is no host, e.g. one with a port (``localhost:8000``).
    """
    bare = bare_host(host)
    if ":" in bare:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            raise ValueError(
                f"{flag} {host!r} is neither a host name nor an IPv6 address "
                "(give the port separately)"
            ) from None
        return bare
    if bare != host:  # brackets around something that is not IPv6
        raise ValueError(f"{flag} {host!r}: only an IPv6 address goes in brackets")
    if bare and not set(bare) <= _NAME_CHARS:
        raise ValueError(f"{flag} {host!r} is not a host name or address")
    return bare


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets: ``[::1]:50051``."""
    host = bare_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (bare host, port); ValueError for anything else."""
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError(f"address {text!r}: expected [IPv6]:port")
        host, port_text = text[1:close], text[close + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"address {text!r}: {host!r} in brackets is not IPv6") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"address {text!r} has no port (expected host:port)")
        if ":" in host:
            raise ValueError(
                f"address {text!r} is ambiguous: write an IPv6 address with a port in "
                "brackets, as [address]:port"
            )
        check_host(host, "address")
    if not host:
        raise ValueError(f"address {text!r} has no host")
    port = ascii_int(port_text)
    if port is None or not 0 < port < 65536:
        raise ValueError(f"address {text!r}: the port must be a number in 1..65535")
    return host, port


def split_url(url: str, scheme: str) -> tuple[str, int]:
    """Host and port of ``scheme://host:port[/]`` or plain ``host:port``."""
    text = url.strip().removeprefix(f"{scheme}://")
    return split_host_port(text.removesuffix("/"))


def canonical_address(url: str, scheme: str = "grpc") -> str:
    """The one spelling of a worker address: ``grpc://[::1]:5/`` → ``[::1]:5``."""
    return join_host_port(*split_url(url, scheme))
