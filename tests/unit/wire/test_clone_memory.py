"""The decode-leg clone must not duplicate pixel bytes.

protobuf's upb runtime keeps message bytes in arenas allocated with C malloc,
which tracemalloc cannot see, so the test measures both: Python allocations
with tracemalloc and the bytes glibc's malloc has handed out (``mallinfo2``),
which do include the arenas. A control clone that copies the pixels proves
the malloc probe notices a 12 MiB copy.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import tracemalloc

import numpy as np

from tandem.wire.proto import GenerateRequest
from tandem.wire.requests import clone_without_mm_pixels
from tandem.wire.tensors import encode_tensor, tensor_nbytes

MIB = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2


def malloc_in_use() -> int:
    """Bytes currently handed out by malloc: small-chunk use plus mmapped blocks."""
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


def image_request() -> tuple[GenerateRequest, str]:
    pixels = np.random.default_rng(0).random((12 * MIB // 4,), dtype=np.float32)
    req = GenerateRequest(request_id="big")
    req.tokenized.input_ids.extend(range(64))
    req.mm_inputs.pixel_values.CopyFrom(encode_tensor(pixels))
    req.mm_inputs.model_specific_tensors["image_grid_thw"].CopyFrom(
        encode_tensor(np.array([[1, 64, 48]], dtype=np.int64))
    )
    req.mm_inputs.mm_hashes.append("h")
    req.mm_inputs.mm_placeholders.add(offset=1, length=60)
    digest = hashlib.sha256(pixels.tobytes()).hexdigest()
    return req, digest


def test_clone_allocates_far_less_than_the_pixels() -> None:
    req, digest = image_request()
    assert tensor_nbytes(req.mm_inputs.pixel_values) == 12 * MIB
    gc.collect()
    before = malloc_in_use()
    tracemalloc.start()
    clone = clone_without_mm_pixels(req)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    growth = malloc_in_use() - before
    assert traced_peak < 256 * 1024
    assert growth < 1 * MIB, f"clone allocated {growth / MIB:.1f} MiB"
    assert clone.ByteSize() < 4096
    assert not clone.mm_inputs.HasField("pixel_values")
    # The original still holds its pixel payload, byte for byte.
    assert hashlib.sha256(req.mm_inputs.pixel_values.inline).hexdigest() == digest


def test_control_a_full_copy_is_visible_to_the_probe() -> None:
    req, _ = image_request()
    gc.collect()
    before = malloc_in_use()
    copy = GenerateRequest()
    copy.CopyFrom(req)
    assert malloc_in_use() - before > 10 * MIB
    assert copy.ByteSize() > 12 * MIB
