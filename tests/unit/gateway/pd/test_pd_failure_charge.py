"""A PD failure is charged to the circuit breaker of the worker at fault, read from a
typed field of the error, never from a substring of its code."""

from __future__ import annotations

import grpc
import pytest

from tandem.errors import error_from_grpc, make_error
from tandem.gateway.pd.dispatcher import charge_failure
from tandem.gateway.pd.selection import Pair
from tandem.gateway.workers.worker import Worker


def pair() -> Pair:
    def settle(ok: bool) -> None:
        return None

    prefill = Worker("127.0.0.1:1", "prefill", {}, "m")
    decode = Worker("127.0.0.1:2", "decode", {}, "m")
    return Pair(prefill, decode, settle, settle)


@pytest.mark.parametrize(
    "code,leg",
    [
        ("pd_decode_missing_kv_transfer_params", "prefill"),  # "decode" in its name
        ("prefill_worker_failed_to_start", "prefill"),
        ("prefill_stream_error", "prefill"),
        ("decode_worker_failed_to_start", "decode"),
        ("decode_stream_error", "decode"),
    ],
)
def test_the_leg_at_fault_is_charged(code: str, leg: str) -> None:
    chosen = pair()
    charge_failure(chosen, make_error(code, "x"))
    failures = {
        "prefill": chosen.prefill.breaker.consecutive_failures,
        "decode": chosen.decode.breaker.consecutive_failures,
    }
    assert failures == {leg: 1, ("decode" if leg == "prefill" else "prefill"): 0}


def test_mapped_grpc_failures_keep_their_leg() -> None:
    err = error_from_grpc("prefill_worker_failed_to_start", grpc.StatusCode.UNAVAILABLE, "down")
    assert err.leg == "prefill" and err.status == 503


@pytest.mark.parametrize("code", ["no_available_workers", "request_timeout", "internal_error"])
def test_failures_of_no_leg_charge_nobody(code: str) -> None:
    chosen = pair()
    charge_failure(chosen, make_error(code, "x"))
    assert chosen.prefill.breaker.consecutive_failures == 0
    assert chosen.decode.breaker.consecutive_failures == 0
