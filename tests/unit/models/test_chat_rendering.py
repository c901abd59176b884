"""Chat templates of the built-in models, rendered with jinja2 (no torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.models import ChatTemplate, ChatTemplateError, render_chat

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def test_qwen_string_content(qwen_meta_dir: Path) -> None:
    text = render_chat(qwen_meta_dir, [{"role": "user", "content": "Hi there"}])
    assert text == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"


def test_qwen_one_anchor_per_image_in_order(qwen_meta_dir: Path) -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "First "},
                IMAGE,
                {"type": "text", "text": " then "},
                {"type": "image"},
            ],
        }
    ]
    text = render_chat(qwen_meta_dir, messages)
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert (
        text == f"<|im_start|>user\nFirst {image} then {image}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert text.count("<|image_pad|>") == 2


def test_qwen_multi_turn_without_generation_prompt(qwen_meta_dir: Path) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    text = render_chat(qwen_meta_dir, messages, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n"
    )


def test_llava_style(llava_meta_dir: Path) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, IMAGE]}]
    assert render_chat(llava_meta_dir, messages) == "<s>USER: <image>\nWhat is this? ASSISTANT:"


def test_llava_multi_turn_and_system(llava_meta_dir: Path) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [IMAGE, IMAGE, {"type": "text", "text": "Compare."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Same."}]},
        {"role": "user", "content": "Sure?"},
    ]
    assert render_chat(llava_meta_dir, messages) == (
        "<s>Be brief. USER: <image>\n<image>\nCompare. ASSISTANT: Same.</s>USER: Sure? ASSISTANT:"
    )


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_unsupported_part_is_refused(name: str, meta_dirs: dict[str, Path]) -> None:
    messages = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]
    with pytest.raises(ChatTemplateError, match="input_audio"):
        render_chat(meta_dirs[name], messages)


def test_none_content_renders_empty(qwen_meta_dir: Path) -> None:
    messages = [{"role": "assistant", "content": None}]
    text = render_chat(qwen_meta_dir, messages, add_generation_prompt=False)
    assert text == "<|im_start|>assistant\n<|im_end|>\n"


def test_render_from_tokenizer_config_mapping(qwen_meta_dir: Path) -> None:
    config = json.loads((qwen_meta_dir / "tokenizer_config.json").read_text())
    messages = [{"role": "user", "content": "x"}]
    assert render_chat(config, messages) == render_chat(qwen_meta_dir, messages)


def test_missing_and_broken_templates() -> None:
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatTemplate.from_tokenizer_config({"eos_token": "</s>"})
    with pytest.raises(ChatTemplateError, match="invalid"):
        ChatTemplate("{% for %}")


def test_special_tokens_as_added_token_dicts() -> None:
    template = ChatTemplate.from_tokenizer_config(
        {"chat_template": "{{ bos_token }}|{{ eos_token }}", "bos_token": {"content": "<s>"}}
    )
    assert template.render([]) == "<s>|"
