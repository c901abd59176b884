"""An httpx transport whose connections go only to addresses the guard has vetted.

httpx resolves names inside its network backend, after any check we could make on the URL,
so a name could answer "public" to the guard and "internal" to the connection (DNS
rebinding). ``GuardedBackend`` closes that gap: it is the httpcore network backend, so it is
handed the host at connect time, resolves it once through the guard, and opens the socket to
one of exactly those vetted IPs. TLS still uses the URL's hostname for SNI and certificate
checks, because httpcore takes those from the request origin, not from the socket.

Only public httpcore/httpx APIs are used (``AsyncConnectionPool(network_backend=...)``,
``AsyncBaseTransport``); httpcore exceptions are translated to their httpx namesakes so a
client built here behaves like any other httpx client.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator

import httpcore
import httpx

from tandem.media.errors import MediaRefused
from tandem.media.guard import Resolver, vet_host
from tandem.media.policy import MediaPolicy

_USER_AGENT = "tandem-media/0.1"

# httpcore and httpx name their exceptions alike, so the map is built by name.
_EXCEPTION_NAMES = (
    "ConnectTimeout",
    "ReadTimeout",
    "WriteTimeout",
    "PoolTimeout",
    "ConnectError",
    "ReadError",
    "WriteError",
    "RemoteProtocolError",
    "LocalProtocolError",
    "ProxyError",
    "UnsupportedProtocol",
    "TimeoutException",
    "NetworkError",
    "ProtocolError",
)
_EXCEPTION_MAP: dict[type[Exception], type[httpx.TransportError]] = {
    getattr(httpcore, name): getattr(httpx, name)
    for name in _EXCEPTION_NAMES
    if hasattr(httpcore, name) and hasattr(httpx, name)
}


@contextlib.contextmanager
def _httpx_errors(request: httpx.Request | None = None) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for cls in type(exc).__mro__:
            target = _EXCEPTION_MAP.get(cls)
            if target is not None:
                raise target(str(exc) or type(exc).__name__, request=request) from exc
        raise


@functools.cache
def _default_ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle costs ~30 ms; a context is safe to share, so build it once.
    return httpx.create_ssl_context()


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Resolves through the guard and connects to a vetted IP, trying each in order."""

    def __init__(self, policy: MediaPolicy, resolver: Resolver | None = None) -> None:
        self._policy = policy
        self._resolver = resolver
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await vet_host(host.lower(), port, self._policy, self._resolver)
        last_error: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last_error = exc
        if last_error is None:  # vet_host never returns an empty tuple; be explicit anyway
            raise httpcore.ConnectError(f"no address to connect to for {host[:100]!r}")
        raise last_error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise MediaRefused("unix sockets are never a media source")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, inner: AsyncIterable[bytes]) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors():
            async for chunk in self._inner:
                yield chunk

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


class GuardedTransport(httpx.AsyncBaseTransport):
    def __init__(
        self,
        policy: MediaPolicy,
        resolver: Resolver | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 32,
    ) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context or _default_ssl_context(),
            max_connections=max_connections,
            keepalive_expiry=5.0,
            network_backend=GuardedBackend(policy, resolver),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not isinstance(request.stream, httpx.AsyncByteStream):
            raise TypeError("GuardedTransport needs an async request body")
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _httpx_errors(request):
            response = await self._pool.handle_async_request(core_request)
        if not isinstance(response.stream, AsyncIterable):
            raise TypeError("httpcore returned a synchronous response stream")
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_ResponseStream(response.stream),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._pool.aclose()


def make_client(
    policy: MediaPolicy,
    resolver: Resolver | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> httpx.AsyncClient:
    """An httpx client for media fetches: guarded connections, no redirects, no env proxies.

    Environment proxies must stay off: with HTTP(S)_PROXY every connection would go to the
    proxy and the guard would be vetting the wrong address. (httpx already skips them when a
    transport is given; ``trust_env=False`` says so explicitly and also drops SSL_CERT_*.)
    ``ssl_context`` replaces the default CA bundle (tests, private CAs).
    """
    return httpx.AsyncClient(
        transport=GuardedTransport(policy, resolver, ssl_context=ssl_context),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(
            connect=policy.connect_timeout_s,
            read=policy.read_timeout_s,
            write=policy.read_timeout_s,
            pool=policy.connect_timeout_s,
        ),
        headers={"user-agent": _USER_AGENT, "accept-encoding": "identity"},
    )
