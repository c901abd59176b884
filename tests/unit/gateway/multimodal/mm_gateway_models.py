"""The built-in models as the gateway multimodal tests use them (unique module name: test
directories have no packages, so a shared helper must not be called ``conftest``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

from tandem.models import ImageProcessor, ModelInfo, load_model_info, load_processor, render_chat


@dataclass
class Model:
    name: str
    model_dir: Path

    @cached_property
    def info(self) -> ModelInfo:
        return load_model_info(self.model_dir)

    @cached_property
    def processor(self) -> ImageProcessor:
        return load_processor(self.model_dir)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))

    def prompt_ids(self, urls: Sequence[str], text: str = "What is in the picture?") -> list[int]:
        """Render a one-turn chat with one image part per URL and tokenize it, as the gateway
        does before planning media."""
        parts: list[dict[str, object]] = [
            {"type": "image_url", "image_url": {"url": url}} for url in urls
        ]
        parts.append({"type": "text", "text": text})
        prompt = render_chat(self.model_dir, [{"role": "user", "content": parts}])
        return self.tokenizer.encode(prompt, add_special_tokens=False).ids
