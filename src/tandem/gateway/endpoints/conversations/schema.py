"""The bodies and query strings of the Conversations API: what is honoured, what refused.

Items are the Responses API's input items (``responses/input_models.py``), validated by
the same models and stored in the same normalized form, so a conversation's items read
back into a turn exactly as a ``previous_response_id`` chain's do. Metadata is bounded as
OpenAI bounds it (``responses/request.py``, :func:`check_metadata`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tandem.ascii_int import ascii_int
from tandem.errors import make_error
from tandem.gateway.endpoints.common.messages import without_nulls
from tandem.gateway.endpoints.common.validation_errors import validation_error
from tandem.gateway.endpoints.responses.input_models import InputItem
from tandem.gateway.endpoints.responses.request import check_metadata

# OpenAI takes up to 20 items in one create or add.
MAX_ITEMS_PER_CALL = 20
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 20
# What ``include`` may name: both are in every stored item already (logprobs are kept on
# the output text a turn asked them for; images are kept as the client sent them).
HONOURED_INCLUDES = ("message.output_text.logprobs", "message.input_image.image_url")

_STRICT_FORBID = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class _Body(BaseModel):
    model_config = _STRICT_FORBID

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        return without_nulls(cls, data) if isinstance(data, dict) else data


class CreateConversation(_Body):
    metadata: dict[str, str] | None = None
    items: list[InputItem] | None = Field(None, max_length=MAX_ITEMS_PER_CALL)
    safety_identifier: str | None = None  # for abuse monitoring elsewhere; nothing to do here


class UpdateConversation(_Body):
    # Required, as OpenAI's; null (dropped to the default here) clears it.
    metadata: dict[str, str] | None


class AddItems(_Body):
    items: list[InputItem] = Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)


def parse_body(model: type[_Body], body: bytes) -> Any:
    try:
        parsed = model.model_validate_json(body or b"{}")
    except ValidationError as exc:
        fields = model.model_fields

        def unsupported(param: str) -> bool:  # a field OpenAI has and Tandem does not
            return param.split(".", 1)[0] not in fields

        raise validation_error(exc, unsupported=unsupported) from None
    check_metadata(getattr(parsed, "metadata", None) or {})
    return parsed


@dataclass(frozen=True, slots=True)
class ListQuery:
    limit: int
    order: Literal["asc", "desc"]
    after: str | None


def _check_include(query: Mapping[str, Any]) -> None:
    getlist = getattr(query, "getlist", None)
    for key in ("include", "include[]"):
        values = getlist(key) if getlist is not None else [query.get(key)]
        for value in values:
            if value is not None and value not in HONOURED_INCLUDES:
                raise make_error(
                    "unsupported_parameter",
                    f"include {value!r} is not supported (only {', '.join(HONOURED_INCLUDES)})",
                    param="include",
                )


def _refuse_unknown(query: Mapping[str, Any], known: tuple[str, ...]) -> None:
    for key in query:
        if key not in known and key not in ("include", "include[]"):
            raise make_error(
                "unsupported_parameter", f"query parameter '{key}' is not supported", param=key
            )


def item_query(query: Mapping[str, Any]) -> None:
    """Adding or retrieving items: ``include`` only."""
    _refuse_unknown(query, ())
    _check_include(query)


def list_query(query: Mapping[str, Any]) -> ListQuery:
    _refuse_unknown(query, ("limit", "order", "after"))
    _check_include(query)
    raw_limit = query.get("limit")
    limit = DEFAULT_LIST_LIMIT if raw_limit is None else ascii_int(raw_limit)
    if limit is None or not 1 <= limit <= MAX_LIST_LIMIT:
        raise make_error(
            "invalid_request", f"limit must be an integer from 1 to {MAX_LIST_LIMIT}", param="limit"
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise make_error("invalid_request", "order must be 'asc' or 'desc'", param="order")
    return ListQuery(limit, order, query.get("after"))
