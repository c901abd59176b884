"""The image pool (``--mm-workers N``): decode + preprocess in processes, not the loop's.

Decoding and preprocessing run Python code (Pillow, numpy) that holds the GIL; in a thread
of the gateway process they slow token relaying of every other stream down. Here each image
goes to one of N processes (the least busy), so one request's images spread over the pool;
its bytes go in through a /dev/shm file and its pixels come back through another, mapped
without a copy (gateway/multimodal/pixel_segments.py). The event loop drives the processes
itself (pool_process.py): no helper thread in the gateway competes for its GIL.

A process gets at most ``_IN_PROCESS`` images at a time; the rest wait here, where a
cancelled request's images are simply dropped. When a process dies (out-of-memory kill, a
decoder crash) only the images it held fail, with 500 ``multimodal_pool_process_died``, and
it alone is replaced; images still waiting go to the replacement. Processes are forked from
a forkserver, never from the gateway (it has a running event loop and gRPC channels), with
the imports already done (pool_preload.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
from collections import deque
from typing import Protocol

import numpy as np

from tandem.errors import make_error
from tandem.gateway import metrics
from tandem.gateway.multimodal.pixel_cache import OneImage
from tandem.gateway.multimodal.pixel_segments import (
    discard_segment,
    map_segment,
    new_segment_path,
    sweep_stale_segments,
    write_segment,
)
from tandem.gateway.multimodal.pool_process import PoolProcess
from tandem.gateway.multimodal.pool_spec import ProcessorSpec
from tandem.gateway.multimodal.pool_worker import ImageCrashed, ImageDone, ImageFailed, ImageTask
from tandem.media import MediaError, MediaPolicy

log = logging.getLogger("tandem.gateway.multimodal")

_PRELOAD = "tandem.gateway.multimodal.pool_preload"
# Images sent to one process at a time: one running, one ready for it in the socket.
_IN_PROCESS = 2


class Releasable(Protocol):
    def release(self) -> None: ...


class _Task:
    """One image from submission until its pool process no longer holds it."""

    __slots__ = ("future", "id", "message", "working")

    def __init__(self, task_id: int, message: ImageTask, working: Releasable | None) -> None:
        self.id = task_id
        self.message = message
        self.working = working
        self.future: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    def settle(self) -> None:
        """The pool is done with the image: its decode share of the budget goes back."""
        working, self.working = self.working, None
        if working is not None:
            working.release()

    def discard(self) -> None:
        """Remove both files; either may already be gone."""
        discard_segment(self.message.source)
        discard_segment(self.message.segment)


class _Slot:
    """One pool process (None while it is being replaced) and the images for it."""

    __slots__ = ("index", "known", "process", "replacing", "sent", "waiting")

    def __init__(self, index: int, process: PoolProcess | None) -> None:
        self.index = index
        self.process = process
        self.replacing = False
        self.waiting: deque[_Task] = deque()  # not yet sent
        self.sent: dict[int, _Task] = {}  # sent to the process, not yet answered
        self.known: set[str] = set()  # fingerprints whose processor the process has

    @property
    def busy(self) -> int:
        """Images queued or running on this slot."""
        return len(self.waiting) + len(self.sent)


class ImagePool:
    """N pool processes. ``start`` and ``stop`` from the event loop; ``submit`` per image."""

    def __init__(self, workers: int, nice: int = 0) -> None:
        if workers < 1:
            raise ValueError("an image pool needs at least one process")
        self.workers = workers
        self.nice = nice  # added to each process's niceness (--mm-workers-nice)
        self._context = multiprocessing.get_context("forkserver")
        self._slots: list[_Slot] = []
        self._ids = itertools.count(1)
        self._replacements: set[asyncio.Task[None]] = set()
        self._closed = False

    def _new_process(self, index: int) -> PoolProcess:
        process = PoolProcess(self._context, index, self.nice)
        try:
            process.warm_blocking()
        except BaseException:
            process.close()
            process.join_blocking(1.0)
            raise
        if process.torch_loaded:
            log.warning("image pool process %d has torch loaded", index)
        return process

    def _start_blocking(self) -> list[PoolProcess]:
        removed = sweep_stale_segments()
        if removed:
            log.info("removed %d pixel segment(s) left by gateways that died", removed)
        self._context.set_forkserver_preload([_PRELOAD])
        return [self._new_process(i) for i in range(self.workers)]

    async def start(self) -> None:
        """Start and warm every process (imports done once in the forkserver), off the loop."""
        processes = await asyncio.to_thread(self._start_blocking)
        self._slots = [_Slot(p.index, None) for p in processes]
        for slot, process in zip(self._slots, processes, strict=True):
            self._attach(slot, process)
        log.info("image pool: %d process(es)", self.workers)

    async def stop(self) -> None:
        self._closed = True
        slots, self._slots = self._slots, []
        processes = [slot.process for slot in slots if slot.process is not None]
        for slot in slots:
            slot.process = None
            for task in [*slot.sent.values(), *slot.waiting]:
                self._fail(task, make_error("shutting_down", "the gateway is stopping"))
            slot.sent.clear()
            slot.waiting.clear()
        for process in processes:
            process.close()  # EOF: the process exits after its current image

        def join() -> None:
            for process in processes:
                process.join_blocking()

        await asyncio.to_thread(join)

    def pids(self) -> list[int]:
        """The pool processes' pids (tests and diagnostics)."""
        return [slot.process.pid for slot in self._slots if slot.process is not None]

    def torch_loaded(self) -> list[bool]:
        """Per process: whether torch was imported when it started (a bug if so)."""
        return [slot.process.torch_loaded for slot in self._slots if slot.process is not None]

    # --- the processes' lives -------------------------------------------------------

    def _attach(self, slot: _Slot, process: PoolProcess) -> None:
        loop = asyncio.get_running_loop()
        slot.process, slot.known = process, set()
        process.attach(
            loop,
            lambda task_id, answer: self._answered(slot, task_id, answer),
            lambda: self._died(slot, process),
        )
        self._pump(slot)

    def _died(self, slot: _Slot, process: PoolProcess) -> None:
        if slot.process is not process:
            return
        slot.process = None
        held, slot.sent = list(slot.sent.values()), {}
        for task in held:
            self._fail(
                task,
                make_error(
                    "multimodal_pool_process_died",
                    "an image pool process died while processing this request's images "
                    "(killed, out of memory or a decoder crash); it was replaced",
                ),
            )
        if self._closed:
            return
        metrics.MM_POOL_RESTARTS.inc()
        log.warning("image pool process %d died; replacing it", slot.index)
        self._start_replacing(slot)

    def _start_replacing(self, slot: _Slot) -> None:
        slot.replacing = True
        task = asyncio.get_running_loop().create_task(self._replace(slot))
        self._replacements.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._replacements.discard)

    async def _replace(self, slot: _Slot) -> None:
        try:
            process = await asyncio.to_thread(self._new_process, slot.index)
        except Exception:
            slot.replacing = False  # the next image sent to this slot tries again
            log.exception("image pool process %d could not be replaced", slot.index)
            waiting, slot.waiting = list(slot.waiting), deque()
            for task in waiting:
                self._fail(
                    task,
                    make_error(
                        "multimodal_pool_process_died", "the image pool cannot start a process"
                    ),
                )
            return
        slot.replacing = False
        if self._closed or slot not in self._slots:
            process.close()
            await asyncio.to_thread(process.join_blocking)
            return
        self._attach(slot, process)

    # --- images ---------------------------------------------------------------------

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
        try:
            if self._closed or not self._slots:
                raise make_error("shutting_down", "the gateway is stopping")
            # A slot whose process is being replaced only when every slot is.
            slot = min(self._slots, key=lambda s: (s.process is None, s.busy))
            source = new_segment_path()
            write_segment(source, np.frombuffer(data, dtype=np.uint8))
        except BaseException:
            if working is not None:
                working.release()
            raise
        message = ImageTask(spec.fingerprint, spec.blob, source, policy, raw, new_segment_path())
        task = _Task(next(self._ids), message, working)
        slot.waiting.append(task)
        if slot.process is None and not slot.replacing:
            self._start_replacing(slot)  # the last attempt failed: try again for this image
        self._pump(slot)
        return PendingImage(self, slot, task)

    def _pump(self, slot: _Slot) -> None:
        process = slot.process
        while process is not None and slot.waiting and len(slot.sent) < _IN_PROCESS:
            task = slot.waiting.popleft()
            message = task.message
            if message.fingerprint in slot.known:
                message = ImageTask(
                    message.fingerprint,
                    None,
                    message.source,
                    message.policy,
                    message.raw,
                    message.segment,
                )
            slot.known.add(message.fingerprint)
            slot.sent[task.id] = task
            process.send(task.id, message)
            process = slot.process  # a failed write ends the process (and its tasks) at once

    def _answered(self, slot: _Slot, task_id: int, answer: object) -> None:
        task = slot.sent.pop(task_id, None)
        if task is None:
            return
        task.settle()
        if task.future.done():  # abandoned: the caller is gone
            task.discard()
        else:
            task.future.set_result(answer)
        self._pump(slot)

    @staticmethod
    def _fail(task: _Task, error: BaseException) -> None:
        task.settle()
        task.discard()  # a write cut short, or an image never read
        if not task.future.done():
            task.future.set_exception(error)

    def _abandon(self, slot: _Slot, task: _Task) -> None:
        if task in slot.waiting:
            slot.waiting.remove(task)  # never sent: it never runs
            task.settle()
            task.discard()
        elif task.id not in slot.sent and task.future.done() and not task.future.cancelled():
            # Answered (or failed) but never collected: pixels may still be in the segment.
            task.future.exception()  # collected now: asyncio logs no "never retrieved"
            task.discard()
        if not task.future.done():
            task.future.cancel()  # a sent one's answer is discarded when it comes


