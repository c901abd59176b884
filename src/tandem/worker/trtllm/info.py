"""What a TensorRT-LLM-protocol worker says about itself: model info, server info, health.

Gateways label workers from these answers, so they are honest. ``supported_features``
lists what this worker honours: ``"vision"`` only when it runs a vision tower (not
``--language-model-only``; Tandem's gateway keys image support on that exact string),
``"logprobs"`` and ``"guided_decoding"`` only where its engine computes them (the null
benchmark engine does neither). ``model_id`` is the served name (smg and Tandem's gateway
take the model's id from it), ``max_seq_len`` the context.

The engine caps no batch: ``max_batch_size`` is 0. It runs on one device with no
parallelism, so every parallel size is 1.
"""

from __future__ import annotations

from typing import Any

from tandem import __version__
from tandem.engine.types import ModelShape
from tandem.models.info import ModelInfo, read_json
from tandem.wire.trtllm import trpb
from tandem.worker.config import WorkerConfig

HEALTHY = "OK"
STOPPED = "engine stopped"
VERSION = f"tandem-{__version__}"
# What TensorRT-LLM's servicer calls its engine when it runs the PyTorch flow.
BACKEND = "pytorch"
# Honoured whatever the engine: n > 1, stop token ids, the dense bias, the salt, timings.
BASE_FEATURES = (
    "num_return_sequences",
    "stop_token_ids",
    "embedding_bias",
    "cache_salt_id",
    "perf_metrics",
)


def _text_config(info: ModelInfo) -> dict[str, Any]:
    config = read_json(info.model_dir / "config.json")
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def _int(config: dict[str, Any], name: str) -> int:
    value = config.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def supported_features(config: WorkerConfig, returns_logprobs: bool) -> list[str]:
    features = list(BASE_FEATURES)
    if config.engine == "embedded":
        features.append("guided_decoding")
    if returns_logprobs:
        features.append("logprobs")
    if not config.language_model_only:
        features.append("vision")
    return features


def model_info(
    config: WorkerConfig, info: ModelInfo, shape: ModelShape, returns_logprobs: bool
) -> trpb.GetModelInfoResponse:
    text = _text_config(info)
    return trpb.GetModelInfoResponse(
        model_id=config.model_name,
        max_input_len=shape.max_context - 1,
        max_seq_len=shape.max_context,
        max_batch_size=0,
        vocab_size=shape.vocab_size,
        hidden_size=_int(text, "hidden_size"),
        num_layers=_int(text, "num_hidden_layers"),
        num_heads=_int(text, "num_attention_heads"),
        supported_features=supported_features(config, returns_logprobs),
    )


def server_info() -> trpb.GetServerInfoResponse:
    return trpb.GetServerInfoResponse(
        version=VERSION,
        backend=BACKEND,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        context_parallel_size=1,
        world_size=1,
    )


def health(alive: bool) -> trpb.HealthCheckResponse:
    return trpb.HealthCheckResponse(status=HEALTHY if alive else STOPPED)
