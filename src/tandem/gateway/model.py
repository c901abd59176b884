"""What the gateway knows of the served model: tokenizer, chat template, media processors.

The files come from ``--model-path`` or, by default, from the first worker's
``GetTokenizer`` stream, so a gateway needs no local copy of the model.
"""

from __future__ import annotations

import io
import logging
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from tandem.gateway.logprobs import TokenStrings
from tandem.gateway.prompt_tokens import DEFAULT_CAPACITY_TOKENS, PromptTokenCache
from tandem.models.chat import ChatTemplate
from tandem.models.info import ModelInfo, load_model_info
from tandem.models.processor import ImageProcessor, load_processor
from tandem.models.video import QwenVideoProcessor, load_video_processor

log = logging.getLogger("tandem.gateway")


@dataclass(slots=True)
class ModelHandle:
    model_id: str
    info: ModelInfo
    tokenizer: Tokenizer
    template: ChatTemplate
    processor: ImageProcessor | None
    # None: the model takes no video (or its checkpoint names no video tokens).
    video_processor: QwenVideoProcessor | None = None
    # Token ids of prompt pieces kept between requests (0: none; gateway/prompt_tokens.py).
    prompt_cache_tokens: int = DEFAULT_CAPACITY_TOKENS
    # Token texts and bytes for logprobs, cached for the model's lifetime.
    token_strings: TokenStrings = field(init=False)
    # When this gateway loaded the model (Unix seconds): /v1/models' "created".
    created: int = field(init=False)
    prompt_tokens: PromptTokenCache = field(init=False)

    def __post_init__(self) -> None:
        self.token_strings = TokenStrings(self.tokenizer)
        self.prompt_tokens = PromptTokenCache(self.tokenizer, self.prompt_cache_tokens)
        if self.prompt_cache_tokens > 0 and not self.prompt_tokens.enabled:
            log.info(
                "model %s: prompts are tokenized whole (%s)",
                self.model_id,
                self.prompt_tokens.off_reason,
            )
        self.created = int(time.time())

    @classmethod
    def from_dir(
        cls, model_dir: Path, model_id: str, prompt_cache_tokens: int = DEFAULT_CAPACITY_TOKENS
    ) -> ModelHandle:
        info = load_model_info(model_dir, model_id)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        template = ChatTemplate.from_model_dir(model_dir)
        try:
            processor = load_processor(model_dir, model_id)
        except (OSError, ValueError) as exc:
            log.warning("model %s: no image processor (%s); images will be refused", model_id, exc)
            processor = None
        video = load_video_processor(model_dir, info.takes_video and processor is not None)
        return cls(model_id, info, tokenizer, template, processor, video, prompt_cache_tokens)

    @classmethod
    def from_archive(
        cls, archive: bytes, model_id: str, prompt_cache_tokens: int = DEFAULT_CAPACITY_TOKENS
    ) -> ModelHandle:
        """Unpack a worker's tokenizer archive into a private temp dir and load from it.

        Everything is read into memory while loading, so the directory is removed after.
        """
        with tempfile.TemporaryDirectory(prefix="tandem-model-") as tmp:
            target = Path(tmp)
            with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
                for member in zipped.namelist():
                    # Plain file names only: an archive must not write outside its directory.
                    if "/" in member or "\\" in member or member.startswith("."):
                        raise ValueError(f"unexpected path in tokenizer archive: {member!r}")
                zipped.extractall(target)
            return cls.from_dir(target, model_id, prompt_cache_tokens)

    def encode(self, text: str, at_most: int | None = None) -> list[int]:
        """Blocking; a long text is encoded without holding the GIL (gateway/tokenizing.py),
        its pieces seen before taken from the prompt token cache (gateway/prompt_tokens.py).
        ``at_most``: TooManyTokens instead of a longer list."""
        return self.prompt_tokens.encode(text, at_most)
