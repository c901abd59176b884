"""Dispatch: from a prepared request to an opened worker stream.

``Dispatcher`` is the seam between the pipeline and the workers: the aggregated
dispatcher (``aggregated.py``) and the PD dispatcher (``tandem.gateway.pd``) implement
it, share the worker-call helpers (``streams.py``, ``selection.py``) and one retry loop
(``retry.py``). Tests plug in scripted dispatchers, or fake worker clients through the
registry's ``client_factory``.
"""

from __future__ import annotations

from typing import Protocol

from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.streams import OpenedStream


class Dispatcher(Protocol):
    async def open(self, ctx: RequestContext) -> OpenedStream:
        """Open the request's worker stream(s); the first frame has arrived on return."""
        ...
