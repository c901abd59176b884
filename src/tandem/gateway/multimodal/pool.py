"""The image pool (``--mm-workers N``): decode + preprocess in processes, not the loop's.

Decoding and preprocessing run Python code (Pillow, numpy) that holds the GIL; in a thread
of the gateway process they slow token relaying of every other stream down. Here each image
goes to one of N single-process executors (the least busy), so one request's images spread
over the pool, and the pixels come back through a /dev/shm file mapped without a copy
(gateway/multimodal/pixel_segments.py).

One executor per process: when a process dies (out-of-memory kill, a decoder crash) only
the images it had queued or running fail, with 500 ``multimodal_pool_process_died``, and
that executor alone is replaced; the others keep serving. Processes are forked from a
forkserver, never from the gateway (it has a running event loop and gRPC channels), with
the imports already done (pool_preload.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import pickle
import threading
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Protocol
from weakref import WeakKeyDictionary

from blake3 import blake3

from tandem.errors import make_error
from tandem.gateway import metrics
from tandem.gateway.multimodal.pixel_cache import OneImage
from tandem.gateway.multimodal.pixel_segments import (
    discard_segment,
    map_segment,
    new_segment_path,
    sweep_stale_segments,
)
from tandem.gateway.multimodal.pool_worker import (
    ImageDone,
    ImageFailed,
    ImageTask,
    run_task,
    warm,
)
from tandem.media import MediaError, MediaPolicy
from tandem.models.info import ModelInfo
from tandem.models.processor import ImageProcessor

log = logging.getLogger("tandem.gateway.multimodal")

_PRELOAD = "tandem.gateway.multimodal.pool_preload"
_WARM_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class ProcessorSpec:
    """A processor as a pool process gets it, and the fingerprint of what it makes."""

    fingerprint: str
    blob: bytes


_SPECS: WeakKeyDictionary[ImageProcessor, dict[tuple[bool, bool], ProcessorSpec]] = (
    WeakKeyDictionary()
)


def processor_spec(
    processor: ImageProcessor, info: ModelInfo, policy: MediaPolicy, raw: bool
) -> ProcessorSpec:
    """The pickled processor and the fingerprint of (model, processor config, options).

    The fingerprint keys the pixel cache with the image's hash: two models, two processor
    configs or raw vs normalized output never share an entry. Computed once per processor.
    """
    per = _SPECS.setdefault(processor, {})
    options = (raw, policy.jpeg_draft)  # jpeg_draft changes the decoded pixels
    spec = per.get(options)
    if spec is None:
        blob = pickle.dumps(processor, protocol=pickle.HIGHEST_PROTOCOL)
        identity = repr((str(info.model_dir), info.model_type, info.image_token_id, options))
        digest = blake3(identity.encode())
        digest.update(blob)
        spec = ProcessorSpec(digest.hexdigest(), blob)
        per[options] = spec
    return spec


class _Slot:
    """One pool process behind its own executor; ``busy``: images queued or running."""

    __slots__ = ("busy", "executor", "index")

    def __init__(self, index: int, executor: concurrent.futures.ProcessPoolExecutor) -> None:
        self.index = index
        self.executor = executor
        self.busy = 0


class ImagePool:
    """N pool processes. ``start`` and ``stop`` from the event loop; ``process`` per image."""

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError("an image pool needs at least one process")
        self.workers = workers
        self._context = multiprocessing.get_context("forkserver")
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()  # executors are replaced from worker threads too
        self._closed = False

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=self._context)

    def _start_blocking(self) -> None:
        removed = sweep_stale_segments()
        if removed:
            log.info("removed %d pixel segment(s) left by gateways that died", removed)
        self._context.set_forkserver_preload([_PRELOAD])
        self._slots = [_Slot(i, self._executor()) for i in range(self.workers)]
        for slot in self._slots:
            if slot.executor.submit(warm).result(timeout=_WARM_TIMEOUT_S):
                log.warning("image pool process %d has torch loaded", slot.index)

    async def start(self) -> None:
        """Start and warm every process (imports done once in the forkserver), off the loop."""
        await asyncio.to_thread(self._start_blocking)
        log.info("image pool: %d process(es)", self.workers)

    async def stop(self) -> None:
        self._closed = True
        slots, self._slots = self._slots, []

        def shut() -> None:
            for slot in slots:
                slot.executor.shutdown(wait=True, cancel_futures=True)

        await asyncio.to_thread(shut)

    def pids(self) -> list[int]:
        """The pool processes' pids (tests and diagnostics)."""
        out: list[int] = []
        for slot in self._slots:
            procs = getattr(slot.executor, "_processes", None) or {}
            out.extend(int(pid) for pid in procs)
        return out

    def _replace(self, slot: _Slot, broken: concurrent.futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._closed or slot.executor is not broken:
                return  # already replaced by another image of the same crash
            slot.executor = self._executor()
        broken.shutdown(wait=False, cancel_futures=True)
        metrics.MM_POOL_RESTARTS.inc()
        log.warning("image pool process %d died; replaced it", slot.index)

    def _submit(self, task: ImageTask) -> tuple[_Slot, concurrent.futures.Future[object]]:
        if self._closed or not self._slots:
            raise make_error("shutting_down", "the gateway is stopping")
        slot = min(self._slots, key=lambda s: s.busy)
        for _ in range(2):
            executor = slot.executor
            try:
                return slot, executor.submit(run_task, task)
            except BrokenProcessPool:
                # The process died while idle: nothing of this request was on it.
                self._replace(slot, executor)
        raise make_error("multimodal_pool_process_died", "the image pool cannot start a process")

    def submit(
        self,
        data: bytes,
        spec: ProcessorSpec,
        policy: MediaPolicy,
        raw: bool,
        working: Releasable | None = None,
    ) -> PendingImage:
        """Queue one image on the least busy process; synchronous, so that a caller that
        submits several images has each one's ``working`` accounted for at once.

        ``working`` (this image's decode share of the request's lease) is released when the
        pool process is done with the image, even if the caller was cancelled meanwhile.
        """
        loop = asyncio.get_running_loop()
        segment = new_segment_path()
        task = ImageTask(spec.fingerprint, spec.blob, data, policy, raw, segment)
        try:
            slot, future = self._submit(task)
        except BaseException:
            if working is not None:
                working.release()
            raise
        slot.busy += 1

        def done(_: concurrent.futures.Future[object]) -> None:
            # In the executor's thread: the pool process no longer holds this image.
            def settle() -> None:
                slot.busy -= 1
                if working is not None:
                    working.release()

            with contextlib.suppress(RuntimeError):  # a closed loop: the gateway is gone
                loop.call_soon_threadsafe(settle)

        future.add_done_callback(done)
        return PendingImage(self, slot, slot.executor, future, segment)

    async def process(
        self,
        data: bytes,
        spec: ProcessorSpec,
        policy: MediaPolicy,
        raw: bool,
        working: Releasable | None = None,
    ) -> tuple[OneImage, float, float]:
        """:meth:`submit`, then :meth:`PendingImage.result`."""
        return await self.submit(data, spec, policy, raw, working).result()


class Releasable(Protocol):
    def release(self) -> None: ...


class PendingImage:
    """An image queued or running in the pool; its segment is removed whatever happens."""

    __slots__ = ("_executor", "_future", "_pool", "_segment", "_slot")

    def __init__(
        self,
        pool: ImagePool,
        slot: _Slot,
        executor: concurrent.futures.ProcessPoolExecutor,
        future: concurrent.futures.Future[object],
        segment: str,
    ) -> None:
        self._pool = pool
        self._slot = slot
        self._executor = executor
        self._future = future
        self._segment = segment

    def abandon(self) -> None:
        """Drop the image: a queued one never runs; a running one's pixels go when written."""
        self._future.cancel()
        segment = self._segment
        # Runs at once if the future is already done, else in the executor's thread.
        self._future.add_done_callback(lambda _: discard_segment(segment))

    async def result(self) -> tuple[OneImage, float, float]:
        """(the image's arrays, decode seconds, preprocess seconds).

        Raises ``MediaError`` or ``ValueError`` for the client's image, as in-process
        processing would, and 500 ``multimodal_pool_process_died``.
        """
        segment = self._segment
        try:
            answer = await asyncio.wrap_future(self._future)
        except asyncio.CancelledError:
            self.abandon()  # the caller is gone: nothing may be left in /dev/shm for it
            raise
        except BrokenProcessPool:
            discard_segment(segment)  # a write cut short by the crash
            self._pool._replace(self._slot, self._executor)
            raise make_error(
                "multimodal_pool_process_died",
                "an image pool process died while processing this request's images (killed, "
                "out of memory or a decoder crash); it was replaced",
            ) from None
        except BaseException:
            discard_segment(segment)
            raise
        if isinstance(answer, ImageFailed):
            if answer.code is None:
                raise ValueError(answer.message)
            error = MediaError(answer.message)
            error.code = answer.code
            raise error
        assert isinstance(answer, ImageDone)
        pixels = map_segment(segment, answer.shape, answer.dtype)
        image = OneImage(pixels, answer.tokens, answer.grids, answer.patches, answer.lut)
        return image, answer.decode_s, answer.preprocess_s
