"""What one checkpoint directory says about itself, read from its JSON files (no torch)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.models.family import ModelFamily, detect_family


def read_json(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Token ids and sizes of one checkpoint, plus its family."""

    model_dir: Path
    model_type: str
    family: ModelFamily
    image_token_id: int
    anchor_token_id: int  # the tokenizer's id for family.anchor_token
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    max_context: int
    spatial_merge_size: int | None  # M-RoPE families: patches merged per token side
    image_seq_length: int | None  # grid-less families: fixed tokens per image
    # Video (families that take it): the anchor the template emits, the token its runs
    # repeat, and the markers around each frame's run; None elsewhere.
    video_token_id: int | None = None
    vision_start_id: int | None = None
    vision_end_id: int | None = None

    @property
    def takes_video(self) -> bool:
        return self.video_token_id is not None


def added_token_ids(model_dir: Path) -> dict[str, int]:
    """Content → id of the tokenizer's added tokens, read from tokenizer.json."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        return {}
    return {t["content"]: int(t["id"]) for t in read_json(path).get("added_tokens", [])}


def _eos_ids(model_dir: Path, config: dict[str, Any], text: dict[str, Any]) -> tuple[int, ...]:
    # generation_config.json is what HF generate and vLLM honour, so it wins.
    gen_path = model_dir / "generation_config.json"
    ids = _as_id_list(read_json(gen_path).get("eos_token_id")) if gen_path.exists() else []
    if not ids:
        ids = _as_id_list(text.get("eos_token_id", config.get("eos_token_id")))
    if not ids:
        tok_cfg_path = model_dir / "tokenizer_config.json"
        eos = read_json(tok_cfg_path).get("eos_token") if tok_cfg_path.exists() else None
        if isinstance(eos, dict):
            eos = eos.get("content")
        added = added_token_ids(model_dir)
        if isinstance(eos, str) and eos in added:
            ids = [added[eos]]
    return tuple(dict.fromkeys(ids))


def load_model_info(model_dir: str | Path, model_id: str | None = None) -> ModelInfo:
    """Read config.json (+ generation/tokenizer files) of a checkpoint directory."""
    model_dir = Path(model_dir)
    config = read_json(model_dir / "config.json")
    family = detect_family(config, model_id)
    text = config.get("text_config") or {}
    vision = config.get("vision_config") or {}
    # LLaVA configs call it image_token_index; transformers maps both names.
    image_token_id = config.get("image_token_id", config.get("image_token_index"))
    added = added_token_ids(model_dir)
    anchor_id = added.get(family.anchor_token, image_token_id)
    if image_token_id is None:
        image_token_id = anchor_id
    if image_token_id is None:
        raise ValueError(f"{model_dir}: config.json names no image token id")
    return ModelInfo(
        model_dir=model_dir,
        model_type=str(config.get("model_type", family.name)),
        family=family,
        image_token_id=int(image_token_id),
        anchor_token_id=int(anchor_id if anchor_id is not None else image_token_id),
        eos_token_ids=_eos_ids(model_dir, config, text),
        vocab_size=int(text.get("vocab_size", config.get("vocab_size", 0))),
        max_context=int(text.get("max_position_embeddings", 0)),
        spatial_merge_size=int(vision.get("spatial_merge_size", 2)) if family.has_mrope else None,
        image_seq_length=None if family.has_mrope else _llava_tokens(config, vision),
        **_video_ids(family, config, added),
    )


def _video_ids(
    family: ModelFamily, config: dict[str, Any], added: dict[str, int]
) -> dict[str, int]:
    """The video token ids of a family that takes video, from config.json (else the vocab)."""
    if family.video_anchor_token is None:
        return {}
    video = config.get("video_token_id", added.get(family.video_anchor_token))
    start = config.get("vision_start_token_id", added.get("<|vision_start|>"))
    end = config.get("vision_end_token_id", added.get("<|vision_end|>"))
    if video is None or start is None or end is None:
        return {}  # a checkpoint without video tokens: video parts are refused
    return {"video_token_id": int(video), "vision_start_id": int(start), "vision_end_id": int(end)}


def _llava_tokens(config: dict[str, Any], vision: dict[str, Any]) -> int:
    # The tower's patch grid decides the count; image_seq_length only documents it.
    if "image_size" in vision and "patch_size" in vision:
        per_side = int(vision["image_size"]) // int(vision["patch_size"])
        with_cls = config.get("vision_feature_select_strategy", "default") == "full"
        return per_side * per_side + int(with_cls)
    return int(config.get("image_seq_length", 576))
