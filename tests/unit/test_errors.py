"""Error model: catalogue, categories, gRPC→HTTP mapping, OpenAI body."""

from __future__ import annotations

import grpc
import pytest

from tandem.errors import (
    ERROR_CATALOGUE,
    BadRequest,
    ClientError,
    ServerError,
    UpstreamError,
    error_from_grpc,
    grpc_status_to_http,
    make_error,
    openai_error_body,
)


@pytest.mark.parametrize(
    ("status", "http"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.FAILED_PRECONDITION, 400),
        (grpc.StatusCode.OUT_OF_RANGE, 400),
        (grpc.StatusCode.CANCELLED, 400),
        (grpc.StatusCode.UNAUTHENTICATED, 401),
        (grpc.StatusCode.PERMISSION_DENIED, 403),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.ALREADY_EXISTS, 409),
        (grpc.StatusCode.ABORTED, 409),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.UNIMPLEMENTED, 501),
        (grpc.StatusCode.INTERNAL, 500),
        (grpc.StatusCode.UNKNOWN, 500),
        (grpc.StatusCode.DATA_LOSS, 500),
    ],
)
def test_grpc_status_mapping(status: grpc.StatusCode, http: int) -> None:
    assert grpc_status_to_http(status) == http


def test_worker_failure_keeps_mapped_status_and_retry_rule() -> None:
    bad = error_from_grpc("decode_worker_failed_to_start", grpc.StatusCode.INVALID_ARGUMENT, "x")
    assert isinstance(bad, BadRequest) and bad.status == 400 and not bad.retryable
    down = error_from_grpc("prefill_worker_failed_to_start", grpc.StatusCode.UNAVAILABLE, "busy")
    assert down.status == 503 and down.retryable and isinstance(down, ServerError)
    sidecar = error_from_grpc(
        "prefill_worker_failed_to_start", grpc.StatusCode.UNAVAILABLE, "sidecar_timeout after 5s"
    )
    assert sidecar.status == 503 and not sidecar.retryable


def test_a_workers_client_error_code_replaces_the_legs_code_only_when_it_fits() -> None:
    invalid, unavailable = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE
    leg = "prefill_worker_failed_to_start"
    named = error_from_grpc(leg, invalid, "image too big", "media_too_large")
    assert (named.code, named.status) == ("media_too_large", 400)
    # Unknown codes, server-side codes and a status that maps to 5xx keep the leg's code.
    assert error_from_grpc(leg, invalid, "x", "no_such_code").code == leg
    assert error_from_grpc(leg, invalid, "x", "internal_error").code == leg
    assert error_from_grpc(leg, unavailable, "x", "media_too_large").code == leg
    assert error_from_grpc(leg, invalid, "x", None).code == leg


def test_catalogue_codes_build_their_category() -> None:
    err = make_error("pd_decode_missing_kv_transfer_params", "no params")
    assert isinstance(err, UpstreamError) and err.status == 502 and not err.retryable
    lmo = make_error("pd_decode_language_model_only_mrope", "grids")
    assert isinstance(lmo, ClientError) and lmo.status == 400 and not lmo.retryable
    budget = make_error("multimodal_inflight_budget", "full")
    assert budget.status == 429 and budget.retryable


def test_every_catalogued_code_is_consistent() -> None:
    for code, spec in ERROR_CATALOGUE.items():
        err = make_error(code, "m")
        assert err.status == spec.status, code
        assert err.retryable == spec.retryable, code
        # Client errors are never retried, except 429 (back off and retry).
        if spec.status < 500 and spec.status != 429:
            assert not spec.retryable, code


def test_openai_body_shape() -> None:
    body = openai_error_body(make_error("invalid_request", "bad 'n'", param="n"))
    assert body == {
        "error": {
            "message": "bad 'n'",
            "type": "invalid_request_error",
            "param": "n",
            "code": "invalid_request",
        }
    }
    assert openai_error_body(make_error("no_available_workers", "none"))["error"]["type"] == (
        "server_error"
    )


def test_the_retry_rule_reads_the_workers_reason_token() -> None:
    from tandem.errors import worker_reason

    assert worker_reason("sidecar_timeout: waited 30 s") == "sidecar_timeout"
    assert worker_reason("sidecar_overloaded: 64 waiting") == "sidecar_overloaded"
    assert worker_reason("Deadline Exceeded") is None
    # A token that only starts like one is another reason: retried as any 503.
    late = error_from_grpc("worker_error", grpc.StatusCode.UNAVAILABLE, "sidecar_timeouts: x")
    assert late.retryable


@pytest.mark.parametrize(
    "details",
    ["Stream removed (Socket closed)", "Socket closed", "failed to connect to all addresses"],
)
def test_a_broken_connection_reads_as_ours_not_grpcs(details: str) -> None:
    """Issue 38: a worker killed mid-stream is a coded error in Tandem's words."""
    err = error_from_grpc("decode_stream_error", grpc.StatusCode.UNAVAILABLE, details)
    assert (err.code, err.status, err.retryable) == ("decode_stream_error", 503, True)
    assert err.message == "the connection to the worker was lost (UNAVAILABLE)"
    assert details.lower() not in err.message.lower()


def test_the_gateways_own_deadline_reads_as_ours() -> None:
    """Issue 38: a leg cut by the request's deadline says so, not gRPC's "Deadline Exceeded";
    a worker that answered DEADLINE_EXCEEDED with words of its own keeps them."""
    err = error_from_grpc(
        "decode_stream_error", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
    )
    assert (err.code, err.status) == ("decode_stream_error", 504)
    assert "--request-timeout-secs" in err.message and "Deadline Exceeded" not in err.message
    own = error_from_grpc("worker_error", grpc.StatusCode.DEADLINE_EXCEEDED, "queue wait 30 s")
    assert own.message == "queue wait 30 s"


def test_a_workers_own_message_is_kept() -> None:
    saturated = error_from_grpc("worker_error", grpc.StatusCode.UNAVAILABLE, "worker is saturated")
    assert saturated.message == "worker is saturated"
    # The same words from a worker that named its code are the worker's, not the transport's.
    named = error_from_grpc(
        "worker_error", grpc.StatusCode.UNAVAILABLE, "socket closed", "internal_error"
    )
    assert named.message == "socket closed"
    invalid = error_from_grpc("worker_error", grpc.StatusCode.INVALID_ARGUMENT, "Socket closed")
    assert invalid.message == "Socket closed"  # only UNAVAILABLE and UNKNOWN are transport
