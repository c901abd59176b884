"""Seeded weights of a built-in model (the only part of generation that needs torch)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig

from tandem.engine.builtin_specs import BuiltinSpec


def checkpoint_name(module_name: str, spec: BuiltinSpec) -> str:
    for module_prefix, file_prefix in spec.weight_prefixes:
        if module_name.startswith(module_prefix):
            return file_prefix + module_name[len(module_prefix) :]
    return module_name


def write_weights(directory: Path, spec: BuiltinSpec) -> None:
    """Initialise the model from ``directory``'s config.json with a fixed seed; save it.

    Initialisation is the model class's own (normal weights of std
    ``initializer_range``). The output-head rows of the special tokens are then
    zeroed: their logits are always 0 while some ordinary token almost surely
    scores higher, so greedy decoding never emits structural tokens (an image
    pad in the middle of an answer) and never stops early on EOS, which keeps
    test outputs long enough to compare.
    """
    config = AutoConfig.from_pretrained(directory)
    model_class = getattr(transformers, spec.config["architectures"][0])
    torch.manual_seed(spec.seed)
    with torch.device("cpu"):
        model = model_class(config).to(torch.float32).eval()
    head = model.get_output_embeddings()
    with torch.no_grad():
        for token in spec.special_tokens:
            head.weight[spec.token_id(token)].zero_()
    tensors = {
        checkpoint_name(name, spec): tensor.detach().contiguous()
        for name, tensor in model.state_dict().items()
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
