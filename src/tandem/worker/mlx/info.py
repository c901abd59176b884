"""What an MLX-protocol worker says about itself: health, model info, server info.

Gateways label workers from these answers, so every field is the model's truth: its
directory as ``model_path``, ``--served-model-name`` (else the model's name) as
``served_model_name`` (MLX's servicer sends the path there), the context, vocabulary and
special ids from the checkpoint's files. ``max_req_input_len`` is the context less one (a
prompt must leave room for a token). ``server_type`` says the servicer is Tandem's, not
MLX's own ("mlx-grpc").
"""

from __future__ import annotations

import time
from typing import Any

from tandem.models.info import ModelInfo, read_json
from tandem.wire.mlx import mpb
from tandem.worker.config import WorkerConfig

SERVER_TYPE = "tandem-mlx-grpc"


def _config(info: ModelInfo) -> dict[str, Any]:
    return read_json(info.model_dir / "config.json")


def special_id(info: ModelInfo, name: str) -> int:
    """``bos_token_id`` / ``pad_token_id`` from the checkpoint's files; 0 when unknown
    (the field has no "unset")."""
    config = _config(info)
    sources = [config.get("text_config") or {}, config]
    generation = info.model_dir / "generation_config.json"
    if generation.is_file():
        sources.insert(0, read_json(generation))
    for source in sources:
        value = source.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


def model_info(config: WorkerConfig, info: ModelInfo) -> mpb.GetModelInfoResponse:
    return mpb.GetModelInfoResponse(
        model_path=str(info.model_dir),
        is_generation=True,
        max_context_length=info.max_context,
        vocab_size=info.vocab_size,
        served_model_name=config.model_name,
        model_type=info.model_type,
        architectures=list(_config(info).get("architectures", [])),
        eos_token_ids=list(info.eos_token_ids),
        pad_token_id=special_id(info, "pad_token_id"),
        bos_token_id=special_id(info, "bos_token_id"),
        max_req_input_len=max(info.max_context - 1, 0),
    )


def server_info(started: float, active: int) -> mpb.GetServerInfoResponse:
    """``started``: the servicer's ``time.monotonic()`` at start; ``active``: its Generate
    calls in progress."""
    return mpb.GetServerInfoResponse(
        server_type=SERVER_TYPE,
        active_requests=active,
        uptime_seconds=time.monotonic() - started,
    )


def health(alive: bool) -> mpb.HealthCheckResponse:
    """From the engine, at once (no probe request): MLX's servicer answers "OK" alike."""
    return mpb.HealthCheckResponse(healthy=alive, message="OK" if alive else "engine stopped")
