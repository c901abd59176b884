"""The one mapping from a pydantic ``ValidationError`` to a coded 400, for every endpoint.

The first error wins (pydantic reports them in field order). Endpoints differ only in how
a field is named to the client and in which failures mean "valid, but not honoured here"
(``unsupported_parameter`` rather than ``invalid_request``); they say so through the hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from tandem.errors import TandemError, make_error
from tandem.gateway.endpoints.common.messages import INVALID, UNSUPPORTED_PART


def error_param(loc: tuple[int | str, ...]) -> str | None:
    """Dotted path of a pydantic error location, without the ``~`` union tags."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and p.startswith("~"))]
    return ".".join(parts) or None


def _never(param: str) -> bool:
    return False


def validation_error(
    exc: ValidationError,
    *,
    rename: Callable[[str], str] = str,
    unsupported: Callable[[str], bool] = _never,
    part_code: Callable[[str], str] = lambda param: "unsupported_content_part",
) -> TandemError:
    """``rename``: a field's name as the client wrote it; ``unsupported``: fields whose only
    failure is a value Tandem does not honour; ``part_code``: the code of a refused part."""
    first = exc.errors(include_url=False, include_input=False)[0]
    kind, msg = first["type"], first["msg"]
    found = error_param(first["loc"])
    param = rename(found) if found is not None else None
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", msg)
        return make_error("invalid_request", f"request body is not valid JSON: {detail}")
    if param is None and kind == "model_type":
        return make_error("invalid_request", "request body must be a JSON object")
    if kind == UNSUPPORTED_PART:
        return make_error(part_code(param or ""), msg, param=param)
    if kind == INVALID:
        return make_error("invalid_request", msg, param=param)
    if kind == "missing":
        return make_error("invalid_request", f"'{param}' is required", param=param)
    if param is not None and unsupported(param):
        return make_error("unsupported_parameter", f"'{param}': {msg}", param=param)
    where = f"'{param}'" if param else "request body"
    return make_error("invalid_request", f"invalid {where}: {msg}", param=param)


_Model = TypeVar("_Model", bound=BaseModel)


def parse_json(model: type[_Model], body: bytes | str) -> _Model:
    """``body`` validated as ``model``; any failure is the coded 400 of :func:`validation_error`."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        # from None: the pydantic chain is noise in logs; the message carries what matters.
        raise validation_error(exc) from None
