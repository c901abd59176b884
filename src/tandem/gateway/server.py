"""Run the gateway: connect the workers, load the model files, serve HTTP with uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType

import uvicorn

from tandem.gateway.app import build_app
from tandem.gateway.backend import resolved_backend
from tandem.gateway.config import GatewayConfig
from tandem.gateway.state import GatewayState
from tandem.hostport import bare_host, join_host_port

log = logging.getLogger("tandem.gateway")
DRAIN_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port``; ``reuse_port``: with SO_REUSEPORT, so that the
    processes of ``--processes N`` each bind their own socket on one port and the kernel
    spreads new connections over them (gateway/multiprocess)."""
    host = bare_host(host)  # "[::1]" and "::1" are the same IPv6 host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto
    # is IPPROTO_TCP, and with Nagle on every response stalls ~40 ms on the client's
    # delayed ACK (headers and body leave in separate writes).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def freeze_startup_heap() -> int:
    """Take every object alive now out of the collector's generations; how many there are.

    What exists once the gateway listens (modules, the tokenizer and chat template, the
    app, the registries) lives as long as the process, yet each full collection walked all
    of it: a pause of about 100 ms every several seconds under load on the bench machine
    (docs/performance.md, "A streamed token's path"). Garbage is collected first, never frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class DrainingServer(uvicorn.Server):
    """uvicorn with a graceful drain that ends the process with exit code 0.

    On SIGTERM or SIGINT the gateway marks itself draining at once (new generation
    requests get 503 ``shutting_down``, ``/health`` turns 503), then uvicorn's own
    shutdown closes the listening socket, closes idle connections and waits up to
    ``--drain-timeout-secs`` for in-flight responses. uvicorn would re-raise the signal
    after that, which kills the process with -15; a finished drain is a clean exit.
    """

    def __init__(self, config: uvicorn.Config, state: GatewayState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.state.draining:
            drain_s = self.config.timeout_graceful_shutdown
            log.info("signal %d: draining in-flight requests (at most %ss)", sig, drain_s)
        self.state.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in DRAIN_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def serve(config: GatewayConfig, log_level: str = "info") -> None:
    config = await resolved_backend(config)
    state = GatewayState(config)
    await state.start()
    sock = bind(config.host, config.port, reuse_port=config.processes > 1)
    port = sock.getsockname()[1]
    server = DrainingServer(
        uvicorn.Config(
            build_app(state),
            log_level=log_level,
            access_log=False,
            # uvicorn waits with asyncio.wait_for, which takes seconds as a float too.
            timeout_graceful_shutdown=config.drain_timeout_s,  # type: ignore[arg-type]
            lifespan="off",
        ),
        state,
    )
    original_startup = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original_startup(sockets=sockets)
        frozen = freeze_startup_heap()
        # Printed once the socket is listening: scripts and tests wait for this line.
        loop = type(asyncio.get_running_loop())
        address = join_host_port(config.host, port)
        log.info(
            "serving on http://%s (event loop %s.%s; %d startup objects frozen out of GC)",
            address,
            loop.__module__,
            loop.__qualname__,
            frozen,
        )
        print(f"TANDEM_GATEWAY_READY http://{address}", flush=True)

    # uvicorn offers no hook once its socket listens; wrapping its startup is the seam.
    server.startup = startup  # type: ignore[method-assign]
    try:
        await server.serve(sockets=[sock])
    finally:
        state.draining = True
        await state.stop()
