"""One log line and the request metrics per generation request, written when it ends.

The line carries the request id that the client gets back in ``x-request-id`` and that
the workers log for the same request ("Generate request tandem-…"), so one id follows a
request from the client through the gateway to every worker leg.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from tandem.gateway import metrics
from tandem.gateway.context import RequestContext
from tandem.gateway.types import Route

log = logging.getLogger("tandem.gateway.access")

REQUEST_ID_HEADER = "x-request-id"


def new_request_id() -> str:
    return f"tandem-{uuid.uuid4().hex}"


@dataclass(slots=True)
class RequestRecord:
    """A request from its arrival; its context, once built, tells the rest of the line."""

    route: Route
    enabled: bool = True  # --no-access-log: metrics only
    tenant: str | None = None  # named by the request's --tenant-api-key (gateway/auth.py)
    request_id: str = field(default_factory=new_request_id)
    started: float = field(default_factory=time.perf_counter)
    _finished: bool = False

    def finish(self, status: int, code: str = "", ctx: RequestContext | None = None) -> None:
        """Count the request and write its line; only the first call counts."""
        if self._finished:
            return
        self._finished = True
        elapsed = time.perf_counter() - self.started
        metrics.child(metrics.REQUESTS, self.route, str(status), code).inc()
        metrics.child(metrics.REQUEST_SECONDS, self.route).observe(elapsed)
        if not (self.enabled and log.isEnabledFor(logging.INFO)):
            return
        stream, images, prompt, completion, workers = False, 0, 0, 0, "-"
        if ctx is not None:
            stream, images, workers = ctx.stream, len(ctx.media_urls), ",".join(ctx.served_by)
            usage = ctx.usage
            prompt = usage.prompt_tokens if usage else len(ctx.prompt_ids)
            completion = usage.completion_tokens if usage else 0
        log.info(
            "%s %d%s id=%s %.1fms stream=%s images=%d tokens=%d+%d%s workers=%s",
            self.route,
            status,
            f" {code}" if code else "",
            self.request_id,
            elapsed * 1000,
            "yes" if stream else "no",
            images,
            prompt,
            completion,
            f" tenant={self.tenant}" if self.tenant else "",
            workers or "-",
        )
