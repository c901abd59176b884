"""vLLM's ``GenerateRequest`` bytes with a :class:`PixelPayload` spliced in (``pixels.py``).

Putting a pixel tensor into a ``GenerateRequest`` costs copies: numpy → ``bytes`` → the
message's arena, and then the message's own serialization. Protobuf merges repeated
occurrences of a message field, so appending ``mm_inputs { pixel_values { … } }`` to the
serialized pixel-free request is the same message a peer would get from a request holding
the pixels: at any instant at most the array and the one outgoing buffer exist, and over
Tandem's HTTP/2 client not even that buffer (:func:`message_parts`: the array is written
to the socket from where it lies).
"""

from __future__ import annotations

from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest, MultimodalInputs, TensorData
from tandem.wire.proto_bytes import field_key as _key
from tandem.wire.proto_bytes import varint as _varint

_MM_INPUTS_FIELD = 7  # GenerateRequest.mm_inputs
_PIXEL_VALUES_FIELD = 2  # MultimodalInputs.pixel_values
_INLINE_FIELD = 1  # TensorData.inline


def serialize_with_pixels(request: GenerateRequest, pixels: PixelPayload | None) -> bytes:
    """The wire bytes of ``request`` with ``pixels`` as its ``mm_inputs.pixel_values``
    (and ``pixels.extra`` as its ``extra_mm_inputs[0].pixel_values``).

    ``request`` must not carry pixel_values itself (that would be two payloads).
    """
    parts = message_parts(request, pixels)
    if len(parts) == 1 and isinstance(parts[0], bytes):
        return parts[0]
    # One join: the only full-size allocation; the array is read in place.
    return b"".join(parts)


def message_parts(
    request: GenerateRequest, pixels: PixelPayload | None
) -> tuple[bytes | memoryview, ...]:
    """:func:`serialize_with_pixels`'s bytes as pieces to send one after another: the
    inline pixels are the last piece, a byte view of the array itself, so a sender that
    writes pieces (Tandem's HTTP/2 client) never copies them. The array must not change
    until the pieces are written (pixel arrays are never written after they are made).
    """
    if pixels is None:
        plain: bytes = request.SerializeToString()
        return (plain,)
    if request.mm_inputs.HasField("pixel_values"):
        raise ValueError("the request already holds pixel_values")
    if pixels.extra is not None:
        # The second batch's pixels go into a copy of the (pixel-free) request: a repeated
        # field cannot be merged into by appending bytes, as mm_inputs can.
        extra, with_extra = pixels.extra, GenerateRequest()
        with_extra.CopyFrom(request)
        target = with_extra.extra_mm_inputs[0].pixel_values
        target.shape.extend(extra.shape)
        target.dtype = extra.dtype
        target.inline = extra.array.tobytes()
        request = with_extra
    head: bytes = request.SerializeToString()
    if pixels.shm is not None:
        # Only the handle travels: a small message, serialized the ordinary way.
        tail = MultimodalInputs(
            pixel_values=TensorData(shape=pixels.shape, dtype=pixels.dtype, shm=pixels.shm)
        ).SerializeToString()
        return (b"".join((head, _key(_MM_INPUTS_FIELD), _varint(len(tail)), tail)),)
    tensor_head = TensorData(shape=pixels.shape, dtype=pixels.dtype).SerializeToString()
    tensor_len = len(tensor_head) + len(_key(_INLINE_FIELD)) + len(_varint(pixels.nbytes))
    tensor_len += pixels.nbytes
    batch_len = len(_key(_PIXEL_VALUES_FIELD)) + len(_varint(tensor_len)) + tensor_len
    fields = b"".join(
        (
            head,
            _key(_MM_INPUTS_FIELD),
            _varint(batch_len),
            _key(_PIXEL_VALUES_FIELD),
            _varint(tensor_len),
            tensor_head,
            _key(_INLINE_FIELD),
            _varint(pixels.nbytes),
        )
    )
    return (fields, pixels.array.data.cast("B"))