class PendingImage:
    """An image queued or running in the pool; its segments are removed whatever happens."""

    __slots__ = ("_pool", "_slot", "_task")

    def __init__(self, pool: ImagePool, slot: _Slot, task: _Task) -> None:
        self._pool = pool
        self._slot = slot
        self._task = task

    def abandon(self) -> None:
        """Drop the image: a queued one never runs; a running one's pixels go when written."""
        self._pool._abandon(self._slot, self._task)

    async def result(self) -> tuple[OneImage, float, float]:
        """(the image's arrays, decode seconds, preprocess seconds).

        Raises ``MediaError`` or ``ValueError`` for the client's image, as in-process
        processing would, and 500 ``multimodal_pool_process_died``.
        """
        task = self._task
        try:
            answer = await asyncio.shield(task.future)
        except asyncio.CancelledError:
            self.abandon()  # the caller is gone: nothing may be left in /dev/shm for it
            raise
        if isinstance(answer, ImageFailed):
            task.discard()
            if answer.code is None:
                raise ValueError(answer.message)
            error = MediaError(answer.message)
            error.code = answer.code
            raise error
        if isinstance(answer, ImageCrashed):
            task.discard()
            raise make_error("internal_error", f"image pool process failed: {answer.message}")
        assert isinstance(answer, ImageDone)
        pixels = map_segment(task.message.segment, answer.shape, answer.dtype)
        image = OneImage(pixels, answer.tokens, answer.grids, answer.patches, answer.lut)
        return image, answer.decode_s, answer.preprocess_s
