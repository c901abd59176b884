"""Tandem's error model: one exception tree, stable codes, one gRPC→HTTP mapping.

Every failure a client can see is a :class:`TandemError` carrying a stable
``code`` (machine-readable, documented in :data:`ERROR_CATALOGUE`), an HTTP
status, and whether a retry on a freshly selected worker may succeed::

    TandemError                    code, status, retryable, message, param
    ├── ClientError                4xx: the request itself is wrong; never retried
    │   ├── BadRequest             400  (invalid_request, multimodal_*, pd_decode_…)
    │   ├── Unauthorized           401  (invalid_api_key)
    │   ├── Forbidden              403  (permission_denied, admin_api_disabled)
    │   ├── NotFound               404  (model_not_found, worker_not_found)
    │   ├── PayloadTooLarge        413  (payload_too_large, multimodal_payload_too_large)
    │   └── RateLimited            429  (multimodal_inflight_budget, too_many_requests)  retryable
    └── ServerError                5xx: something behind the gateway failed
        ├── InternalError          500  (internal_error, …)
        ├── UpstreamError          502  (pd_decode_missing_kv_transfer_params, …)
        ├── Unavailable            503  (no_available_workers, …)  retryable unless marked
        └── GatewayTimeout         504  (request_timeout)  retryable

Worker failures arrive as gRPC statuses; :func:`error_from_grpc` is the single
place that turns one into a ``TandemError`` (status table: docs/pd-contract.md §17),
and :func:`openai_error_body` renders any error as the OpenAI error JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

import grpc

# Statuses a retry on another worker may fix (docs/pd-contract.md §14).
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


# The PD leg whose worker a failure is charged to (its circuit breaker, its error metric).
Leg = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int
    retryable: bool
    meaning: str
    leg: Leg | None = None  # set for failures that are one PD leg's worker's fault


# Every stable code the gateway or worker emits. Codes never change meaning;
# new failures get new codes. The README's error table is generated from this.
ERROR_CATALOGUE: dict[str, ErrorSpec] = {
    # --- request shape -------------------------------------------------------
    "invalid_request": ErrorSpec(400, False, "malformed JSON, wrong field type or value"),
    "unsupported_content_part": ErrorSpec(400, False, "a content part type Tandem does not know"),
    "unsupported_parameter": ErrorSpec(
        400, False, "a request field Tandem cannot honour yet (never silently ignored)"
    ),
    "invalid_structured_output": ErrorSpec(
        400, False, "a JSON schema, regex, grammar or choice list that cannot constrain decoding"
    ),
    "model_not_found": ErrorSpec(404, False, "no worker serves the requested model"),
    "not_found": ErrorSpec(404, False, "unknown route"),
    "worker_not_found": ErrorSpec(404, False, "admin API: no such worker"),
    "response_not_found": ErrorSpec(404, False, "no stored response with that id for this key"),
    "conversation_not_found": ErrorSpec(
        404, False, "no conversation (or conversation item) with that id for this key"
    ),
    # --- access control (gateway/auth.py) --------------------------------------------
    "invalid_api_key": ErrorSpec(401, False, "missing or wrong API key (serving or admin API)"),
    "permission_denied": ErrorSpec(403, False, "admin API: a user-role key on a write"),
    "admin_api_disabled": ErrorSpec(
        403, False, "admin API without --control-plane-api-keys: loopback gateway and client only"
    ),
    "admin_api_multiprocess": ErrorSpec(
        409, False, "admin API: adding or removing workers under --processes > 1 (one process only)"
    ),
    "worker_unreachable": ErrorSpec(
        502, False, "admin API: the worker did not answer registration (details in the log)"
    ),
    "model_files_unavailable": ErrorSpec(
        503, False, "the model's tokenizer, template or processor could not be loaded"
    ),
    "payload_too_large": ErrorSpec(413, False, "request body above --max-payload-size"),
    # --- multimodal ------------------------------------------------------------
    "invalid_multimodal_request": ErrorSpec(400, False, "the model does not take media"),
    "multimodal_prompt_contract_mismatch": ErrorSpec(
        400, False, "image anchors in the prompt do not match the number of images"
    ),
    "multimodal_processing_failed": ErrorSpec(400, False, "media could not be fetched or decoded"),
    "multimodal_not_supported": ErrorSpec(400, False, "a modality or path the workers cannot take"),
    "runtime_pd_not_supported": ErrorSpec(
        400, False, "a PD pair over a worker protocol with no PD pairing (TensorRT-LLM, MLX)"
    ),
    "multimodal_too_many_items": ErrorSpec(
        400,
        False,
        "more images (videos) than --mm-per-request-image-limit (-video-limit), or items than "
        "a worker's --mm-max-items",
    ),
    "media_url_refused": ErrorSpec(400, False, "media URL scheme, host or path not allowed"),
    "media_too_large": ErrorSpec(400, False, "a media item above the byte cap"),
    "media_ref_too_large": ErrorSpec(400, False, "a data URL above the cap on the worker path"),
    "media_ref_scheme_not_accepted": ErrorSpec(400, False, "URL scheme outside the legs' schemes"),
    "multimodal_hint_unsupported_in_worker_mode": ErrorSpec(
        400, False, "worker mode and a per-image hint"
    ),
    "multimodal_worker_processing_unsupported_model": ErrorSpec(
        400, False, "worker mode for a model whose placeholders workers cannot expand"
    ),
    "no_media_ref_capable_worker": ErrorSpec(503, False, "no worker of a leg accepts media_refs"),
    "multimodal_payload_too_large": ErrorSpec(413, False, "media above the in-flight budget"),
    "multimodal_inflight_budget": ErrorSpec(429, True, "in-flight media bytes at the limit"),
    "multimodal_pool_process_died": ErrorSpec(
        500, False, "an image pool process (--mm-workers) died while processing the images"
    ),
    # --- prefill/decode ----------------------------------------------------------
    "pd_decode_language_model_only_mrope": ErrorSpec(
        400, False, "decode worker has no vision encoder and the model needs M-RoPE grids"
    ),
    "pd_decode_language_model_only_media_refs": ErrorSpec(
        400, False, "decode worker has no vision encoder and the media are worker-side refs"
    ),
    "pd_decode_language_model_only_n_samples": ErrorSpec(
        400, False, "decode worker has no vision encoder and an image request asks n > 1"
    ),
    # The prefill answered without the KV handoff it was asked for: its worker's fault.
    "pd_decode_missing_kv_transfer_params": ErrorSpec(
        502, False, "an image decode leg without pixels got no KV handoff from prefill", "prefill"
    ),
    "prefill_worker_failed_to_start": ErrorSpec(
        500, True, "prefill Generate call failed", "prefill"
    ),
    "decode_worker_failed_to_start": ErrorSpec(500, True, "decode Generate call failed", "decode"),
    "prefill_stream_error": ErrorSpec(500, True, "prefill stream failed while draining", "prefill"),
    "decode_stream_error": ErrorSpec(500, True, "decode stream failed mid-generation", "decode"),
    "worker_error": ErrorSpec(500, True, "a worker call failed (aggregated mode)"),
    "encode_worker_failed": ErrorSpec(
        502, True, "E/P/D: no encode worker accepted an image's Encode (down or refused)"
    ),
    "no_available_encode_workers": ErrorSpec(503, True, "E/P/D: no healthy encode worker"),
    "no_compatible_pd_pair": ErrorSpec(503, True, "no prefill/decode pair can serve this"),
    "no_available_workers": ErrorSpec(503, True, "no healthy worker for the model"),
    # --- gateway itself --------------------------------------------------------------
    "request_timeout": ErrorSpec(504, True, "request exceeded --request-timeout-secs"),
    "too_many_requests": ErrorSpec(
        429, True, "--max-concurrent-requests running and --max-queued-requests waiting"
    ),
    "shutting_down": ErrorSpec(503, True, "gateway is draining"),
    "history_unavailable": ErrorSpec(503, True, "the stored-responses database failed"),
    "internal_error": ErrorSpec(500, False, "a bug: report it with the request id"),
}


class TandemError(Exception):
    """Base of every client-visible error. Prefer the category subclasses."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retryable: bool | None = None,
        param: str | None = None,
        retry_after: int | None = None,
        leg: Leg | None = None,
    ) -> None:
        spec = ERROR_CATALOGUE.get(code)
        self.code = code
        self.message = message
        self.status = status if status is not None else (spec.status if spec else 500)
        if retryable is None:
            retryable = spec.retryable if spec else self.status in RETRYABLE_STATUSES
        self.retryable = retryable
        self.param = param
        # Which PD leg's worker failed, if any: decides whose circuit breaker counts it.
        self.leg = leg if leg is not None else (spec.leg if spec else None)
        # Seconds for a ``Retry-After`` header (load shedding: 429, 503 while draining).
        self.retry_after = retry_after
        super().__init__(message)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status}, {self.message!r})"


