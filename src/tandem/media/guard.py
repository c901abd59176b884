"""SSRF guard: decide whether a media URL may be fetched, before anything connects to it.

Checks, in order: scheme (per policy), URL shape (host present, no credentials), domain
allow-list, then, unless ``allow_private_hosts``, every address the host resolves to. A host
is refused when ANY of its addresses is internal, so a name with one public and one private
record cannot be used to reach the private one.

The addresses returned are the vetted ones; ``transport.GuardedBackend`` repeats the address
check at connect time and connects to the IP it checked, so a DNS answer that changes between
this check and the connection (rebinding) cannot slip through.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from tandem.media.errors import MediaFetchFailed, MediaRefused, describe_url
from tandem.media.policy import MediaPolicy

# (host, port) -> IP address strings. Injectable so tests can map made-up names to loopback.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
# DNS labels (underscore tolerated, as real-world names use it). httpx percent-encodes odd
# characters into the host instead of rejecting them, so shape is checked here.
_HOSTNAME_RE = re.compile(r"^[a-z0-9_]([a-z0-9_\-]{0,62})(\.[a-z0-9_]([a-z0-9_\-]{0,62}))*\.?$")
# Only data URLs are legitimately long; a multi-kilobyte http URL is abuse or a mistake.
_MAX_NETWORK_URL_CHARS = 8192
_DEFAULT_PORTS = {"http": 80, "https": 443}
# 64:ff9b::/96 (RFC 6052) embeds an IPv4 address that a NAT64 gateway will connect to.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass(slots=True, frozen=True)
class VettedURL:
    url: httpx.URL
    scheme: str
    host: str
    port: int
    # Every address the host resolved to (the literal itself for an IP host); all of them
    # passed the address check unless the policy allows private hosts.
    addresses: tuple[str, ...]


def url_scheme(url: str) -> str:
    """Lowercased scheme, the prefix before ':' (as the router computes it for media_refs)."""
    match = _SCHEME_RE.match(url)
    if match is None:
        raise MediaRefused(f"not an absolute URL: {describe_url(url)!r}")
    return match.group(1).lower()


def check_scheme(url: str, policy: MediaPolicy) -> str:
    scheme = url_scheme(url)
    if scheme not in policy.schemes():
        raise MediaRefused(
            f"URL scheme {scheme!r} is not accepted (accepted: {policy.schemes_label()})"
        )
    return scheme


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve with the event loop's getaddrinfo (a thread pool), keeping answer order."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        # EAI_AGAIN is a resolver hiccup worth retrying; NXDOMAIN and friends are not.
        transient = exc.errno == socket.EAI_AGAIN
        raise MediaFetchFailed(
            f"cannot resolve host {host[:100]!r}: {exc.strerror}", retryable=transient
        ) from exc
    seen: dict[str, None] = {}
    for *_, sockaddr in infos:
        seen.setdefault(str(sockaddr[0]), None)
    return list(seen)


def is_forbidden_address(ip: IPAddress) -> bool:
    """True for any address that is not a normal public unicast destination."""
    if isinstance(ip, ipaddress.IPv6Address):
        # Addresses that carry an IPv4 address are judged by the IPv4 address they reach.
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is None and ip.teredo is not None:
            embedded = ip.teredo[1]
        if embedded is not None and is_forbidden_address(embedded):
            return True
        if ip.ipv4_mapped is not None:
            return False
    return (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )


def parse_ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def vet_host(
    host: str, port: int, policy: MediaPolicy, resolver: Resolver | None = None
) -> tuple[str, ...]:
    """Resolve ``host`` and return its addresses, refusing if any is internal.

    With ``allow_private_hosts`` every address is returned unchecked (still resolved through
    ``resolver``, so a test resolver also governs where the transport connects).
    """
    literal = parse_ip(host)
    if literal is not None:
        addresses: Sequence[str] = (host,)
    else:
        addresses = await (resolver or system_resolver)(host, port)
        if not addresses:
            raise MediaFetchFailed(f"host {host[:100]!r} resolved to no addresses")
    if policy.allow_private_hosts:
        return tuple(addresses)
    for address in addresses:
        ip = parse_ip(address)
        if ip is None or is_forbidden_address(ip):
            # Name the address only for literal hosts: the caller already knows it, while a
            # resolved internal address is exactly what an SSRF probe wants to learn.
            shown = f" ({address})" if literal is not None else ""
            raise MediaRefused(
                f"host {host[:100]!r}{shown} is private, loopback, link-local or otherwise "
                "not publicly routable; media URLs must point at public hosts"
            )
    return tuple(addresses)


async def check_url(
    url: str | httpx.URL, policy: MediaPolicy, resolver: Resolver | None = None
) -> VettedURL:
    """Vet an http(s) URL for fetching; raise ``MediaRefused`` when the policy forbids it.

    data: and file: URLs are vetted by ``inline`` and ``localfile``; here they are refused,
    which is also what stops a redirect from pointing at a local file.
    """
    text = str(url)
    scheme = check_scheme(text, policy)
    if scheme not in _DEFAULT_PORTS:
        raise MediaRefused(f"URL scheme {scheme!r} cannot be fetched over the network")
    if len(text) > _MAX_NETWORK_URL_CHARS:
        raise MediaRefused(f"URL is longer than {_MAX_NETWORK_URL_CHARS} characters")
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(text)
        host = parsed.raw_host.decode("ascii").lower()
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise MediaRefused(f"malformed URL {describe_url(text)!r}: {exc}") from exc
    if not host:
        raise MediaRefused(f"URL has no host: {describe_url(text)!r}")
    if parse_ip(host) is None and _HOSTNAME_RE.match(host) is None:
        raise MediaRefused(f"URL host is not a valid host name: {describe_url(text)!r}")
    if parsed.userinfo:
        # Credentials would be sent to the origin and echoed in logs; media URLs need none.
        raise MediaRefused("URLs with embedded credentials are not accepted")
    if not policy.domain_allowed(host):
        raise MediaRefused(f"host {host[:100]!r} is not in the allowed media domains")
    port = parsed.port or _DEFAULT_PORTS[scheme]
    addresses = await vet_host(host, port, policy, resolver)
    return VettedURL(url=parsed, scheme=scheme, host=host, port=port, addresses=addresses)
