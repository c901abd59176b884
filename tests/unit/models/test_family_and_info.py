"""Family detection and the facts read from a checkpoint's JSON files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tandem.models import (
    LLAVA,
    QWEN3_VL,
    UnsupportedModelError,
    detect_family,
    load_model_info,
)


def test_detect_by_model_type() -> None:
    assert detect_family({"model_type": "qwen3_vl"}) is QWEN3_VL
    assert detect_family({"model_type": "llava"}) is LLAVA


def test_detect_llava_15_by_model_id() -> None:
    assert detect_family({"model_type": "llava_custom"}, "llava-hf/LLaVA-1.5-7b-hf") is LLAVA


def test_unknown_family_is_refused() -> None:
    with pytest.raises(UnsupportedModelError, match="qwen2_vl"):
        detect_family({"model_type": "qwen2_vl"}, "Qwen/Qwen2-VL-2B")
    with pytest.raises(ValueError):
        detect_family({})


def test_family_wire_layout() -> None:
    assert QWEN3_VL.flat_keys == {"pixel_values": "patches_per_image"}
    assert not QWEN3_VL.pixels_batched
    assert "image_grid_thw" in QWEN3_VL.batched_keys
    assert QWEN3_VL.keep_on_cpu_keys == ("image_grid_thw",)
    assert QWEN3_VL.grid_keys == ("image_grid_thw",)
    assert QWEN3_VL.has_mrope and QWEN3_VL.worker_expandable
    assert LLAVA.flat_keys == {}
    assert LLAVA.pixels_batched and LLAVA.batched_keys == ("pixel_values",)
    assert not LLAVA.has_mrope and not LLAVA.worker_expandable
    assert LLAVA.grid_keys == ()


def test_info_of_builtin_qwen(qwen_meta_dir: Path) -> None:
    info = load_model_info(qwen_meta_dir)
    assert info.family is QWEN3_VL
    assert info.model_type == "qwen3_vl"
    assert info.image_token_id == info.anchor_token_id == 261
    assert info.eos_token_ids == (258, 256)  # <|im_end|>, <|endoftext|>
    assert (info.vocab_size, info.max_context) == (263, 4096)
    assert info.spatial_merge_size == 2 and info.image_seq_length is None


def test_info_of_builtin_llava(llava_meta_dir: Path) -> None:
    info = load_model_info(llava_meta_dir)
    assert info.family is LLAVA
    assert info.image_token_id == info.anchor_token_id == 258
    assert info.eos_token_ids == (257,)
    assert info.image_seq_length == 64 and info.spatial_merge_size is None


def test_eos_falls_back_to_config_then_tokenizer(llava_meta_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(llava_meta_dir, tmp_path / "m"))
    (copy / "generation_config.json").unlink()
    assert load_model_info(copy).eos_token_ids == (257,)  # text_config.eos_token_id
    config = json.loads((copy / "config.json").read_text())
    del config["text_config"]["eos_token_id"]
    (copy / "config.json").write_text(json.dumps(config))
    assert load_model_info(copy).eos_token_ids == (257,)  # tokenizer_config eos_token


def test_llava_token_count_follows_the_vision_tower(llava_meta_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(llava_meta_dir, tmp_path / "m"))
    config = json.loads((copy / "config.json").read_text())
    config["vision_config"].update(image_size=336, patch_size=14)
    config["image_seq_length"] = 576
    (copy / "config.json").write_text(json.dumps(config))
    assert load_model_info(copy).image_seq_length == 576
    config["vision_feature_select_strategy"] = "full"
    (copy / "config.json").write_text(json.dumps(config))
    assert load_model_info(copy).image_seq_length == 577
