"""Fixtures for the media tests: a real loopback HTTP origin and an image factory."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from media_origin_server import (
    LoopbackOrigin,
    OriginServer,
    ServerState,
    make_image_bytes,
    start_origin,
)


@pytest.fixture(scope="module")
def _origin_server() -> Iterator[OriginServer]:
    server = start_origin()
    try:
        yield server
    finally:
        server.state.stop.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def origin(_origin_server: OriginServer) -> Iterator[LoopbackOrigin]:
    state = ServerState(png=_origin_server.state.png)
    _origin_server.state = state
    yield LoopbackOrigin(state=state, port=_origin_server.server_address[1])
    # Release handlers still sleeping or dripping for this test, and let them notice.
    state.stop.set()
    time.sleep(0.01)


@pytest.fixture
def make_image() -> Callable[..., bytes]:
    """Factory for small encoded test images: make_image(fmt, size, mode)."""
    return make_image_bytes
