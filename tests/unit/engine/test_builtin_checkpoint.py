"""The built-in directories are ordinary checkpoints: stock transformers/tokenizers load them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from tandem.engine.builtin_specs import BUILTIN_SPECS
from tandem.engine.runner import ModelRunner
from tandem.models import load_model_info

SAMPLES = [
    "hello world",
    "héllo wörld — ünïcode ✓",
    "日本語のテキスト 🙂🚀",
    "tabs\tand\nnewlines  ",
]


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_from_pretrained_loads_every_weight(name: str, builtin_dirs: dict[str, Path]) -> None:
    spec = BUILTIN_SPECS[name]
    model_class = getattr(transformers, spec.config["architectures"][0])
    model, info = model_class.from_pretrained(builtin_dirs[name], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_weights_are_real_scale_and_can_stop(name: str, runners: dict[str, ModelRunner]) -> None:
    model = runners[name].model
    embed = model.get_input_embeddings().weight.detach()
    # Not near-zero "dummy" weights: the init std is 0.2 and training keeps it near there.
    assert 0.1 < float(embed.std()) < 0.3
    head = model.get_output_embeddings().weight.detach()
    # The end-of-turn row was trained (it was all zeros before), so a reply can end.
    assert float(head[runners[name].eos_token_ids[0]].norm()) > 0.5
    assert float(head[:256].std()) > 0.1


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_tokenizers_load_and_round_trip(name: str, builtin_dirs: dict[str, Path]) -> None:
    directory = builtin_dirs[name]
    hf = AutoTokenizer.from_pretrained(directory)
    raw = Tokenizer.from_file(str(directory / "tokenizer.json"))
    spec = BUILTIN_SPECS[name]
    assert len(hf) == raw.get_vocab_size() == spec.vocab_size
    for text in SAMPLES:
        ids = raw.encode(text, add_special_tokens=False).ids
        assert ids == list(text.encode("utf-8"))  # byte-level: id == byte value
        assert hf(text, add_special_tokens=False)["input_ids"] == ids
        assert raw.decode(ids) == text
        assert hf.decode(ids) == text
    for token in spec.special_tokens:
        assert raw.token_to_id(token) == spec.token_id(token)
        assert raw.encode(token, add_special_tokens=False).ids == [spec.token_id(token)]


def test_qwen_token_ids_agree_with_config(builtin_dirs: dict[str, Path]) -> None:
    directory = builtin_dirs["tiny-qwen3-vl"]
    raw = Tokenizer.from_file(str(directory / "tokenizer.json"))
    config = json.loads((directory / "config.json").read_text())
    assert config["image_token_id"] == raw.token_to_id("<|image_pad|>")
    assert config["video_token_id"] == raw.token_to_id("<|video_pad|>")
    assert config["vision_start_token_id"] == raw.token_to_id("<|vision_start|>")
    assert config["text_config"]["vocab_size"] == raw.get_vocab_size()
    hf = AutoTokenizer.from_pretrained(directory)
    assert hf.eos_token == "<|im_end|>"
    info = load_model_info(directory)
    assert info.eos_token_ids == (raw.token_to_id("<|im_end|>"), raw.token_to_id("<|endoftext|>"))
    assert info.anchor_token_id == info.image_token_id == raw.token_to_id("<|image_pad|>")


def test_llava_token_ids_agree_with_config(builtin_dirs: dict[str, Path]) -> None:
    directory = builtin_dirs["tiny-llava-1.5"]
    raw = Tokenizer.from_file(str(directory / "tokenizer.json"))
    config = json.loads((directory / "config.json").read_text())
    assert config["image_token_index"] == raw.token_to_id("<image>")
    hf = AutoTokenizer.from_pretrained(directory)
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == ("<s>", "</s>", "<pad>")
    info = load_model_info(directory)
    assert info.eos_token_ids == (raw.token_to_id("</s>"),)
    assert info.image_seq_length == config["image_seq_length"] == 64


def test_hf_chat_template_matches_ours(builtin_dirs: dict[str, Path]) -> None:
    from tandem.models import render_chat

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "And now?"},
    ]
    for directory in builtin_dirs.values():
        hf = AutoTokenizer.from_pretrained(directory)
        expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert render_chat(directory, messages) == expected


def test_hf_chat_template_matches_ours_for_a_tool_conversation(
    builtin_dirs: dict[str, Path],
) -> None:
    """Tools, an assistant turn with calls and two tool results, images: as transformers
    renders them with the same checkpoint (what the gateway sends is what HF would)."""
    from tandem.gateway.endpoints.chat.schema import parse_chat_request

    tools = [
        {
            "type": "function",
            "function": {
                "name": "locate",
                "description": "Where a thing is in the picture.",
                "parameters": {"type": "object", "properties": {"thing": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "count"}},
    ]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    call = {"id": "call_1", "type": "function", "function": {"name": "locate", "arguments": ""}}
    messages = [
        {"role": "developer", "content": "Use the tools."},
        {"role": "user", "content": [image, {"type": "text", "text": "Where is the cat?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {**call, "function": {"name": "locate", "arguments": '{"thing": "cat"}'}},
                {**call, "id": "call_2", "function": {"name": "count", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "top left"},
        {"role": "tool", "tool_call_id": "call_2", "content": "1"},
        {"role": "user", "content": [image, {"type": "text", "text": "And here?"}]},
    ]
    body = parse_chat_request(json.dumps({"model": "m", "messages": messages, "tools": tools}))
    ours_in = body.template_messages()
    for directory in builtin_dirs.values():
        from tandem.models import render_chat

        hf = AutoTokenizer.from_pretrained(directory)
        expected = hf.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True
        )
        rendered = render_chat(directory, ours_in, tools=body.template_tools())
        assert rendered == expected
        assert "<tool_call>" in rendered and "top left" in rendered and "locate" in rendered


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-llava-1.5"])
def test_runner_attributes(name: str, runners: dict[str, ModelRunner]) -> None:
    runner = runners[name]
    spec = BUILTIN_SPECS[name]
    assert runner.shape.vocab_size == spec.vocab_size
    text = spec.config["text_config"]
    expected = (2, text["num_key_value_heads"], 32)  # 32: vLLM's smallest CPU head size
    assert (runner.shape.num_layers, runner.shape.num_kv_heads, runner.shape.head_dim) == expected
    assert runner.shape.max_context == 4096
    assert runner.supports_vision
    assert runner.family.name == ("qwen3_vl" if "qwen" in name else "llava")
