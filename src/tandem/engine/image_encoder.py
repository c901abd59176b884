"""The encode worker's engine (E/P/D): a loaded model's vision tower, run off the event loop.

An encode worker runs nothing but the vision tower: pixels of one image in, the image's
features out (``ModelRunner.encode_image``, the very call a prefill makes, so the
features are the same bits). Encodes run on one dedicated thread: the gRPC event loop
never waits on torch, and torch is never run on two threads at once (it already uses
every core for one encode; two would only contend).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypedDict

import numpy as np

from tandem.engine.runner import ModelRunner, VisionUnavailableError
from tandem.engine.types import ImageFeatures


class EncoderCounters(TypedDict):
    """What an encode worker's Stats answer reports of its encoder."""

    encodes: int  # encodes that returned features
    encode_failures: int  # encodes refused (pixels unlike their grid) or failed
    vision_encodes: int  # the runner's tower calls
    encodes_waiting: int  # submitted, not yet finished (queued or running)


class ImageEncoder:
    """Encodes images with one runner on one worker thread; ``close`` when done."""

    def __init__(self, runner: ModelRunner) -> None:
        if not runner.supports_vision:
            raise VisionUnavailableError(
                "an image encoder needs the full model: this runner loaded the language model only"
            )
        self.runner = runner
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-encode")
        self._lock = threading.Lock()
        self._encodes = 0
        self._failures = 0
        self._waiting = 0
        self._closed = False

    @classmethod
    def load(cls, model_dir: str | Path, model_id: str | None = None) -> ImageEncoder:
        """Load the full model (blocking: call it before serving, or off the loop)."""
        return cls(ModelRunner.load(model_dir, model_id=model_id))

    @property
    def hidden_size(self) -> int:
        return self.runner.hidden_size

    @property
    def deepstack_layers(self) -> int:
        return self.runner.deepstack_layers

    @property
    def encodes(self) -> int:
        with self._lock:
            return self._encodes

    def counters(self) -> EncoderCounters:
        with self._lock:
            encodes, failures, waiting = self._encodes, self._failures, self._waiting
        return {
            "encodes": encodes,
            "encode_failures": failures,
            "vision_encodes": self.runner.vision_encodes,
            "encodes_waiting": waiting,
        }

    async def encode(self, pixels: np.ndarray, grid: np.ndarray | None) -> ImageFeatures:
        """One image's features; raises what ``ModelRunner.encode_image`` raises
        (MediaLayoutError for pixels that do not match their grid), or RuntimeError once
        closed. A caller cancelled while its encode is queued drops it; one running
        finishes (torch cannot be interrupted) and is counted all the same."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the image encoder is closed")
            self._waiting += 1
        try:
            future = self._pool.submit(self.runner.encode_image, pixels, grid)
        except RuntimeError as error:  # closed between the check and the submit
            with self._lock:
                self._waiting -= 1
            raise RuntimeError("the image encoder is closed") from error
        future.add_done_callback(self._finished)
        return await asyncio.wrap_future(future)

    def _finished(self, future: Future[ImageFeatures]) -> None:
        # Counted when the encode ends, whatever became of its caller.
        with self._lock:
            self._waiting -= 1
            if future.cancelled():
                return
            if future.exception() is None:
                self._encodes += 1
            else:
                self._failures += 1

    def close(self) -> None:
        """Refuse new encodes and drop queued ones (their callers get CancelledError);
        an encode already running finishes."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
