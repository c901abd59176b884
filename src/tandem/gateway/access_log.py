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

log = logging.getLogger("tandem.gateway.access")

REQUEST_ID_HEADER = "x-request-id"


def new_request_id() -> str:
    return f"tandem-{uuid.uuid4().hex}"


@dataclass(slots=True)
class RequestRecord:
    """What the access line reports; the pipeline fills in what it learns on the way."""

    route: str
    enabled: bool = True  # --no-access-log: metrics only
    request_id: str = field(default_factory=new_request_id)
    started: float = field(default_factory=time.perf_counter)
    stream: bool = False
    images: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # "url" (aggregated) or "prefill=url" / "decode=url" of the legs that served it
    workers: list[str] = field(default_factory=list)
    _finished: bool = False

    def finish(self, status: int, code: str = "") -> None:
        """Count the request and write its line; only the first call counts."""
        if self._finished:
            return
        self._finished = True
        elapsed = time.perf_counter() - self.started
        metrics.REQUESTS.labels(self.route, str(status), code).inc()
        metrics.REQUEST_SECONDS.labels(self.route).observe(elapsed)
        if self.enabled and log.isEnabledFor(logging.INFO):
            log.info(
                "%s %d%s id=%s %.1fms stream=%s images=%d tokens=%d+%d workers=%s",
                self.route,
                status,
                f" {code}" if code else "",
                self.request_id,
                elapsed * 1000,
                "yes" if self.stream else "no",
                self.images,
                self.prompt_tokens,
                self.completion_tokens,
                ",".join(self.workers) or "-",
            )
