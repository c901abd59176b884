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


def _no_tool_choice(value: Any) -> bool:
    return value is None or value == "none"


def _text_modalities(value: Any) -> bool:
    return value is None or value == ["text"]


def _default_true(value: Any) -> bool:
    return value is None or value is True


def _one(value: Any) -> bool:
    return value is None or value == 1 or value == 1.0


# field -> (accepted when, what to tell the client); shared by both routes unless listed
# under one of them.
_Rule = tuple[Callable[[Any], bool], str]
_COMMON: dict[str, _Rule] = {
    # Structured outputs are honoured (structured.py); these options of vLLM's older
    # guided decoding would change how, and are not.
    "guided_decoding_backend": (_empty, "choosing the guided decoding backend is not supported"),
    "guided_whitespace_pattern": (_empty, "a guided whitespace pattern is not supported"),
    "prompt_logprobs": (_empty, "prompt logprobs are not supported yet"),
    # vLLM's sampling and output extensions that Tandem does not implement.
    "include_stop_str_in_output": (
        _empty,
        "keeping the stop string in the output is not supported",
    ),
    "allowed_token_ids": (_empty, "restricting the allowed token ids is not supported"),
    "bad_words": (_empty, "bad_words is not supported"),
    "use_beam_search": (_empty, "beam search is not supported"),
    "length_penalty": (_one, "length_penalty (beam search) is not supported"),
    "truncate_prompt_tokens": (_empty, "prompt truncation is not supported"),
    "spaces_between_special_tokens": (_default_true, "only the default (true) is supported"),
    "return_tokens_as_token_ids": (_empty, "tokens as token ids are not supported"),
    "mm_processor_kwargs": (_empty, "per-request image processor options are not supported"),
    "logits_processors": (_empty, "per-request logits processors are not supported"),
    "return_token_ids": (_empty, "returning the token ids is not supported yet"),
    # vLLM's per-tenant prefix-cache isolation: the vLLM worker protocol has no field that
    # would carry it to the workers, so accepting it would share caches it meant to split.
    "cache_salt": (_empty, "a per-request cache salt cannot reach the workers"),
}
_CHAT: dict[str, _Rule] = {
    "functions": (_empty, "function calling is not supported yet"),
    "function_call": (_no_tool_choice, "function calling is not supported yet"),
    "reasoning_effort": (_empty, "reasoning controls are not supported by this model"),
    "modalities": (_text_modalities, "only text output is supported"),
    "audio": (_empty, "audio output is not supported"),
    "prediction": (_empty, "predicted outputs are not supported"),
    "web_search_options": (_empty, "web search is not supported"),
    "store": (_empty, "storing chat completions is not supported"),
    # vLLM's chat template controls: the gateway renders the model's own template as is.
    "echo": (_empty, "echoing the prompt is not supported on chat completions"),
    "add_generation_prompt": (_default_true, "the generation prompt is always added"),
    "continue_final_message": (_empty, "continuing the final message is not supported"),
    "chat_template": (_empty, "a per-request chat template is not supported"),
    "chat_template_kwargs": (_empty, "chat template arguments are not supported yet"),
    "documents": (_empty, "documents for the chat template are not supported"),
    # The rendered template already holds the special tokens; vLLM's chat default, false.
    "add_special_tokens": (_empty, "adding special tokens to a rendered chat is not supported"),
    "verbosity": (_empty, "this model has no verbosity control"),
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
