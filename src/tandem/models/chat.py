"""Render chat messages to prompt text with the checkpoint's own Jinja chat template.

Rendering happens in the gateway, which has no torch, so this uses jinja2
directly with the same sandbox and whitespace settings transformers uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tandem.models.info import read_json


class ChatTemplateError(ValueError):
    """The template is missing or refused the messages."""


def _raise(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _token_text(value: Any) -> str:
    # tokenizer_config.json stores special tokens as strings or AddedToken dicts.
    if isinstance(value, Mapping):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = _raise
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    return env


class ChatTemplate:
    """A compiled chat template plus the special tokens it may reference."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"invalid chat template: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    @property
    def renders_tools(self) -> bool:
        """Whether the template reads the ``tools`` it is given (else they would vanish)."""
        return "tools" in self.source

    @property
    def tool_call_format(self) -> str | None:
        """The tool-call parser its call format reads with, when the template shows one."""
        return "hermes" if "<tool_call>" in self.source else None

    @classmethod
    def from_tokenizer_config(cls, config: Mapping[str, Any]) -> ChatTemplate:
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in source}
            source = named.get("default")
        if not isinstance(source, str) or not source:
            raise ChatTemplateError("the tokenizer config has no chat template")
        return cls(
            source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
        )

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ChatTemplate:
        model_dir = Path(model_dir)
        config = read_json(model_dir / "tokenizer_config.json")
        jinja_file = model_dir / "chat_template.jinja"
        if "chat_template" not in config and jinja_file.exists():
            config = {**config, "chat_template": jinja_file.read_text(encoding="utf-8")}
        return cls.from_tokenizer_config(config)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        try:
            return self._template.render(
                messages=[_plain_message(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc


def _plain_message(message: Mapping[str, Any]) -> dict[str, Any]:
    # Templates index with ['key']; hand them plain dicts (pydantic models are dumped first).
    out = dict(message)
    content = out.get("content")
    if isinstance(content, Sequence) and not isinstance(content, str):
        out["content"] = [dict(part) for part in content]
    return out


@lru_cache(maxsize=16)
def _template_for_dir(model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_model_dir(model_dir)


def render_chat(
    source: str | Path | Mapping[str, Any] | ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **extra: Any,
) -> str:
    """Render ``messages`` with a model directory's template (or a tokenizer config dict)."""
    if isinstance(source, ChatTemplate):
        template = source
    elif isinstance(source, Mapping):
        template = ChatTemplate.from_tokenizer_config(source)
    else:
        template = _template_for_dir(Path(source).resolve())
    return template.render(messages, add_generation_prompt, **extra)
