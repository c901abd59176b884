"""The cache misses of one request: decoded and preprocessed in the image pool or a thread.

The budget is charged for the request's peak before a single pixel is decoded; each
image's share of the decode working set is given back when the pool (or the thread) is
done with it, even if the request was cancelled meanwhile (gateway/multimodal/process.py
is the entry point; docs/operations.md, "Memory bounds for images").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tandem.errors import TandemError
from tandem.gateway.multimodal.pixel_cache import OneImage
from tandem.gateway.multimodal.pool import ImagePool, PendingImage
from tandem.gateway.multimodal.pool_spec import ProcessorSpec
from tandem.gateway.multimodal.pool_worker import decode_and_preprocess
from tandem.media import MediaPolicy
from tandem.media.budget import ByteLease, run_in_thread_holding
from tandem.models.image_batch import DecodeCost
from tandem.models.processor import ImageProcessor, PreprocessedImages


@dataclass(slots=True)
class MediaTimings:
    """Seconds spent per stage of one request's media, for the gateway's metrics and timing logs."""

    fetch_s: float = 0.0
    decode_s: float = 0.0
    preprocess_s: float = 0.0


def held_bytes(image: OneImage | None) -> int:
    return 0 if image is None else image.pixels.nbytes


class _Countdown:
    """Releases ``lease`` when the last of ``count`` images is done with it."""

    __slots__ = ("_lease", "_left")

    def __init__(self, lease: ByteLease, count: int) -> None:
        self._lease = lease
        self._left = count

    def release(self) -> None:
        self._left -= 1
        if self._left == 0:
            self._lease.release()


@dataclass(slots=True)
class MissWork:
    """The cache misses of one request, decoded and preprocessed in the pool or a thread."""

    blobs: Sequence[bytes]
    misses: list[int]
    costs: list[DecodeCost]
    processor: ImageProcessor
    policy: MediaPolicy
    timings: MediaTimings

    def _charge(
        self, lease: ByteLease, images: Sequence[OneImage | None], parallel: int
    ) -> tuple[int, int]:
        """Charge the request's peak before a pixel is decoded: (images at once, the
        decode working bytes charged).

        The pixel values of every image (hits at their real size), plus the decode
        working set of the ``parallel`` largest misses, as that many run at once. If that
        does not fit, one at a time, as in-process decoding does: the same refusals then.
        """
        outputs = sum(held_bytes(image) for image in images)
        outputs += sum(self.costs[i].outputs for i in self.misses)
        working = sorted((self.costs[i].working for i in self.misses), reverse=True)
        if parallel > 1:
            try:
                lease.hold(outputs + sum(working[:parallel]))
                return parallel, sum(working[:parallel])
            except TandemError:  # the budget's refusal; one at a time may still fit
                pass
        lease.hold(outputs + working[0])  # refused (413/429) before a single pixel is decoded
        return 1, working[0]

    async def in_pool(
        self,
        pool: ImagePool,
        spec: ProcessorSpec,
        lease: ByteLease | None,
        images: Sequence[OneImage | None],
    ) -> list[OneImage]:
        parallel = min(pool.workers, len(self.misses))
        decoding: _Countdown | None = None
        if lease is not None:
            # Released when the pool is done with the last of these images, even if this
            # request is cancelled meanwhile (the pool process still holds the frames).
            parallel, working = self._charge(lease, images, parallel)
            decoding = _Countdown(lease.split(working), len(self.misses))
        made: list[OneImage] = []
        if parallel == 1:
            for n, i in enumerate(self.misses):
                try:
                    pending = pool.submit(self.blobs[i], spec, self.policy, True, decoding)
                except BaseException:
                    self._give_back(decoding, len(self.misses) - n - 1)
                    raise
                try:
                    made.append(self._timed(await pending.result()))
                except BaseException:
                    self._give_back(decoding, len(self.misses) - n - 1)
                    raise
            return made
        queued: list[PendingImage] = []
        try:
            for n, i in enumerate(self.misses):
                try:
                    queued.append(pool.submit(self.blobs[i], spec, self.policy, True, decoding))
                except BaseException:
                    self._give_back(decoding, len(self.misses) - n - 1)
                    raise
            for pending in queued:
                made.append(self._timed(await pending.result()))
        except BaseException:
            for pending in queued[len(made) :]:
                pending.abandon()  # the rest of a failed request: queued ones never run
            raise
        return made

    def _timed(self, answer: tuple[OneImage, float, float]) -> OneImage:
        image, decode_s, preprocess_s = answer
        self.timings.decode_s += decode_s
        self.timings.preprocess_s += preprocess_s
        return image

    @staticmethod
    def _give_back(decoding: _Countdown | None, unsubmitted: int) -> None:
        # Images never submitted release their share here (submitted ones on completion).
        for _ in range(unsubmitted if decoding is not None else 0):
            assert decoding is not None
            decoding.release()

    async def in_thread(
        self, lease: ByteLease | None, images: Sequence[OneImage | None]
    ) -> list[OneImage]:
        decoding = None
        if lease is not None:
            _, working = self._charge(lease, images, 1)
            # The decoded frames' share stays charged until the thread is done with them,
            # even if this request is cancelled meanwhile; the rest is the pixel values'.
            decoding = lease.split(working)
        return await run_in_thread_holding(decoding, self._decode_misses)

    def _decode_misses(self) -> list[OneImage]:
        # Runs in a worker thread: one image decoded, preprocessed and freed at a time.
        made: list[OneImage] = []
        for i in self.misses:
            pre, decode_s, preprocess_s = decode_and_preprocess(
                self.blobs[i], self.processor, self.policy, raw=True
            )
            self.timings.decode_s += decode_s
            self.timings.preprocess_s += preprocess_s
            made.append(_one(pre))
        return made


def _one(pre: PreprocessedImages) -> OneImage:
    patches = pre.patches_per_image
    grids = {key: np.asarray(value) for key, value in pre.grids.items()}
    return OneImage(
        pre.pixel_values, int(pre.tokens_per_image[0]), grids, patches, pre.normalize_lut
    )
