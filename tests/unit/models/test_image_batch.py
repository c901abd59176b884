"""One image decoded at a time: the same arrays as one batch, and a peak known up front."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tandem.media import MediaDecodeFailed, MediaPolicy, decode_image
from tandem.models.image_batch import decode_cost, join_pixels, preprocess_one_at_a_time
from tandem.models.processor import ImageProcessor, load_processor

POLICY = MediaPolicy()
MiB = 1 << 20


@pytest.fixture(scope="module", params=["tiny-qwen3-vl", "tiny-llava-1.5"])
def processor(request: pytest.FixtureRequest, meta_dirs: dict[str, Path]) -> ImageProcessor:
    return load_processor(meta_dirs[request.param])


def png(size: tuple[int, int], mode: str = "RGB", seed: int = 0, **options: object) -> bytes:
    rng = np.random.default_rng(seed)
    bands = len(Image.new(mode, (1, 1)).getbands())
    shape = (size[1], size[0], bands) if bands > 1 else (size[1], size[0])
    image = Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **options)
    return buffer.getvalue()


BLOBS = [png((64, 48), seed=1), png((300, 120), "L", seed=2), png((50, 90), "RGBA", seed=3)]


def decode(blob: bytes) -> Image.Image:
    return decode_image(blob, POLICY)


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "float"])
def test_one_at_a_time_gives_the_batch_arrays(processor: ImageProcessor, raw: bool) -> None:
    batch = processor.preprocess([decode(b) for b in BLOBS], raw=raw)
    one_by_one = preprocess_one_at_a_time(BLOBS, decode, processor, raw=raw)
    assert one_by_one.pixel_values.dtype == batch.pixel_values.dtype
    np.testing.assert_array_equal(one_by_one.pixel_values, batch.pixel_values)
    assert one_by_one.tokens_per_image == batch.tokens_per_image
    assert one_by_one.grids.keys() == batch.grids.keys()
    for key in batch.grids:
        np.testing.assert_array_equal(one_by_one.grids[key], batch.grids[key])
    if batch.patches_per_image is None:
        assert one_by_one.patches_per_image is None
    else:
        np.testing.assert_array_equal(one_by_one.patches_per_image, batch.patches_per_image)
    assert (one_by_one.normalize_lut is None) == (batch.normalize_lut is None)


def test_each_image_is_freed_before_the_next_is_decoded(processor: ImageProcessor) -> None:
    decoded: list[Image.Image] = []

    def watched(blob: bytes) -> Image.Image:
        for earlier in decoded:
            with pytest.raises(ValueError, match="closed"):
                earlier.getpixel((0, 0))  # closed: its pixel memory is gone
        image = decode(blob)
        decoded.append(image)
        return image

    preprocess_one_at_a_time(BLOBS * 2, watched, processor, raw=True)
    assert len(decoded) == 2 * len(BLOBS)


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "float"])
def test_the_cost_is_known_from_the_headers(processor: ImageProcessor, raw: bool) -> None:
    cost = decode_cost(BLOBS, POLICY, processor, raw=raw)
    made = preprocess_one_at_a_time(BLOBS, decode, processor, raw=raw)
    assert cost.outputs == made.pixel_values.nbytes  # exact for the built-in processors
    # The largest single image: 300x120 L, its RGB copy, and its share of the outputs.
    assert cost.working >= 300 * 120 * (1 + 4)
    assert cost.total == cost.working + cost.outputs


def test_a_bad_header_is_refused_before_anything_is_decoded(processor: ImageProcessor) -> None:
    with pytest.raises(MediaDecodeFailed):
        decode_cost([*BLOBS, b"\x89PNG\r\n\x1a\n junk"], POLICY, processor)


# Run in a fresh interpreter, so that memory other tests freed (and the allocator keeps for
# reuse) neither hides this peak nor adds to it.
_PEAK_SCRIPT = """
import ctypes, io, json, sys
from PIL import Image
import numpy as np
from tandem.media import MediaPolicy, decode_image
from tandem.models.image_batch import decode_cost, preprocess_one_at_a_time
from tandem.models.processor import load_processor

def status_kib(key):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1])

def png(mode, options):
    image = Image.new(mode, (2048, 2048), 7 if mode == "L" else (7, 8, 9))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1, **options)
    return buffer.getvalue()

policy = MediaPolicy()
decode = lambda blob: decode_image(blob, policy)
results = []
for model_dir in sys.argv[1:]:
    processor = load_processor(model_dir)
    for mode, options in (("RGB", {}), ("L", {}), ("RGB", {"transparency": (1, 2, 3)})):
        blob = png(mode, options)
        cost = decode_cost([blob], policy, processor)
        preprocess_one_at_a_time([png("RGB", {})], decode, processor)  # warm up
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM := VmRSS
        base = status_kib("VmRSS")
        made = preprocess_one_at_a_time([blob], decode, processor)
        peak = (status_kib("VmHWM") - base) * 1024
        del made
        results.append([model_dir, mode, options != {}, peak, cost.working])
print(json.dumps(results))
"""


@pytest.mark.processes  # measures a child process's peak memory
def test_the_measured_peak_stays_within_the_charge(meta_dirs: dict[str, Path]) -> None:
    """Decoding and preprocessing one 2048x2048 image peaks at most at its charge."""
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("this kernel does not let a process reset its peak RSS")
    dirs = [str(meta_dirs[name]) for name in ("tiny-qwen3-vl", "tiny-llava-1.5")]
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_SCRIPT, *dirs],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == 6
    for model_dir, mode, keyed, peak, working in results:
        case = (Path(model_dir).name, mode, keyed, peak / MiB, working / MiB)
        assert peak <= working + 4 * MiB, case
        # ...and the charge is not wildly pessimistic either.
        assert working <= 1.25 * peak + 4 * MiB, case


def test_join_refuses_parts_of_different_shapes() -> None:
    parts = [np.zeros((1, 3, 4, 4), np.uint8), np.zeros((1, 3, 4, 5), np.uint8)]
    with pytest.raises(ValueError, match="different sizes"):
        join_pixels(parts)
    joined = join_pixels([np.ones((2, 3), np.uint8), np.zeros((1, 3), np.uint8)])
    np.testing.assert_array_equal(joined, [[1, 1, 1], [1, 1, 1], [0, 0, 0]])
