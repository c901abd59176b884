"""Run the gateway: connect the workers, load the model files, serve HTTP with uvicorn."""

from __future__ import annotations

import logging
import socket

import uvicorn

from tandem.gateway.app import build_app
from tandem.gateway.config import GatewayConfig
from tandem.gateway.state import GatewayState

log = logging.getLogger("tandem.gateway")


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


async def serve(config: GatewayConfig, log_level: str = "info") -> None:
    state = GatewayState(config)
    await state.start()
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(state),
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=30,
            lifespan="off",
        )
    )
    original_startup = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original_startup(sockets=sockets)
        # Printed once the socket is listening: scripts and tests wait for this line.
        print(f"TANDEM_GATEWAY_READY http://{config.host}:{port}", flush=True)

    server.startup = startup  # type: ignore[method-assign]
    try:
        await server.serve(sockets=[sock])
    finally:
        state.draining = True
        await state.stop()
