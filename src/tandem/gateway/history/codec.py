"""The one JSON encoding of stored documents, so sizes and bytes agree across backends."""

from __future__ import annotations

import json
from typing import Any


def encoded(document: Any) -> bytes:
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (a request's JSON may spell "\ud800") has no UTF-8 form: escape
        # every non-ASCII character instead. Still valid JSON, decoding to the same strings,
        # and plain text that every backend (PostgreSQL text included) stores as it is.
        return json.dumps(document, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def decoded(data: bytes | str) -> Any:
    return json.loads(data)
