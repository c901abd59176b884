"""One image's features as a stream of byte frames, and back (``embedding_channel.py``).

Frame 0 is a JSON header: ``{"digest", "dtype": "float32", "tokens", "hidden",
"deepstack"}``. The frames after it are the raw little-endian float32 bytes of the
embeddings ``[tokens, hidden]`` and then of each DeepStack layer (same shape), in that
order, cut into pieces of at most ``chunk_bytes``: a realistic image's features (hundreds
of tokens, thousands of dims, several layers: tens of MB) stay far below any gRPC
message limit, whatever the receiver's options.

The reader trusts nothing: the header's sizes are checked and bounded before anything
is allocated, a frame past the announced size and a stream that ends short are refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tandem.engine.types import ImageFeatures

CHUNK_BYTES = 1 << 20
MAX_FEATURE_BYTES = 1 << 30  # a header announcing more is refused before allocating
MAX_DEEPSTACK_LAYERS = 64


class EmbeddingFrameError(ValueError):
    """The frames do not form one image's features (a peer's bug or another version)."""


@dataclass(slots=True, frozen=True)
class PulledEmbedding:
    digest: str  # the key the encode worker computed the features under
    features: ImageFeatures  # float32, on the CPU, owned by the receiver


def encode_features(
    digest: str, features: ImageFeatures, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[bytes]:
    """The frames of ``features``; tensors of another float dtype are sent as float32."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    tensors = [features.embeds, *features.deepstack]
    shape = tuple(features.embeds.shape)
    if len(shape) != 2 or any(tuple(t.shape) != shape for t in tensors):
        raise ValueError(
            f"features must be [tokens, hidden] tensors of one shape, got "
            f"{[list(t.shape) for t in tensors]}"
        )
    header = {
        "digest": digest,
        "dtype": "float32",
        "tokens": shape[0],
        "hidden": shape[1],
        "deepstack": len(features.deepstack),
    }
    yield json.dumps(header).encode()
    for tensor in tensors:
        data = _float32_bytes(tensor)
        for first in range(0, len(data), chunk_bytes):
            yield bytes(data[first : first + chunk_bytes])


class FeaturesReader:
    """Reads the frames of one image's features as they arrive: ``feed`` each, then
    ``result``."""

    def __init__(self) -> None:
        self._header: dict[str, Any] | None = None
        self._buffer = bytearray()
        self._filled = 0

    def feed(self, frame: bytes) -> None:
        if self._header is None:
            self._header = _read_header(frame)
            self._buffer = bytearray(_total_bytes(self._header))
            return
        end = self._filled + len(frame)
        if end > len(self._buffer):
            raise EmbeddingFrameError(
                f"embedding frames carry more than the {len(self._buffer)} bytes announced"
            )
        self._buffer[self._filled : end] = frame
        self._filled = end

    def result(self) -> PulledEmbedding:
        if self._header is None:
            raise EmbeddingFrameError("the embedding stream ended before its header")
        if self._filled != len(self._buffer):
            raise EmbeddingFrameError(
                f"the embedding stream ended after {self._filled} of {len(self._buffer)} bytes"
            )
        h = self._header
        layers = 1 + h["deepstack"]
        array = np.frombuffer(self._buffer, dtype="<f4").reshape(layers, h["tokens"], h["hidden"])
        stacked = torch.from_numpy(array)  # shares the buffer: no second copy
        features = ImageFeatures(stacked[0], [stacked[i] for i in range(1, layers)])
        return PulledEmbedding(h["digest"], features)


def _float32_bytes(tensor: torch.Tensor) -> memoryview:
    if not tensor.dtype.is_floating_point:
        raise ValueError(f"features must be floating point, got {tensor.dtype}")
    array = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
    return np.ascontiguousarray(array, dtype="<f4").data.cast("B")


def _read_header(frame: bytes) -> dict[str, Any]:
    try:
        header = json.loads(frame.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EmbeddingFrameError(f"the embedding header is not JSON: {error}") from error
    if not isinstance(header, dict):
        raise EmbeddingFrameError("the embedding header is not a JSON object")
    if not isinstance(header.get("digest"), str):
        raise EmbeddingFrameError("the embedding header has no digest string")
    if header.get("dtype") != "float32":
        raise EmbeddingFrameError(f"embedding dtype {header.get('dtype')!r}, not 'float32'")
    for key, low in (("tokens", 1), ("hidden", 1), ("deepstack", 0)):
        value = header.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise EmbeddingFrameError(f"embedding header {key}={value!r}: not an integer >= {low}")
    if header["deepstack"] > MAX_DEEPSTACK_LAYERS:
        raise EmbeddingFrameError(f"{header['deepstack']} DeepStack layers is implausible")
    if _total_bytes(header) > MAX_FEATURE_BYTES:
        raise EmbeddingFrameError(
            f"embedding of {_total_bytes(header)} bytes exceeds {MAX_FEATURE_BYTES}"
        )
    return header


def _total_bytes(header: dict[str, Any]) -> int:
    return int((1 + header["deepstack"]) * header["tokens"] * header["hidden"] * 4)
