"""What the two built-in tiny models are: configs, tokens, processor settings (no torch).

Sizes are chosen so a one-image request prefills in milliseconds on one core,
while the architecture is the real one (vLLM can load the same directories).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from tandem.models.templates import LLAVA_CHAT_TEMPLATE, QWEN3_VL_CHAT_TEMPLATE

# Bump when the generator changes in a way the spec fields below do not show
# (weight init, the training code, file layout); the cache directory name follows it.
GENERATOR_VERSION = 2

BYTE_VOCAB = 256  # ids 0..255 are the byte-level symbols; special tokens follow

# Larger than the usual 0.02: at width 64 this keeps activations near unit scale, and
# training from it learns the shapes far sooner (from 0.02, 1200 steps learn colour only).
INIT_STD = 0.2

_CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
_CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


@dataclass(frozen=True)
class TrainingRecipe:
    """How a built-in model is trained when generated (engine/builtin_training.py).

    Part of the content key, so a changed recipe generates a fresh checkpoint.
    """

    steps: int
    batch: int
    lr: float
    warmup_steps: int
    image_sides: tuple[int, int]  # each side of a training picture, in pixels: (min, max)
    text_fraction: float  # share of text-only examples (answered TEXT_ONLY_REPLY)
    json_fraction: float  # share of examples asking for JSON (builtin_shapes.JSON_QUESTIONS)
    seed: int = 0
    threads: int = 2  # fixed, so the same machine always computes the same weights
    # Share of the steps whose batch is short clips of pictures (models that take video).
    video_fraction: float = 0.0


@dataclass(frozen=True)
class BuiltinSpec:
    name: str
    seed: int
    special_tokens: tuple[str, ...]  # get ids BYTE_VOCAB, BYTE_VOCAB + 1, ... in this order
    config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    generation_config: dict[str, Any]
    preprocessor_config: dict[str, Any]
    processor_config: dict[str, Any] | None = None
    video_preprocessor_config: dict[str, Any] | None = None  # models that take video
    # Module-name prefix → checkpoint-name prefix, for the checkpoint's key layout.
    weight_prefixes: tuple[tuple[str, str], ...] = ()
    training: TrainingRecipe | None = None

    def token_id(self, token: str) -> int:
        return BYTE_VOCAB + self.special_tokens.index(token)

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB + len(self.special_tokens)

    def content_key(self) -> str:
        """Short digest of everything generated, so a changed spec gets a fresh directory."""
        fields = asdict(self)
        # Added with video: left at their defaults, they leave the keys of models without
        # video as they were (the same checkpoints).
        if fields["video_preprocessor_config"] is None:
            del fields["video_preprocessor_config"]
        if fields["training"] is not None and not fields["training"]["video_fraction"]:
            del fields["training"]["video_fraction"]
        payload = json.dumps([GENERATOR_VERSION, fields], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:10]


# What both models train on; each sets its own length and learning rate (the fewest steps
# that reach the accuracy README.md states, measured per model).
_SHAPES_RECIPE = TrainingRecipe(
    steps=0,
    batch=16,
    lr=0.0,
    warmup_steps=20,
    image_sides=(96, 160),
    text_fraction=0.15,
    json_fraction=0.15,
)

_QWEN_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)


def _qwen_id(token: str) -> int:
    return BYTE_VOCAB + _QWEN_TOKENS.index(token)


# What the image and the video processor of Qwen3-VL share: pixel arithmetic, patch layout.
_QWEN_PIXELS: dict[str, Any] = {
    "processor_class": "Qwen3VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
}

TINY_QWEN3_VL = BuiltinSpec(
    name="tiny-qwen3-vl",
    seed=1234,
    special_tokens=_QWEN_TOKENS,
    config={
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "dtype": "float32",
        "image_token_id": _qwen_id("<|image_pad|>"),
        "video_token_id": _qwen_id("<|video_pad|>"),
        "vision_start_token_id": _qwen_id("<|vision_start|>"),
        "vision_end_token_id": _qwen_id("<|vision_end|>"),
        "tie_word_embeddings": False,
        "text_config": {
            "vocab_size": BYTE_VOCAB + len(_QWEN_TOKENS),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            # 32 is the smallest head size vLLM's CPU attention kernels accept.
            "head_dim": 32,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "initializer_range": INIT_STD,
            "tie_word_embeddings": False,
            "eos_token_id": _qwen_id("<|im_end|>"),
            # mrope_section covers head_dim / 2 rotary pairs: (temporal, height, width).
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5000000.0,
                "mrope_section": [4, 6, 6],
                "mrope_interleaved": True,
            },
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": 64,
            # A 16x16 learned position grid covers the largest image (max_pixels below).
            "num_position_embeddings": 256,
            "deepstack_visual_indexes": [0, 1],
            "initializer_range": INIT_STD,
        },
    },
    tokenizer_config={
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": QWEN3_VL_CHAT_TEMPLATE,
    },
    generation_config={
        "eos_token_id": [_qwen_id("<|im_end|>"), _qwen_id("<|endoftext|>")],
        "pad_token_id": _qwen_id("<|endoftext|>"),
        "do_sample": False,
    },
    preprocessor_config={
        "image_processor_type": "Qwen2VLImageProcessor",
        **_QWEN_PIXELS,
        # At most 256x256 pixels: 16x16 patches, 64 image tokens; at least 1 token.
        "min_pixels": 32 * 32,
        "max_pixels": 256 * 256,
        "size": {"shortest_edge": 32 * 32, "longest_edge": 256 * 256},
    },
    # Qwen3VLVideoProcessor's layout with the tiny model's sizes: pixels are counted over
    # all sampled frames (at most 8 frames of 256x256 at full size), 2 frames per second,
    # 4..64 frames per video.
    video_preprocessor_config={
        "video_processor_type": "Qwen3VLVideoProcessor",
        **_QWEN_PIXELS,
        "size": {"shortest_edge": 2 * 32 * 32, "longest_edge": 8 * 256 * 256},
        "fps": 2,
        "min_frames": 4,
        "max_frames": 64,
        "do_sample_frames": True,
        "cap_pixels_per_frame": False,
    },
    training=replace(_SHAPES_RECIPE, steps=1900, lr=3e-3, video_fraction=0.2),
)

_LLAVA_TOKENS = ("<s>", "</s>", "<image>", "<pad>")


def _llava_id(token: str) -> int:
    return BYTE_VOCAB + _LLAVA_TOKENS.index(token)


_LLAVA_IMAGE_SIZE = 64
_LLAVA_PATCH = 8

TINY_LLAVA = BuiltinSpec(
    name="tiny-llava-1.5",
    seed=4321,
    special_tokens=_LLAVA_TOKENS,
    config={
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "dtype": "float32",
        "image_token_index": _llava_id("<image>"),
        # The "default" strategy drops CLS, so one token per patch.
        "image_seq_length": (_LLAVA_IMAGE_SIZE // _LLAVA_PATCH) ** 2,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
        "pad_token_id": _llava_id("<pad>"),
        "text_config": {
            "model_type": "llama",
            "vocab_size": BYTE_VOCAB + len(_LLAVA_TOKENS),
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            # head_dim = hidden_size / heads = 32, the smallest head size vLLM's CPU
            # attention kernels accept.
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
            "initializer_range": INIT_STD,
            "tie_word_embeddings": False,
            "bos_token_id": _llava_id("<s>"),
            "eos_token_id": _llava_id("</s>"),
            "pad_token_id": _llava_id("<pad>"),
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            # Three layers, so the features LLaVA takes (the second-to-last layer's) have
            # two behind them: with one, training tells circles from squares far less well.
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "image_size": _LLAVA_IMAGE_SIZE,
            "patch_size": _LLAVA_PATCH,
            "projection_dim": 32,
            "hidden_act": "quick_gelu",
            "initializer_range": INIT_STD,
        },
    },
    tokenizer_config={
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": None,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "chat_template": LLAVA_CHAT_TEMPLATE,
    },
    generation_config={
        "bos_token_id": _llava_id("<s>"),
        "eos_token_id": _llava_id("</s>"),
        "pad_token_id": _llava_id("<pad>"),
        "do_sample": False,
    },
    preprocessor_config={
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "LlavaProcessor",
        "do_resize": True,
        "size": {"shortest_edge": _LLAVA_IMAGE_SIZE},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": _LLAVA_IMAGE_SIZE, "width": _LLAVA_IMAGE_SIZE},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": _CLIP_MEAN,
        "image_std": _CLIP_STD,
    },
    processor_config={
        "processor_class": "LlavaProcessor",
        "patch_size": _LLAVA_PATCH,
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
        "image_token": "<image>",
    },
    # The llava-hf layout of published LLaVA-1.5 checkpoints, which every loader
    # (transformers 4 and 5, vLLM) reads; transformers 5 alone would save another.
    weight_prefixes=(
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower.vision_model."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ),
    training=replace(_SHAPES_RECIPE, steps=2000, lr=1.5e-3),
)

BUILTIN_SPECS: dict[str, BuiltinSpec] = {s.name: s for s in (TINY_QWEN3_VL, TINY_LLAVA)}
