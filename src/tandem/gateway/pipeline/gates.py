"""The checks every route that costs CPU shares (generation and ``/tokenize``): admission,
the served model, the media stage's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from tandem.errors import make_error
from tandem.gateway.admission import Slot, rejected
from tandem.gateway.model import ModelHandle
from tandem.gateway.state import GatewayState

T = TypeVar("T")


class Declared(Protocol):
    @property
    def declared_length(self) -> int | None: ...


async def admit(state: GatewayState, inbound: Declared) -> Slot:
    """The admission every route that costs CPU takes (generation, ``/tokenize``): refused
    while draining or for a declared body over the limit, before the body is read or queued."""
    if state.draining:
        raise rejected("shutting_down", "the gateway is shutting down", "shutting_down")
    limit, declared = state.config.max_payload_size, inbound.declared_length
    if declared is not None and declared > limit:
        raise make_error("payload_too_large", f"request body is over {limit} bytes")
    return await state.admission.acquire(state.config.request_timeout_s)


async def served_model(state: GatewayState, name: str | None) -> ModelHandle:
    """The model the request names (None: whichever is served), or the 503/404 for it."""
    model = await state.ensure_model()
    if model is None:
        raise make_error("no_available_workers", "no worker is registered yet")
    if name is not None and name != model.model_id:
        raise make_error("model_not_found", f"model {name!r} is not served here", param="model")
    return model


async def media_in_time(timeout_s: float, work: Awaitable[T]) -> T:
    """The media stage within ``--request-timeout-secs`` (a 504 ``request_timeout`` after)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        raise make_error(
            "request_timeout", f"media not ready within --request-timeout-secs={timeout_s}"
        ) from None
