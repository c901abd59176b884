"""The encode worker's engine: encodes off the event loop, on one thread, with the very
features a prefill would compute; and the whole E/P/D hop, encoder → embedding channel
(a real gRPC server) → a language-model-only prefill, against a prefill from pixels."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from tandem.engine.image_encoder import ImageEncoder
from tandem.engine.runner import MediaLayoutError, ModelRunner, VisionUnavailableError
from tandem.models import load_processor
from tandem.worker.embedding_cache import image_digest
from tandem.worker.embedding_channel import EmbeddingChannelServer, EmbeddingClient, EmbeddingStore

MODELS = ["tiny-qwen3-vl", "tiny-llava-1.5"]


def _one_image(model_dir: Path, picture: Any) -> tuple[np.ndarray, np.ndarray | None]:
    pre = load_processor(model_dir).preprocess([picture])
    grid = pre.grids.get("image_grid_thw")
    return pre.pixel_values, None if grid is None else grid[0]


@pytest.mark.parametrize("name", MODELS)
async def test_encode_runs_on_its_own_thread_and_matches_encode_image(
    name: str,
    builtin_dirs: dict[str, Path],
    runners: dict[str, ModelRunner],
    images: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoder = ImageEncoder.load(builtin_dirs[name], name)
    try:
        pixels, grid = _one_image(builtin_dirs[name], images["green_triangle"])
        threads: list[str] = []
        original = encoder.runner.encode_image

        def spy(p: np.ndarray, g: np.ndarray | None) -> Any:
            threads.append(threading.current_thread().name)
            return original(p, g)

        monkeypatch.setattr(encoder.runner, "encode_image", spy)
        results = await asyncio.gather(*(encoder.encode(pixels, grid) for _ in range(3)))
        expected = runners[name].encode_image(pixels, grid)
        for features in results:
            assert torch.equal(features.embeds, expected.embeds)
            assert len(features.deepstack) == len(expected.deepstack)
            for a, b in zip(features.deepstack, expected.deepstack, strict=True):
                assert torch.equal(a, b)
        assert len(set(threads)) == 1 and threads[0] != threading.current_thread().name
        with pytest.raises(MediaLayoutError):
            await encoder.encode(pixels[:1], grid if grid is not None else np.array([1, 8, 8]))
        assert encoder.encodes == 3
        counters = encoder.counters()
        assert counters == {
            "encodes": 3,
            "encode_failures": 1,
            "vision_encodes": 3,
            "encodes_waiting": 0,
        }
    finally:
        encoder.close()
    with pytest.raises(RuntimeError, match="closed"):
        await encoder.encode(pixels, grid)


def test_an_encoder_needs_the_vision_tower(builtin_dirs: dict[str, Path]) -> None:
    lmo = ModelRunner.load(builtin_dirs["tiny-llava-1.5"], language_model_only=True)
    with pytest.raises(VisionUnavailableError, match="full model"):
        ImageEncoder(lmo)


@pytest.mark.parametrize("name", MODELS)
async def test_encode_pull_prefill_equals_prefill_from_pixels(
    name: str,
    builtin_dirs: dict[str, Path],
    runners: dict[str, ModelRunner],
    make_prompt: Callable[..., Any],
    images: Any,
) -> None:
    pictures = [images["red_square"], images["blue_circle"]]
    prompt = make_prompt(name, pictures, "What do you see?")
    expected, _ = runners[name].prefill(prompt.ids, prompt.media)

    encoder = ImageEncoder(runners[name])
    store = EmbeddingStore()
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    server.add_generic_rpc_handlers((EmbeddingChannelServer(store).handler(),))
    await server.start()
    client = EmbeddingClient()
    try:
        digests = []
        for k, picture in enumerate(pictures):
            pixels, grid = _one_image(builtin_dirs[name], picture)
            digests.append(image_digest(name, pixels, grid))
            store.put(f"room-{k}", digests[-1], await encoder.encode(pixels, grid))
        address = f"127.0.0.1:{port}"
        pulled = [await client.pull(address, f"room-{k}", 1.0) for k in range(2)]
    finally:
        encoder.close()
        await client.close()
        await server.stop(0)
    assert [p.digest for p in pulled] == digests and digests[0] != digests[1]

    lmo = ModelRunner.load(builtin_dirs[name], language_model_only=True)
    media = prompt.without_pixels()
    media.features = {k: p.features for k, p in enumerate(pulled)}
    logits, _ = lmo.prefill(prompt.ids, media)
    assert torch.equal(logits, expected)
