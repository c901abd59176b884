"""The worker talks to its engine through ``engine.protocol.Engine`` only.

The servicer is the real one over the real engines (the null engine loads no weights);
its Stats answer is the same set of counters whichever engine it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tandem.engine.core import EmbeddedEngine
from tandem.engine.kv_store import KvStore
from tandem.engine.null import NullEngine, null_shape
from tandem.engine.prefix_cache import PrefixCache
from tandem.engine.protocol import Engine
from tandem.engine.runner import ModelRunner
from tandem.models.info import load_model_info
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.sglang.leg_counter import CountingSglangServicer
from tandem.worker.vllm.leg_counter import CountingServicer

WORKER = Path(__file__).parents[3] / "src" / "tandem" / "worker"

# What the side channel's Stats call answers (tests and benchmarks read these keys).
STATS_KEYS = {
    "held_kv_blocks",
    "held_transfers",
    "kv_stored",
    "kv_released",
    "kv_expired",
    "prefix_cache_lookups",
    "prefix_cache_hit_tokens",
    "prefix_cache_blocks",
    "prefill_computed_tokens",
    "vision_encodes",
    "media_items_processed",
    "requests_by_outcome",
    "running",
    "leg_bytes",
}


def _engine(kind: str, model_dir: Path) -> Engine:
    if kind == "null":
        info = load_model_info(model_dir)
        return NullEngine(info, KvStore(null_shape(info)))
    runner = ModelRunner.load(model_dir)
    return EmbeddedEngine(runner, PrefixCache(runner.shape, 1 << 20), KvStore(runner.shape))


@pytest.mark.parametrize("protocol", ["vllm", "sglang"])
@pytest.mark.parametrize("kind", ["null", "embedded"])
def test_the_stats_answer_is_the_same_for_both_engines(
    kind: str, protocol: str, qwen_dir: Path
) -> None:
    engine = _engine(kind, qwen_dir)
    config = WorkerConfig(engine="null" if kind == "null" else "embedded")
    info = load_model_info(qwen_dir)
    client = KvChannelClient(engine.shape)
    servicer: CountingServicer | CountingSglangServicer
    if protocol == "vllm":
        servicer = CountingServicer(config, info, engine, None, client, ("127.0.0.1", 1))
    else:
        servicer = CountingSglangServicer(config, info, engine, client, 1)
    stats = servicer.stats()
    assert set(stats) == STATS_KEYS
    assert stats["requests_by_outcome"] == {}
    assert stats["running"] == stats["held_kv_blocks"] == stats["media_items_processed"] == 0
    assert stats["vision_encodes"] == 0
    assert stats["leg_bytes"] == {}


# The process (server.py) builds the concrete engines; every other worker module uses the
# protocol, so that they cannot come to depend on one engine's insides.
PROTOCOL_ONLY = [
    "vllm/servicer.py",
    "vllm/leg_counter.py",
    "sglang/servicer.py",
    "sglang/leg_counter.py",
    "handoff.py",
    "kv_channel.py",
    "refusals.py",
    "context.py",
]
CONCRETE = {
    "tandem.engine.core",
    "tandem.engine.null",
    "tandem.engine.runner",
    "tandem.engine.prefix_cache",
}


@pytest.mark.parametrize("name", PROTOCOL_ONLY)
def test_worker_modules_import_no_concrete_engine(name: str) -> None:
    tree = ast.parse((WORKER / name).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not imported & CONCRETE, f"{name} imports {sorted(imported & CONCRETE)}"


def _engine_attributes(tree: ast.AST) -> set[str]:
    """Attributes read off anything named ``engine`` (``self.engine.x``, ``engine.x``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == "engine":
                found.add(node.attr)
    return found


def test_worker_modules_use_only_the_protocols_members() -> None:
    # The runner and the prefix cache are the embedded engine's own parts: the worker asks
    # the engine instead (``engine.shape``, ``engine.match_prefix``, ``engine.counters()``).
    members = {name for name in dir(Engine) if not name.startswith("_")}
    for name in [*PROTOCOL_ONLY, "server.py", "vllm/adapter.py", "sglang/adapter.py"]:
        used = _engine_attributes(ast.parse((WORKER / name).read_text()))
        assert used <= members, f"{name} reads {sorted(used - members)} off its engine"
