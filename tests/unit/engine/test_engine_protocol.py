"""Both engines implement the worker's ``Engine`` protocol and answer it alike.

The engines are the real ones over the built-in tiny model (the null engine loads no
weights); requests go through the protocol's members only, as the worker sends them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tandem.engine.block_keys import block_keys
from tandem.engine.core import EmbeddedEngine
from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.protocol import Engine, PrefixLookup
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.runner import ModelRunner
from tandem.engine.sampling import SamplingConfig
from tandem.engine.stats import EngineCounters
from tandem.engine.types import MediaInputs, MediaItem
from tandem.models.info import load_model_info

BLOCK = 4


def build_engine(kind: str, model_dir: Path) -> Engine:
    """The engine a worker builds (``worker/server.py``), typed as the protocol."""
    engine: Engine
    if kind == "null":
        info = load_model_info(model_dir)
        engine = NullEngine(info, KvStore(null_shape(info), 30.0, block_size=BLOCK), 0.0, BLOCK)
    else:
        runner = ModelRunner.load(model_dir)
        engine = EmbeddedEngine(
            runner,
            PrefixCache(runner.shape, 1 << 20, BLOCK),
            KvStore(runner.shape, 30.0, block_size=BLOCK),
            BLOCK,
        )
    return engine


@pytest.fixture(params=["null", "embedded"])
def engine(request: pytest.FixtureRequest, qwen_dir: Path) -> Iterator[Engine]:
    built = build_engine(request.param, qwen_dir)
    built.start()
    yield built
    built.stop()


def _request(rid: str, max_tokens: int = 3, export: str | None = None) -> EngineRequest:
    sampling = SamplingConfig(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return EngineRequest(rid, list(range(40, 50)), sampling, export_transfer_id=export)


async def _collect(engine: Engine, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


def _settled(engine: Engine) -> EngineCounters:
    """The counters once nothing runs: the compute thread counts a finish after its frame."""
    deadline = time.monotonic() + 10.0
    while True:
        counters = engine.counters()
        if counters["running"] == 0 and counters["requests_by_outcome"]:
            return counters
        assert time.monotonic() < deadline, f"the engine never settled: {counters}"
        time.sleep(0.01)


def test_both_engines_implement_the_protocol(engine: Engine) -> None:
    assert isinstance(engine, Engine)
    assert isinstance(engine, PrefixLookup)
    assert engine.alive
    assert (engine.num_running, engine.num_waiting) == (0, 0)
    assert engine.block_size == BLOCK
    assert engine.kv_store.shape == engine.shape


def test_the_shape_is_the_models_context_and_vocabulary(engine: Engine, qwen_dir: Path) -> None:
    info = load_model_info(qwen_dir)
    assert (engine.shape.max_context, engine.shape.vocab_size) == (
        info.max_context,
        info.vocab_size,
    )


def test_stop_ends_alive(qwen_dir: Path) -> None:
    for kind in ("null", "embedded"):
        engine = build_engine(kind, qwen_dir)
        engine.start()
        engine.stop()
        assert not engine.alive, kind


def test_a_prefill_leg_is_held_and_counted(engine: Engine) -> None:
    outputs = asyncio.run(_collect(engine, _request("r1", export="t1")))
    assert [out.finish_reason for out in outputs][-1] == "length"
    assert outputs[-1].completion_tokens == 3
    counters = _settled(engine)
    assert set(counters) == EngineCounters.__required_keys__
    assert counters["kv_stored"] == 1
    assert counters["held_transfers"] == 1
    assert counters["held_kv_blocks"] > 0
    assert counters["requests_by_outcome"] == {"finished": 1}
    assert counters["running"] == 0
    assert engine.kv_store.release("t1")
    assert engine.counters()["kv_released"] == 1


def test_an_abort_ends_the_request_and_frees_its_kv(engine: Engine) -> None:
    async def run() -> list[EngineOutput]:
        outputs: list[EngineOutput] = []
        async for out in engine.generate(_request("r2", max_tokens=10_000, export="t2")):
            outputs.append(out)
            if len(outputs) == 2:
                engine.abort("r2")
        return outputs

    outputs = asyncio.run(run())
    assert outputs[-1].finish_reason == "abort"
    counters = _settled(engine)
    assert counters["requests_by_outcome"] == {"abort": 1}
    assert counters["held_transfers"] == 0
    assert counters["running"] == 0


def test_a_prefix_lookup_is_counted(engine: Engine) -> None:
    keys = block_keys(list(range(100, 120)), [], None, engine.block_size)
    before = engine.counters()["prefix_cache_lookups"]
    n_blocks, _ = engine.match_prefix(keys)
    assert n_blocks == 0
    assert engine.counters()["prefix_cache_lookups"] == before + 1


def test_the_null_engine_keeps_the_media_description_with_its_kv(qwen_dir: Path) -> None:
    """As the embedded engine does: a decode leg with only item metadata (TokenSpeed's)
    checks its items against the prefill's description, so the null engine must keep it."""
    engine = build_engine("null", qwen_dir)
    engine.start()
    try:
        request = _request("r-media", export="t-media")
        request.media = MediaInputs(
            items=[MediaItem("digest-1", 2, 4)],
            im_token_id=7,
            pixel_values=np.ones((4, 3), np.float32),
            grids={"image_grid_thw": np.array([[1, 2, 2]])},
        )
        asyncio.run(_collect(engine, request))
        held = engine.kv_store.get("t-media")
        assert held is not None and held.media is not None
        assert [item.mm_hash for item in held.media.items] == ["digest-1"]
        assert held.media.pixel_values is None  # pixel-free
        assert held.media.grids["image_grid_thw"].tolist() == [[1, 2, 2]]
    finally:
        engine.stop()
