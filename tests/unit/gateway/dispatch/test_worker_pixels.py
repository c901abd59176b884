"""A leg's pixels are normalized for its worker off the event loop (dispatch/streams.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pytest

from tandem.gateway.dispatch.streams import worker_pixels
from tandem.wire import pixels as pixels_module
from tandem.wire.pixels import PixelPayload


@dataclass
class _Worker:
    """Only what worker_pixels reads of a registry worker."""

    device_normalizes: bool


def raw_payload() -> PixelPayload:
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(2, 3, 8, 8), dtype=np.uint8)
    lut = rng.random((3, 256), dtype=np.float32)
    return PixelPayload.raw(raw, lut, "float32")


async def test_normalized_in_a_thread_and_equal_to_the_inline_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = pixels_module.normalize_raw

    def spy(raw: np.ndarray, lut: np.ndarray) -> np.ndarray:
        seen.append(threading.get_ident())
        return real(raw, lut)

    monkeypatch.setattr(pixels_module, "normalize_raw", spy)
    payload = raw_payload()
    ready = await worker_pixels(payload, _Worker(device_normalizes=False))  # type: ignore[arg-type]
    assert seen and loop_thread not in seen  # not on the event loop's thread
    assert ready is not None and ready.normalize_lut is None
    inline = payload.for_worker(False)
    assert ready.dtype == inline.dtype and ready.shape == inline.shape
    assert bytes(ready.array) == bytes(inline.array)
    # send() then has nothing left to convert: the same payload goes out.
    assert ready.for_worker(False) is ready


async def test_nothing_to_do_stays_on_the_loop() -> None:
    payload = raw_payload()
    assert await worker_pixels(None, _Worker(False)) is None  # type: ignore[arg-type]
    assert await worker_pixels(payload, _Worker(True)) is payload  # type: ignore[arg-type]
    normalized = payload.for_worker(False)
    assert await worker_pixels(normalized, _Worker(False)) is normalized  # type: ignore[arg-type]
