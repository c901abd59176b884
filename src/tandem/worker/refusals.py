"""How a worker's failures become gRPC statuses, the same for every protocol's adapter.

- A request the worker cannot serve as sent (bad shape, bad tensors, refused media, a
  constraint that does not compile): INVALID_ARGUMENT with a readable message, and the
  catalogued error code (``tandem.errors.WORKER_ERROR_CODE_KEY``) where there is one.
- Transient trouble (media saturation, the compile pool full, a failed KV pull):
  UNAVAILABLE, which a gateway may retry elsewhere.
- A bug: INTERNAL, marked ``internal_error`` while planning so that the gateway does not
  retry it on another worker (and fetch the request's media again for nothing).

None of them stops the worker.
"""

from __future__ import annotations

import logging

import grpc

from tandem.engine.refusals import RefusedField
from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.media import MediaError
from tandem.worker.output_plan import CompilerSaturated

log = logging.getLogger("tandem.worker")

KV_PULL_FAILED = "could not pull KV from the prefill worker"


class RequestRefused(Exception):
    """``code``: the catalogued client error behind the refusal, sent in trailing metadata."""

    def __init__(self, status: grpc.StatusCode, message: str, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((WORKER_ERROR_CODE_KEY, self.code),) if self.code else ()


class KvImportError(Exception):
    """Pulling the prompt's KV from the prefill worker failed (retryable elsewhere)."""


def planning_refusal(exc: Exception, rid: str) -> RequestRefused:
    """What a failure while planning a request (before the engine runs it) answers."""
    if isinstance(exc, RequestRefused):
        return exc
    if isinstance(exc, ValueError | MediaError | CompilerSaturated):
        retry = isinstance(exc, MediaError | CompilerSaturated) and exc.retryable
        status = grpc.StatusCode.UNAVAILABLE if retry else grpc.StatusCode.INVALID_ARGUMENT
        code = exc.code if isinstance(exc, MediaError | RefusedField) else ""
        return RequestRefused(status, str(exc), code)
    if isinstance(exc, KvImportError):
        log.warning("request %s: KV import failed: %s", rid, exc)
        return RequestRefused(grpc.StatusCode.UNAVAILABLE, f"{KV_PULL_FAILED}: {exc}")
    log.error("request %s: planning failed", rid, exc_info=exc)
    return RequestRefused(
        grpc.StatusCode.INTERNAL,
        f"worker failure while planning the request: {type(exc).__name__}",
        "internal_error",
    )


def generation_refusal(exc: Exception, rid: str) -> RequestRefused:
    """What a failure while the engine runs a request answers: a ``ValueError`` (a request
    the engine refused, e.g. media that do not fit the prompt) is INVALID_ARGUMENT, anything
    else INTERNAL."""
    if isinstance(exc, ValueError):
        code = exc.code if isinstance(exc, RefusedField) else ""
        return RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, str(exc), code)
    log.error("request %s failed", rid, exc_info=exc)
    return RequestRefused(grpc.StatusCode.INTERNAL, f"engine failure: {exc}")
