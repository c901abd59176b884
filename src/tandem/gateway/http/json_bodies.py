"""JSON bodies on the wire: compact UTF-8, and OpenAI's error JSON with its status."""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any

from starlette.responses import Response

from tandem.errors import TandemError, openai_error_body

# ensure_ascii=False keeps CJK text at 3 bytes a character instead of 6. Validated
# request strings and tokenizer output hold no lone surrogates, so UTF-8 cannot fail.
# Built once: json.dumps with any argument builds a new encoder per call, a fifth of the
# cost of a streamed chunk's JSON.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def json_bytes(obj: Any) -> bytes:
    return _ENCODE(obj).encode("utf-8")


def json_string_bytes(text: str) -> bytes:
    """``text`` as a JSON string literal, quotes included, exactly as :func:`json_bytes`
    writes a string inside a value."""
    return encode_basestring(text).encode("utf-8")


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(json_bytes(obj), status_code=status, media_type="application/json")


def error_response(err: TandemError) -> Response:
    """The OpenAI error JSON with the error's HTTP status."""
    return json_response(openai_error_body(err), status=err.status)
