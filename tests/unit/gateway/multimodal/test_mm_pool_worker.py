"""What a pool process answers (pool_worker.serve), run in a thread over a real socket pair."""

from __future__ import annotations

import multiprocessing
import pickle
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from mm_gateway_models import Model
from mm_gateway_origin import png_bytes

from tandem.gateway.multimodal.pixel_segments import map_segment, new_segment_path
from tandem.gateway.multimodal.pool_spec import processor_spec
from tandem.gateway.multimodal.pool_worker import (
    ImageCrashed,
    ImageDone,
    ImageFailed,
    ImageTask,
    serve,
)
from tandem.media import MediaPolicy

Ask = Callable[[object], object]


@pytest.fixture
def served() -> Iterator[Ask]:
    gateway, child = multiprocessing.Pipe(duplex=True)
    thread = threading.Thread(target=serve, args=(child,), daemon=True)
    thread.start()

    def ask(message: object) -> object:
        task_id = 7
        gateway.send_bytes(pickle.dumps((task_id, message)))
        answered_id, answer = pickle.loads(gateway.recv_bytes())
        assert answered_id == task_id
        return answer

    yield ask
    gateway.close()  # EOF: serve returns
    thread.join(5)
    assert not thread.is_alive()


def task(qwen: Model, source: str, blob: bool = True) -> ImageTask:
    spec = processor_spec(qwen.processor, qwen.info, MediaPolicy(), raw=True)
    return ImageTask(
        spec.fingerprint,
        spec.blob if blob else None,
        source,
        MediaPolicy(),
        True,
        new_segment_path(),
    )


def write_source(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "source"
    path.write_bytes(data)
    return str(path)


def test_an_image_is_processed_and_its_source_removed(
    served: Ask, qwen: Model, tmp_path: Path
) -> None:
    source = write_source(tmp_path, png_bytes((40, 30), seed=1))
    one = task(qwen, source)
    answer = served(one)
    assert isinstance(answer, ImageDone)
    assert not Path(source).exists()
    pixels = map_segment(one.segment, answer.shape, answer.dtype)  # and unlinks it
    assert pixels.dtype.name == "uint8" and pixels.size > 0
    # The processor is kept: later tasks of the same fingerprint come without it.
    again = task(qwen, write_source(tmp_path, png_bytes((40, 30), seed=2)), blob=False)
    second = served(again)
    assert isinstance(second, ImageDone)
    map_segment(again.segment, second.shape, second.dtype)


def test_a_broken_image_is_the_clients_fault(served: Ask, qwen: Model, tmp_path: Path) -> None:
    answer = served(task(qwen, write_source(tmp_path, b"\x89PNG not really")))
    assert isinstance(answer, ImageFailed)


def test_anything_else_is_reported_not_lost(served: Ask, qwen: Model, tmp_path: Path) -> None:
    """A missing source file and a processor never sent are bugs: ImageCrashed (a 500),
    and the process goes on serving."""
    missing = served(task(qwen, str(tmp_path / "gone")))
    assert isinstance(missing, ImageCrashed) and "FileNotFoundError" in missing.message
    never_sent = task(qwen, write_source(tmp_path, png_bytes((40, 30), seed=3)), blob=False)
    object.__setattr__(never_sent, "fingerprint", "not-a-fingerprint")
    answer = served(never_sent)
    assert isinstance(answer, ImageCrashed) and "never sent" in answer.message
    still = served(task(qwen, write_source(tmp_path, png_bytes((40, 30), seed=4)), blob=False))
    assert isinstance(still, ImageDone)