class ClientError(TandemError):
    """The request is wrong; retrying it unchanged cannot help."""


class BadRequest(ClientError):
    pass


class Unauthorized(ClientError):
    pass


class Forbidden(ClientError):
    pass


class NotFound(ClientError):
    pass


class PayloadTooLarge(ClientError):
    pass


class RateLimited(ClientError):
    pass


class ServerError(TandemError):
    """Something behind the gateway failed."""


class InternalError(ServerError):
    pass


class UpstreamError(ServerError):
    pass


class Unavailable(ServerError):
    pass


class GatewayTimeout(ServerError):
    pass


_CLASS_BY_STATUS: dict[int, type[TandemError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    413: PayloadTooLarge,
    429: RateLimited,
    500: InternalError,
    502: UpstreamError,
    503: Unavailable,
    504: GatewayTimeout,
}


def make_error(code: str, message: str, **overrides: Any) -> TandemError:
    """Build the error for a catalogued ``code`` as the subclass its status implies."""
    status = overrides.get("status") or ERROR_CATALOGUE[code].status
    cls = _CLASS_BY_STATUS.get(status) or (ClientError if status < 500 else ServerError)
    return cls(code, message, **overrides)


# How a worker's gRPC status reads as an HTTP status (docs/pd-contract.md §17).
_GRPC_TO_HTTP: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.CANCELLED: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}


