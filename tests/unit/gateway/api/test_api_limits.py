"""Caps on what a request may ask the stop machinery to do: a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from tandem.errors import TandemError
from tandem.gateway.endpoints.chat.schema import (
    MAX_STOP_CHARS,
    MAX_STOP_TOKEN_IDS,
    parse_chat_request,
)
from tandem.gateway.endpoints.completions.schema import parse_completion_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize(
    "parse,base", [(parse_chat_request, CHAT), (parse_completion_request, COMPLETION)]
)
def test_stop_strings_are_capped_in_length(parse, base) -> None:
    assert parse(json.dumps({**base, "stop": ["x" * MAX_STOP_CHARS]})).stop == [
        "x" * MAX_STOP_CHARS
    ]
    for stop in ("y" * (MAX_STOP_CHARS + 1), ["ok", "z" * 100_000]):
        with pytest.raises(TandemError) as info:
            parse(json.dumps({**base, "stop": stop}))
        assert info.value.status == 400 and info.value.code == "invalid_request"
        assert (info.value.param or "").startswith("stop")


@pytest.mark.parametrize(
    "parse,base", [(parse_chat_request, CHAT), (parse_completion_request, COMPLETION)]
)
def test_stop_token_ids_are_capped_in_number(parse, base) -> None:
    ids = list(range(MAX_STOP_TOKEN_IDS))
    assert parse(json.dumps({**base, "stop_token_ids": ids})).stop_token_ids == ids
    with pytest.raises(TandemError) as info:
        parse(json.dumps({**base, "stop_token_ids": list(range(100_000))}))
    assert info.value.status == 400 and info.value.param == "stop_token_ids"
