"""Seeded, trained weights of a built-in model (the only part of generation that needs torch)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoConfig

from tandem.engine.builtin_specs import BuiltinSpec
from tandem.engine.builtin_training import train


def checkpoint_name(module_name: str, spec: BuiltinSpec) -> str:
    for module_prefix, file_prefix in spec.weight_prefixes:
        if module_name.startswith(module_prefix):
            return file_prefix + module_name[len(module_prefix) :]
    return module_name


def write_weights(directory: Path, spec: BuiltinSpec) -> None:
    """Initialise the model from ``directory``'s config.json with a fixed seed, train it on
    the spec's recipe (engine/builtin_training.py) and save it.

    ``directory`` must already hold the tokenizer, template and processor files: training
    renders its examples with them.
    """
    config = AutoConfig.from_pretrained(directory)
    model_class = getattr(transformers, spec.config["architectures"][0])
    torch.manual_seed(spec.seed)
    with torch.device("cpu"):
        model = model_class(config).to(torch.float32).eval()
    train(model, directory, spec)
    tensors = {
        checkpoint_name(name, spec): tensor.detach().contiguous()
        for name, tensor in model.state_dict().items()
    }
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