def grpc_status_to_http(code: grpc.StatusCode) -> int:
    return _GRPC_TO_HTTP.get(code, 500)


# Trailing-metadata key under which a Tandem worker names the client error it refused a
# request with (e.g. ``media_too_large`` on the media_refs path). Other workers never send
# it; the gateway then answers with the leg's own code (docs/pd-contract.md §17).
WORKER_ERROR_CODE_KEY = "tandem-error-code"


# A vLLM servicer starts some UNAVAILABLE messages with a reason token ("sidecar_timeout:
# …", "sidecar_overloaded: …"). The only one that must not be retried: the worker already
# waited its full media-processing budget, so another try would wait again.
_NOT_RETRIED_REASONS = frozenset({"sidecar_timeout"})
_REASON = re.compile(r"[a-z][a-z_]*(?=$|[:\s])")


def worker_reason(details: str) -> str | None:
    """The reason token a worker's message starts with (``"sidecar_timeout"``), if any."""
    match = _REASON.match(details)
    return match.group(0) if match else None


# gRPC core's own words for a connection that broke (a worker killed, a reset, a proxy
# dropping it): not a worker's message, so the client gets ours instead (issue 38).
_TRANSPORT_WORDS = (
    "socket closed",
    "stream removed",
    "connection reset",
    "connection refused",
    "broken pipe",
    "failed to connect",
    "goaway",
    "keepalive",
    "end of tcp stream",
)


# What gRPC core says when the caller's own deadline passed (the gateway's, from
# --request-timeout-secs), before or during a stream, as opposed to a worker that answered
# DEADLINE_EXCEEDED with words of its own.
_LOCAL_DEADLINE_DETAILS = ("", "deadline exceeded", "stream removed (deadline exceeded)")


def local_deadline(status: grpc.StatusCode, details: str | None) -> bool:
    """The gateway's deadline for the call passed: gRPC core's words, not the worker's."""
    return status == grpc.StatusCode.DEADLINE_EXCEEDED and (
        (details or "").strip().lower() in _LOCAL_DEADLINE_DETAILS
    )


def transport_failure(status: grpc.StatusCode, details: str | None) -> bool:
    """A broken connection, as gRPC reports it, rather than an answer from the worker."""
    if status not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN):
        return False
    text = (details or "").lower()
    return any(words in text for words in _TRANSPORT_WORDS)


def error_from_grpc(
    code: str, status: grpc.StatusCode, details: str | None, worker_code: str | None = None
) -> TandemError:
    """Turn a worker's gRPC failure into the gateway error ``code`` with a mapped status.

    ``worker_code`` (from :data:`WORKER_ERROR_CODE_KEY`) replaces ``code`` when it is a
    catalogued client error and the status maps to a client error too: the same bad image
    then gets the same code, and that code's status (e.g. 413 for a request above the
    worker's decoded-image budget), whether the gateway or the worker processed it. A 503 whose
    message starts with ``sidecar_timeout`` is not retried: the worker already waited its
    full budget, so another try would wait again; nor is a failure whose ``worker_code``
    is catalogued as not retryable (a worker bug reported as ``internal_error``).
    """
    http = grpc_status_to_http(status)
    spec = ERROR_CATALOGUE.get(worker_code or "")
    if spec is not None and spec.status < 500 and http < 500:
        code, http = str(worker_code), spec.status
    text = details or status.name
    if worker_code is None and transport_failure(status, details):
        # The raw words go to the gateway's log (the caller's), not to the client.
        text = f"the connection to the worker was lost ({status.name})"
    elif worker_code is None and local_deadline(status, details):
        text = "the worker did not finish within the request's deadline (--request-timeout-secs)"
    retryable = http in RETRYABLE_STATUSES and worker_reason(text) not in _NOT_RETRIED_REASONS
    if spec is not None and not spec.retryable:
        retryable = False  # the worker says why, and a retry elsewhere cannot help
    cls = _CLASS_BY_STATUS.get(http) or (ClientError if http < 500 else ServerError)
    return cls(code, text, status=http, retryable=retryable)


def openai_error_type(status: int) -> str:
    """The OpenAI ``error.type`` for a status (the SDK maps statuses, not types)."""
    if status == 400 or status == 413 or status == 409:
        return "invalid_request_error"
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error"


def openai_error_body(err: TandemError) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` as OpenAI clients expect."""
    return {
        "error": {
            "message": err.message,
            "type": openai_error_type(err.status),
            "param": err.param,
            "code": err.code,
        }
    }


def reason_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
