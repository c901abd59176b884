"""Conversion between the engine's KV layout and transformers' DynamicCache.

The engine keeps ``[num_kv_heads, seq_len, head_dim]`` per layer (see
`tandem.engine.types`); DynamicCache layers hold ``[batch, heads, seq, dim]``.
Seeding a cache only takes views, and the model's own update concatenates into
new tensors, so the caller's KV tensors are never written to: prefix-cache
blocks and exported KV can keep referring to them safely.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache, PreTrainedConfig

from tandem.engine.types import KVLayers, ModelShape


def check_kv(kv: KVLayers, shape: ModelShape) -> int:
    """Validate a KV list against the model's shape; return the tokens it covers."""
    if len(kv) != shape.num_layers:
        raise ValueError(f"KV has {len(kv)} layers; the model has {shape.num_layers}")
    length = kv[0][0].shape[1] if kv else 0
    for i, (k, v) in enumerate(kv):
        for name, tensor in (("key", k), ("value", v)):
            expected = (shape.num_kv_heads, length, shape.head_dim)
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"layer {i} {name} has shape {tuple(tensor.shape)}; expected {expected}"
                )
            if tensor.dtype != torch.float32:
                raise ValueError(f"layer {i} {name} is {tensor.dtype}; expected float32")
    return length


def cache_from_kv(kv: KVLayers | None, text_config: PreTrainedConfig) -> DynamicCache:
    cache = DynamicCache(config=text_config)
    if not kv:
        return cache
    layers: list[Any] = list(cache.layers)  # full-attention layers of a DynamicCache
    for layer, (k, v) in zip(layers, kv, strict=True):
        key, value = k.unsqueeze(0), v.unsqueeze(0)
        layer.lazy_initialization(key, value)
        layer.keys, layer.values = key, value
    return cache


def kv_from_cache(cache: DynamicCache) -> KVLayers:
    layers: list[Any] = list(cache.layers)  # full-attention layers of a DynamicCache
    return [(layer.keys[0], layer.values[0]) for layer in layers]
