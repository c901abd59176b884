"""TokenSpeed ``GenerateRequest`` (and ``EncodeRequest``) bytes with each item's pixels
spliced in as its ``encoder_input``.

As for the other protocols (``tandem/wire/pixel_splice.py``, ``backends/sglang/splice.py``):
the message travels without pixels until it is serialized. TokenSpeed's pixels are per
item, inside a repeated field, so the splice rewrites ``mm_inputs``: the message is
serialized without it, then each item is written as its own bytes followed by
``encoder_input { shape dtype inline }`` holding its rows of the payload. Protobuf reads
the fields of a message in any order, so the worker parses exactly the message with the
pixels in place. At any instant the gateway holds the array and one outgoing buffer.
"""

from __future__ import annotations

from typing import Any

from tandem.gateway.backends.tokenspeed.mm_items import item_rows
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto_bytes import delimited_head
from tandem.wire.tokenspeed import tpb

_MM_INPUTS_FIELD = 9  # GenerateRequest.mm_inputs
_ENCODE_MM_INPUTS_FIELD = 2  # EncodeRequest.mm_inputs
_ITEMS_FIELD = 1  # MultimodalInputs.items
_ENCODER_INPUT_FIELD = 3  # MultimodalItem.encoder_input
_INLINE_FIELD = 3  # TensorData.inline


def serialize_with_pixels(message: Any, pixels: PixelPayload | None) -> bytes:
    """The wire bytes of ``message`` (a ``GenerateRequest`` or an ``EncodeRequest`` whose
    items hold no ``encoder_input``) with each item's rows of ``pixels`` as its input.

    ``pixels`` must be normalized, inline, and hold exactly the items' rows, in order.
    """
    if pixels is None:
        plain: bytes = message.SerializeToString()
        return plain
    if pixels.extra is not None or pixels.shm is not None or pixels.has_raw:
        raise ValueError("TokenSpeed legs take one normalized pixel batch, inline")
    field = (
        _MM_INPUTS_FIELD if isinstance(message, tpb.GenerateRequest) else _ENCODE_MM_INPUTS_FIELD
    )
    items = list(message.mm_inputs.items)
    if any(item.HasField("encoder_input") for item in items):
        raise ValueError("the message's items already hold their encoder_input")
    shape = pixels.shape
    if not shape or not items:
        raise ValueError("pixels need items to go with, and a row axis")
    data = pixels.array.data.cast("B")
    row_bytes = pixels.nbytes // shape[0] if shape[0] else 0
    parts: list[Any] = []
    start = 0
    for item in items:
        rows = item_rows(item)
        if start + rows > shape[0]:
            raise ValueError(f"the items need more than the {shape[0]} pixel rows given")
        tensor_head = tpb.TensorData(shape=[rows, *shape[1:]], dtype=pixels.dtype)
        head = tensor_head.SerializeToString()
        size = rows * row_bytes
        inline_head = delimited_head(_INLINE_FIELD, size)
        tensor_len = len(head) + len(inline_head) + size
        input_head = delimited_head(_ENCODER_INPUT_FIELD, tensor_len)
        body = item.SerializeToString()
        item_len = len(body) + len(input_head) + tensor_len
        parts += [delimited_head(_ITEMS_FIELD, item_len), body, input_head, head, inline_head]
        parts.append(data[start * row_bytes : start * row_bytes + size])
        start += rows
    if start != shape[0]:
        raise ValueError(f"the items own {start} of the {shape[0]} pixel rows given")
    inputs_len = sum(len(part) for part in parts)
    rest = type(message)()
    rest.CopyFrom(message)
    rest.ClearField("mm_inputs")
    # One join: the only full-size allocation; the array is read in place.
    return b"".join((rest.SerializeToString(), delimited_head(field, inputs_len), *parts))
