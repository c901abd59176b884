"""Request fields Tandem knows but cannot honour yet: refused with a 400 naming the field.

The request models ignore unknown fields (SDKs and other gateways send extras). A field
that changes the answer is different: accepting ``response_format`` or ``tools`` and then
ignoring it returns a 200 the client believes. Such fields are refused here, before
anything else happens, unless they carry their do-nothing value; each entry goes away when
the feature arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tandem.errors import TandemError, make_error


def _empty(value: Any) -> bool:
    return value is None or value == [] or value == {} or value is False


def _text_format(value: Any) -> bool:
    return _empty(value) or (isinstance(value, Mapping) and value.get("type") == "text")


def _no_tool_choice(value: Any) -> bool:
    return value is None or value == "none"


def _text_modalities(value: Any) -> bool:
    return value is None or value == ["text"]


# field -> (accepted when, what to tell the client); shared by both routes unless listed
# under one of them.
_Rule = tuple[Callable[[Any], bool], str]
_COMMON: dict[str, _Rule] = {
    "response_format": (_text_format, "structured outputs (response_format) are not supported yet"),
    "structured_outputs": (_empty, "structured outputs are not supported yet"),
    "guided_json": (_empty, "guided decoding is not supported yet"),
    "guided_regex": (_empty, "guided decoding is not supported yet"),
    "guided_choice": (_empty, "guided decoding is not supported yet"),
    "guided_grammar": (_empty, "guided decoding is not supported yet"),
    "prompt_logprobs": (_empty, "prompt logprobs are not supported yet"),
}
_CHAT: dict[str, _Rule] = {
    "tools": (_empty, "tool calling is not supported yet"),
    "tool_choice": (_no_tool_choice, "tool calling is not supported yet"),
    "functions": (_empty, "function calling is not supported yet"),
    "function_call": (_no_tool_choice, "function calling is not supported yet"),
    "reasoning_effort": (_empty, "reasoning controls are not supported by this model"),
    "modalities": (_text_modalities, "only text output is supported"),
    "audio": (_empty, "audio output is not supported"),
    "prediction": (_empty, "predicted outputs are not supported"),
    "web_search_options": (_empty, "web search is not supported"),
    "store": (_empty, "storing chat completions is not supported"),
}


def refuse_unhonoured(data: Any, chat: bool) -> None:
    """Raise 400 ``unsupported_parameter`` for the first field that would be ignored."""
    if not isinstance(data, Mapping):
        return
    for rules in (_COMMON, _CHAT) if chat else (_COMMON,):
        for name, (accepted, why) in rules.items():
            if name in data and not accepted(data[name]):
                raise _refusal(name, why)


def _refusal(name: str, why: str) -> TandemError:
    return make_error("unsupported_parameter", f"{why}: remove '{name}'", param=name)
