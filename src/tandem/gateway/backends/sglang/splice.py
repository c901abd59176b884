"""SGLang's ``GenerateRequest`` bytes with the pixel payload spliced in.

As for vLLM (``tandem/wire/pixel_splice.py``): the request travels without its pixels
until it is serialized, and then the pixels are appended as
``mm_inputs { pixel_values { shape dtype data } }``, which protobuf merges into the
request's own ``mm_inputs``. SGLang's tensors are inline bytes only, so there is no
shared-memory form; at any instant the gateway holds the array and one outgoing buffer.
"""

from __future__ import annotations

from tandem.wire.pixels import PixelPayload
from tandem.wire.proto_bytes import delimited_head
from tandem.wire.sglang import spb

_MM_INPUTS_FIELD = 3  # GenerateRequest.mm_inputs
_PIXEL_VALUES_FIELD = 4  # MultimodalInputs.pixel_values
_DATA_FIELD = 1  # TensorData.data


def serialize_with_pixels(request: spb.GenerateRequest, pixels: PixelPayload | None) -> bytes:
    """The wire bytes of ``request`` with ``pixels`` as its ``mm_inputs.pixel_values``.

    ``pixels`` must be in the form the worker takes (normalized: SGLang workers do not
    normalize on device), and ``request`` must not hold pixel values itself.
    """
    if pixels is None:
        plain: bytes = request.SerializeToString()
        return plain
    if request.mm_inputs.HasField("pixel_values"):
        raise ValueError("the request already holds pixel_values")
    if pixels.extra is not None or pixels.shm is not None or pixels.has_raw:
        raise ValueError("SGLang legs take one normalized pixel batch, inline")
    head: bytes = request.SerializeToString()
    tensor_head = spb.TensorData(shape=pixels.shape, dtype=pixels.dtype).SerializeToString()
    data_head = delimited_head(_DATA_FIELD, pixels.nbytes)
    tensor_len = len(tensor_head) + len(data_head) + pixels.nbytes
    values_head = delimited_head(_PIXEL_VALUES_FIELD, tensor_len)
    batch_head = delimited_head(_MM_INPUTS_FIELD, len(values_head) + tensor_len)
    # One join: the only full-size allocation; the array is read in place.
    return b"".join(
        (head, batch_head, values_head, tensor_head, data_head, pixels.array.data.cast("B"))
    )
