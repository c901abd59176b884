"""Load a checkpoint directory as a torch module: the full model or its language model only.

Both forms expose the same two attributes the runner uses,
``model.model.language_model`` (the decoder stack with its embeddings) and
``model.lm_head``, with parameter names identical to the full model's. A
language-model-only load never constructs the vision tower: a decode worker
that receives KV from a prefill worker needs no image encoder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedConfig
from transformers.utils import logging as hf_logging

from tandem.models.info import load_model_info

# Checkpoint-name prefix → module-name prefix of the language-model weights.
# The second group is the llava-hf layout used by published LLaVA checkpoints.
_LANGUAGE_PREFIXES: tuple[tuple[str, str], ...] = (
    ("model.language_model.", "model.language_model."),
    ("lm_head.", "lm_head."),
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
)


class LanguageModelOnly(nn.Module):
    """The decoder stack and output head of a vision-language model, nothing else."""

    def __init__(self, config: PreTrainedConfig) -> None:
        super().__init__()
        self.config = config
        text_config = config.get_text_config()
        self.model = nn.Module()
        self.model.language_model = AutoModel.from_config(text_config, attn_implementation="sdpa")
        self.lm_head = nn.Linear(text_config.hidden_size, text_config.vocab_size, bias=False)


def load_model(model_dir: str | Path, language_model_only: bool = False) -> nn.Module:
    """Load fp32 weights for CPU inference; the module is returned in eval mode."""
    model_dir = Path(model_dir)
    if language_model_only:
        return _load_language_model(model_dir)
    family = load_model_info(model_dir).family
    model_class = getattr(transformers, family.hf_class)
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = model_class.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
    return model.eval()


def _load_language_model(model_dir: Path) -> LanguageModelOnly:
    config = AutoConfig.from_pretrained(model_dir)
    model = LanguageModelOnly(config).to(torch.float32)
    state = dict(_language_weights(model_dir))
    text_config = config.get_text_config()
    if "lm_head.weight" not in state and getattr(text_config, "tie_word_embeddings", False):
        state["lm_head.weight"] = state["model.language_model.embed_tokens.weight"]
    # strict: every language-model parameter must come from the checkpoint.
    model.load_state_dict(state, strict=True)
    return model.eval()


def _language_weights(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in _weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                for file_prefix, module_prefix in _LANGUAGE_PREFIXES:
                    if name.startswith(file_prefix):
                        tensor = f.get_tensor(name).to(torch.float32)
                        yield module_prefix + name[len(file_prefix) :], tensor
                        break


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        return [model_dir / name for name in sorted(set(shards))]
    single = model_dir / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{model_dir} holds no model.safetensors")
    return [single]
