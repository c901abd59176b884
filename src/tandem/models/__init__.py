"""Torch-free model-family logic shared by the gateway and the worker.

Family specs, checkpoint facts, chat templates, image preprocessing and
placeholder expansion. Nothing in this package may import torch: the gateway
runs without it (a unit test enforces this).
"""

from tandem.models.chat import ChatTemplate, ChatTemplateError, render_chat
from tandem.models.family import (
    FAMILIES,
    LLAVA,
    QWEN3_VL,
    ModelFamily,
    UnsupportedModelError,
    detect_family,
)
from tandem.models.info import ModelInfo, load_model_info
from tandem.models.placeholders import PlaceholderCountError, expand_placeholders
from tandem.models.processor import ImageProcessor, PreprocessedImages, load_processor

__all__ = [
    "FAMILIES",
    "LLAVA",
    "QWEN3_VL",
    "ChatTemplate",
    "ChatTemplateError",
    "ImageProcessor",
    "ModelFamily",
    "ModelInfo",
    "PlaceholderCountError",
    "PreprocessedImages",
    "UnsupportedModelError",
    "detect_family",
    "expand_placeholders",
    "load_model_info",
    "load_processor",
    "render_chat",
]
