"""Pixel payloads kept outside the protobuf message until the bytes go on the wire.

Putting a pixel tensor into a ``GenerateRequest`` costs copies: numpy → ``bytes``
→ the message's arena, and then the message's own serialization. Instead the
gateway keeps the tensor as an array beside a pixel-free request and writes the
one serialized message itself: protobuf merges repeated occurrences of a
message field, so appending ``mm_inputs { pixel_values { … } }`` to the
serialized pixel-free request is the same message a peer would get from a
request holding the pixels. At any instant at most the array and the one
outgoing buffer exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tandem.wire.proto import GenerateRequest, TensorData
from tandem.wire.tensors import wire_payload

_MM_INPUTS_FIELD = 7  # GenerateRequest.mm_inputs
_PIXEL_VALUES_FIELD = 2  # MultimodalInputs.pixel_values
_INLINE_FIELD = 1  # TensorData.inline
_LENGTH_DELIMITED = 2


@dataclass(slots=True)
class PixelPayload:
    """A pixel tensor already in its wire layout (C order, little-endian, wire dtype)."""

    array: np.ndarray
    shape: tuple[int, ...]
    dtype: str

    @classmethod
    def from_array(cls, array: np.ndarray, dtype: str = "float32") -> PixelPayload:
        payload, wire = wire_payload(array, dtype)
        return cls(payload, tuple(int(d) for d in array.shape), wire)

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(field: int) -> bytes:
    return _varint(field << 3 | _LENGTH_DELIMITED)


def serialize_with_pixels(request: GenerateRequest, pixels: PixelPayload | None) -> bytes:
    """The wire bytes of ``request`` with ``pixels`` as its ``mm_inputs.pixel_values``.

    ``request`` must not carry pixel_values itself (that would be two payloads).
    """
    head = request.SerializeToString()
    if pixels is None:
        return head
    if request.mm_inputs.HasField("pixel_values"):
        raise ValueError("the request already holds pixel_values")
    tensor_head = TensorData(shape=pixels.shape, dtype=pixels.dtype).SerializeToString()
    tensor_len = len(tensor_head) + len(_key(_INLINE_FIELD)) + len(_varint(pixels.nbytes))
    tensor_len += pixels.nbytes
    batch_len = len(_key(_PIXEL_VALUES_FIELD)) + len(_varint(tensor_len)) + tensor_len
    # One join: the only full-size allocation; the array is read in place.
    return b"".join(
        (
            head,
            _key(_MM_INPUTS_FIELD),
            _varint(batch_len),
            _key(_PIXEL_VALUES_FIELD),
            _varint(tensor_len),
            tensor_head,
            _key(_INLINE_FIELD),
            _varint(pixels.nbytes),
            memoryview(pixels.array).cast("B"),
        )
    )
