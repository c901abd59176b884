"""Forward passes of one loaded model, with KV in and KV out.

`ModelRunner.prefill` computes the part of a prompt not covered by a given KV
prefix (from the prefix cache, or pulled from a prefill worker) and returns
the last position's logits; `ModelRunner.decode_step` appends one token. Both
run batch size 1, fp32, under ``torch.inference_mode``: returned tensors are
inference tensors, fine to read, slice, clone and concatenate anywhere, but
not to modify in place outside inference mode.

Positions never depend on pixels: M-RoPE positions come from the token ids and
``image_grid_thw``, so a pixel-less decode leg with grids continues exactly
where the prefill worker stopped.

Images are encoded in the prefill from their pixels, or arrive as features computed by an
encode worker (``MediaInputs.features``, E/P/D), which a language-model-only runner takes
too; ``encode_image`` is the encode worker's half. Both paths go through one locked
encoder call, so an image's features are the same bits either way and the vision tower
never runs on two threads at once.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tandem.engine.loader import LanguageModelOnly, load_model
from tandem.engine.runner_features import check_features, image_input
from tandem.engine.runner_kv import cache_from_kv, check_kv, kv_from_cache
from tandem.engine.runner_media import (
    ImageSlot,
    MediaLayoutError,
    MediaPlan,
    MissingPixelsError,
    VisionUnavailableError,
    plan_media,
)
from tandem.engine.runner_vision import VisionEncoder, vision_encoder
from tandem.engine.types import ImageFeatures, KVLayers, MediaInputs, ModelShape
from tandem.models.info import ModelInfo, load_model_info

__all__ = [
    "ContextLengthError",
    "MediaLayoutError",
    "MissingPixelsError",
    "ModelRunner",
    "SequenceState",
    "VisionUnavailableError",
]


class ContextLengthError(ValueError):
    """The sequence would not fit the model's context."""


@dataclass
class SequenceState:
    kv: KVLayers  # per layer (k, v), each [num_kv_heads, seq_len, head_dim] float32
    length: int  # tokens covered by kv
    rope_delta: int = 0  # M-RoPE: position offset for tokens after the prompt (0 for plain RoPE)


