"""Fetch media bytes from http(s), data: and file:// URLs under one ``MediaPolicy``.

HTTP redirects are followed here, not by httpx, so that every hop goes through the guard
(scheme, domain allow-list, address check) before anything connects to it. Bodies are
streamed and abandoned as soon as they pass ``max_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Awaitable, Callable, Iterator, Sequence

import httpx

from tandem.ascii_int import ascii_int
from tandem.media.errors import MediaFetchFailed, MediaRefused, MediaTooLarge, describe_url
from tandem.media.guard import Resolver, VettedURL, check_scheme, check_url
from tandem.media.inline import check_data_url, parse_data_url
from tandem.media.localfile import read_local_file, resolve_local_path
from tandem.media.policy import MediaPolicy
from tandem.media.transport import make_client
from tandem.media.types import FetchedMedia

# Vets one hop. A parameter only so tests can exercise the redirect loop in isolation.
UrlCheck = Callable[[str | httpx.URL], Awaitable[VettedURL]]


async def fetch_media(
    url: str,
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    resolver: Resolver | None = None,
) -> FetchedMedia:
    """Fetch one media item. Raises only ``MediaError`` subclasses for bad or failed media.

    Without ``client`` a guarded client (``transport.make_client``) is used, which pins each
    connection to a vetted address. A caller-supplied client still gets every hop checked,
    but only a client from ``make_client`` also closes the DNS-rebinding window.
    """
    scheme = check_scheme(url, policy)
    if scheme == "data":
        return parse_data_url(url, policy)
    if scheme == "file":
        return await read_local_file(url, policy)
    return await fetch_http(url, policy, client=client, resolver=resolver)


async def vet_media_url(url: str, policy: MediaPolicy, resolver: Resolver | None = None) -> str:
    """Refuse, without fetching, every URL that ``fetch_media`` would refuse up front.

    For a component that forwards URLs for someone else to fetch (the gateway forwarding
    ``media_refs``): scheme, data-URL form and estimated size, file:// containment, and for
    http(s) the full guard (domain allow-list and address check). Returns the scheme.
    Redirect targets can only be checked by whoever fetches, so the fetching side must
    apply the same policy too.
    """
    scheme = check_scheme(url, policy)
    if scheme == "data":
        check_data_url(url, policy)
    elif scheme == "file":
        resolve_local_path(url, policy)
    else:
        await check_url(url, policy, resolver)
    return scheme


async def fetch_all(
    urls: Sequence[str],
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    resolver: Resolver | None = None,
) -> list[FetchedMedia]:
    """Fetch every URL concurrently, results in input order.

    The first failure propagates unchanged and cancels the fetches still running, so a
    request with one bad image does not keep downloading the others.
    """
    if not urls:
        return []
    own_client = client is None and any(u[:4].lower() == "http" for u in urls)
    if own_client:
        client = make_client(policy, resolver)
    tasks = [asyncio.create_task(fetch_media(u, policy, client, resolver)) for u in urls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if own_client and client is not None:
            await client.aclose()


async def fetch_http(
    url: str | httpx.URL,
    policy: MediaPolicy,
    client: httpx.AsyncClient | None = None,
    resolver: Resolver | None = None,
    check: UrlCheck | None = None,
) -> FetchedMedia:
    vet: UrlCheck = check or functools.partial(check_url, policy=policy, resolver=resolver)
    own_client = client is None
    active = make_client(policy, resolver) if client is None else client
    # One budget for DNS, every hop and the body: read timeouts alone would let an origin
    # that drips a byte per second hold the request for hours.
    budget = asyncio.timeout(policy.total_timeout_s)
    try:
        async with budget:
            return await _follow_redirects(url, policy, active, vet)
    except TimeoutError as exc:
        if not budget.expired():
            # A socket-level TimeoutError (an OSError) that no layer above translated.
            raise MediaFetchFailed(
                f"timed out fetching {describe_url(str(url))!r}", retryable=True
            ) from exc
        raise MediaFetchFailed(
            f"fetching {describe_url(str(url))!r} took longer than {policy.total_timeout_s}s",
            retryable=True,
        ) from exc
    finally:
        if own_client:
            await active.aclose()


async def _follow_redirects(
    url: str | httpx.URL, policy: MediaPolicy, client: httpx.AsyncClient, check: UrlCheck
) -> FetchedMedia:
    current: str | httpx.URL = url
    for _ in range(policy.max_redirects + 1):
        vetted = await check(current)
        shown = describe_url(str(vetted.url))
        with _network_errors(shown):
            request = client.build_request(
                "GET",
                vetted.url,
                # Ask for the body as stored: the hash is over the bytes as served, and a
                # compressed body could inflate far past max_bytes.
                headers={"accept-encoding": "identity"},
                timeout=httpx.Timeout(
                    connect=policy.connect_timeout_s,
                    read=policy.read_timeout_s,
                    write=policy.read_timeout_s,
                    pool=policy.connect_timeout_s,
                ),
            )
            response = await client.send(request, stream=True, follow_redirects=False)
            try:
                if response.is_redirect:
                    current = _redirect_target(vetted.url, response.headers["location"])
                    continue
                return await _read_body(response, policy, vetted, shown)
            finally:
                await response.aclose()
    raise MediaFetchFailed(
        f"too many redirects (more than {policy.max_redirects}) from {describe_url(str(url))!r}"
    )


def _redirect_target(base: httpx.URL, location: str) -> httpx.URL:
    try:
        return base.join(location)
    except httpx.InvalidURL as exc:
        shown = describe_url(location)
        raise MediaFetchFailed(f"origin sent an invalid redirect: {shown!r}") from exc


async def _read_body(
    response: httpx.Response, policy: MediaPolicy, vetted: VettedURL, shown: str
) -> FetchedMedia:
    status = response.status_code
    if not response.is_success:
        raise MediaFetchFailed(
            f"origin returned HTTP {status} for {shown!r}",
            retryable=status >= 500 or status == 429,
        )
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise MediaFetchFailed(
            f"origin sent Content-Encoding {encoding[:40]!r} for {shown!r}; only identity is "
            "accepted"
        )
    declared = ascii_int(response.headers.get("content-length", "").strip())
    if declared is not None and declared > policy.max_bytes:
        raise MediaTooLarge(
            f"{shown!r} declares {declared} bytes, over the {policy.max_bytes}-byte limit"
        )
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > policy.max_bytes:
            # Leaving the loop closes the stream and drops the connection mid-body.
            raise MediaTooLarge(f"{shown!r} is over the {policy.max_bytes}-byte limit")
    content_type = response.headers.get("content-type")
    return FetchedMedia(
        data=bytes(body),
        content_type=content_type[:200] if content_type else None,
        source_scheme=vetted.scheme,
    )


@contextlib.contextmanager
def _network_errors(shown: str) -> Iterator[None]:
    """Translate httpx failures into MediaError, marking the transient ones retryable."""
    try:
        yield
    except httpx.TimeoutException as exc:
        raise MediaFetchFailed(f"timed out fetching {shown!r}", retryable=True) from exc
    except httpx.NetworkError as exc:
        if _caused_by(exc, ssl.SSLCertVerificationError):
            # A bad certificate will not fix itself on retry.
            raise MediaFetchFailed(
                f"TLS certificate verification failed for {shown!r}", retryable=False
            ) from exc
        raise MediaFetchFailed(
            f"connection to the origin of {shown!r} failed: {type(exc).__name__}",
            retryable=True,
        ) from exc
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
        raise MediaRefused(f"cannot fetch {shown!r}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise MediaFetchFailed(f"fetching {shown!r} failed: {type(exc).__name__}") from exc


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
