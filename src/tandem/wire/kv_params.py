"""``kv_transfer_params_json``: the opaque KV handoff object relayed between legs."""

from __future__ import annotations

import json
from typing import Any

from tandem.wire.proto import GenerateComplete, GenerateRequest

PREFILL_TAG: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False}


def parse_kv_transfer_params(text: str) -> dict[str, Any]:
    """Parse the JSON field; it must be a JSON object (ValueError otherwise)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"kv_transfer_params_json is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"kv_transfer_params_json must be a JSON object, got {type(value).__name__}"
        )
    return value


def request_kv_params(request: GenerateRequest) -> dict[str, Any] | None:
    """The request's KV params from either wire form, or None when it has none."""
    if request.HasField("kv_transfer_params_json") and request.kv_transfer_params_json:
        return parse_kv_transfer_params(request.kv_transfer_params_json)
    if request.HasField("kv_transfer_params"):
        legacy = request.kv_transfer_params
        if not legacy.remote_host or not 0 < legacy.remote_port < 65536:
            raise ValueError("kv_transfer_params needs a remote_host and a port in 1..65535")
        return {"remote_host": legacy.remote_host, "remote_port": legacy.remote_port}
    return None


def complete_kv_params_json(complete: GenerateComplete) -> str | None:
    """The Complete frame's KV params JSON; an empty string reads as absent."""
    if complete.HasField("kv_transfer_params_json") and complete.kv_transfer_params_json:
        return str(complete.kv_transfer_params_json)
    return None


def dumps_compact(params: dict[str, Any]) -> str:
    return json.dumps(params, separators=(",", ":"))