class ModelRunner:
    def __init__(self, model: nn.Module, info: ModelInfo) -> None:
        self.model = model
        self.info = info
        self.family = info.family
        self.model_type = info.model_type
        self.eos_token_ids: list[int] = list(info.eos_token_ids)
        # transformers resolves submodules dynamically: to a type checker they are Any.
        hf: Any = model
        self._text_config = hf.config.get_text_config()
        self._lm: Any = hf.model.language_model
        self._head: Any = hf.lm_head
        self.supports_vision = not isinstance(model, LanguageModelOnly)
        self._vision: VisionEncoder | None = (
            vision_encoder(model, info.family.name) if self.supports_vision else None
        )
        # What this model's encoder makes of an image, beyond its token count: features
        # from elsewhere must match it. ``config`` is the full model's, even for a
        # language-model-only load.
        vision_config = getattr(hf.config, "vision_config", None)
        self.deepstack_layers = len(getattr(vision_config, "deepstack_visual_indexes", None) or [])
        self.hidden_size: int = self._text_config.hidden_size
        self._vision_lock = threading.Lock()  # held through a tower call
        self._count_lock = threading.Lock()  # never held long: Stats reads it
        self._vision_encodes = 0
        cfg = self._text_config
        self.shape = ModelShape(
            num_layers=cfg.num_hidden_layers,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            vocab_size=cfg.vocab_size,
            max_context=cfg.max_position_embeddings,
        )

    @classmethod
    def load(
        cls, model_dir: str | Path, language_model_only: bool = False, model_id: str | None = None
    ) -> ModelRunner:
        info = load_model_info(model_dir, model_id)
        return cls(load_model(model_dir, language_model_only), info)

    @property
    def vision_encodes(self) -> int:
        """Vision tower calls so far, one per encoder call (an image, or a video's frame
        pair), in prefills and :meth:`encode_image` alike."""
        with self._count_lock:
            return self._vision_encodes

    def encode_image(self, pixels: np.ndarray, grid: np.ndarray | None) -> ImageFeatures:
        """One image's features, exactly as a prefill from these pixels would place them.

        For encode workers (E/P/D); thread-safe (the tower is locked). ``grid`` is the
        image's ``(t, h, w)`` for M-RoPE families and None otherwise; a mismatch between
        pixels and grid raises MediaLayoutError.
        """
        if self._vision is None:
            raise VisionUnavailableError(
                "this worker loaded the language model only and cannot encode images"
            )
        pixels = np.asarray(pixels)
        thw, tokens = image_input(pixels, grid, self.info)
        with torch.inference_mode():
            features = self._encode(pixels, thw)
        if features.embeds.shape[0] != tokens:
            raise MediaLayoutError(
                f"the image encodes to {features.embeds.shape[0]} tokens, not the {tokens} "
                "its grid gives"
            )
        return features

    def prefill(
        self,
        input_ids: Sequence[int],
        media: MediaInputs | None,
        cached: KVLayers | None = None,
    ) -> tuple[torch.Tensor, SequenceState]:
        """Compute ``input_ids[len(cached):]`` on top of ``cached``; logits of the last token.

        Vision runs only for images with tokens in the computed part; those need
        ``media.pixel_values`` (MissingPixelsError otherwise) unless ``media.features``
        has theirs, whereas images wholly inside ``cached`` need only their grid (M-RoPE)
        or nothing.
        """
        length = len(input_ids)
        if length == 0:
            raise ValueError("cannot prefill an empty prompt")
        if length > self.shape.max_context:
            raise ContextLengthError(
                f"prompt of {length} tokens exceeds the context of {self.shape.max_context}"
            )
        ids = np.asarray(input_ids, dtype=np.int64)
        if ids.min() < 0 or ids.max() >= self.shape.vocab_size:
            raise ValueError("the prompt holds token ids outside the vocabulary")
        start = check_kv(cached, self.shape) if cached else 0
        if start >= length:
            raise ValueError(
                f"cached KV covers {start} of {length} prompt tokens; at least the last "
                "prompt token must be computed to get its logits"
            )
        plan = plan_media(input_ids, media, self.info)
        with torch.inference_mode():
            embeds = self._lm.embed_tokens(torch.from_numpy(ids[start:]).view(1, -1))
            extra = self._place_images(embeds, input_ids, plan, media, start)
            cache = cache_from_kv(cached, self._text_config)
            out = self._lm(
                inputs_embeds=embeds,
                position_ids=self._positions(plan, start, length),
                cache=cache,
                use_cache=True,
                **extra,
            )
            logits = self._head(out.last_hidden_state[0, -1])
        return logits, SequenceState(kv_from_cache(cache), length, plan.rope_delta)

    def decode_step(self, state: SequenceState, token_id: int) -> torch.Tensor:
        """Append ``token_id`` to the sequence; return the next token's logits [vocab]."""
        if not 0 <= token_id < self.shape.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary")
        if state.length >= self.shape.max_context:
            raise ContextLengthError(f"the sequence has reached the context of {state.length}")
        if not state.kv or state.kv[0][0].shape[1] != state.length:
            raise ValueError("the sequence state's KV does not cover its length")
        index = state.length
        if self.family.has_mrope:
            pos = index + state.rope_delta
            positions = torch.tensor([index, pos, pos, pos]).view(4, 1, 1)
        else:
            positions = torch.tensor([[index]])
        with torch.inference_mode():
            cache = cache_from_kv(state.kv, self._text_config)
            out = self._lm(
                inputs_embeds=self._lm.embed_tokens(torch.tensor([[token_id]])),
                position_ids=positions,
                cache=cache,
                use_cache=True,
            )
            logits = self._head(out.last_hidden_state[0, -1])
        state.kv = kv_from_cache(cache)
        state.length += 1
        return logits

    def _positions(self, plan: MediaPlan, start: int, end: int) -> torch.Tensor:
        index = torch.arange(start, end)
        if not self.family.has_mrope:
            return index.view(1, -1)
        # Row 0 is the plain token index (masking); rows 1-3 the M-RoPE axes.
        mrope = (
            torch.from_numpy(plan.mrope[:, start:end])
            if plan.mrope is not None
            else index.expand(3, -1)
        )
        return torch.cat([index.view(1, -1), mrope]).view(4, 1, -1)

    def _place_images(
        self,
        embeds: torch.Tensor,
        input_ids: Sequence[int],
        plan: MediaPlan,
        media: MediaInputs | None,
        start: int,
    ) -> dict[str, Any]:
        """Write image embeddings over the computed image tokens; DeepStack inputs if any."""
        if not plan.slots:
            tail = np.asarray(input_ids[start:])
            media_tokens = [self.info.image_token_id, self.info.video_token_id]
            if np.isin(tail, [t for t in media_tokens if t is not None]).any():
                raise MissingPixelsError(
                    "the prompt has image or video tokens to compute but the request carries "
                    "no media"
                )
            return {}
        needed = [slot for slot in plan.slots if slot.positions[-1] >= start]
        if not needed:
            return {}
        mask = torch.zeros(embeds.shape[1], dtype=torch.bool)
        deepstack: list[list[torch.Tensor]] = []
        for slot in needed:
            features = self._slot_features(slot, media, start)
            keep = torch.from_numpy(slot.positions >= start)
            local = torch.from_numpy(slot.positions - start)[keep]
            embeds[0, local] = _like(features.embeds, embeds)[keep]
            mask[local] = True
            for layer, feature in enumerate(features.deepstack):
                if layer == len(deepstack):
                    deepstack.append([])
                deepstack[layer].append(_like(feature, embeds)[keep])
        if not deepstack:
            return {}
        return {
            "visual_pos_masks": mask.view(1, -1),
            "deepstack_visual_embeds": [torch.cat(parts) for parts in deepstack],
        }

    def _slot_features(
        self, slot: ImageSlot, media: MediaInputs | None, start: int
    ) -> ImageFeatures:
        """The slot's features: precomputed ones (checked), or encoded from its pixels."""
        given = media.features.get(slot.index) if media is not None and media.features else None
        if given is not None:  # plan_media let features through for images only
            check_features(
                given, slot.index, len(slot.positions), self.hidden_size, self.deepstack_layers
            )
            return given
        if self._vision is None:
            raise VisionUnavailableError(
                "this worker loaded the language model only and cannot encode images; "
                "it needs KV covering every image token, or the images' features"
            )
        pixels = None
        if media is not None:
            pixels = media.video_pixel_values if slot.video else media.pixel_values
        if pixels is None:
            first = int(slot.positions[0])
            raise MissingPixelsError(
                f"{'video' if slot.video else 'image'} tokens from position {first} must "
                f"be computed (cached KV covers {start} tokens) but the request carries "
                "no pixel values for them"
            )
        features = self._encode(pixels[slot.pixel_rows], slot.grid)
        if features.embeds.shape[0] != len(slot.positions):
            raise MediaLayoutError(
                f"image {slot.index} encodes to {features.embeds.shape[0]} tokens but "
                f"the prompt holds {len(slot.positions)}"
            )
        return features

    def _encode(self, pixels: np.ndarray, grid: np.ndarray | None) -> ImageFeatures:
        """The one vision tower call, counted (whether or not it succeeds) and locked."""
        assert self._vision is not None
        with self._count_lock:
            self._vision_encodes += 1
        with self._vision_lock:
            return self._vision.encode(pixels, grid)


def _like(features: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """Features from elsewhere in the input embeddings' dtype and device (a no-op for ours)."""
    return features.to(dtype=embeds.dtype, device=embeds.device)
