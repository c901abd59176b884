"""What a TokenSpeed-protocol worker says about itself: model info, server info, loads.

Gateways label workers from these answers (smg reads the ``server_args`` keys below), so
they are honest: a language-model-only worker reports no vision and no modalities; the
``disaggregation_mode`` follows ``--role``; ``disaggregation_bootstrap_port`` is where
decode workers reach this worker's KV. Pixels are taken as float32
(``multimodal_encoder_dtype``; smg's default would be bfloat16), inline only: the
``scheduler_info`` names no ``shm_namespace_id``, so no gateway sends shared memory.

The engine keeps each request's KV apart and caps neither tokens nor requests:
``max_total_tokens`` is the context (the most one request holds) and
``max_running_requests`` 0 (no cap).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from tandem import __version__
from tandem.models.info import ModelInfo, read_json
from tandem.wire.tokenspeed import IMAGE, tpb
from tandem.worker.config import Role, WorkerConfig

# --role → TokenSpeed's --disaggregation-mode.
DISAGGREGATION_MODES: dict[Role, str] = {
    "prefill": "prefill",
    "decode": "decode",
    "both": "null",
    "encode": "encode",
}
TOKENSPEED_VERSION = f"tandem-{__version__}"
SHALLOW_HEALTH = "Health check passed (disaggregation worker; shallow probe)"


def _config(info: ModelInfo) -> dict[str, Any]:
    return read_json(info.model_dir / "config.json")


def _special_id(info: ModelInfo, name: str) -> int:
    """``bos_token_id`` / ``pad_token_id`` from the checkpoint's files; 0 when unknown."""
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


def model_info(config: WorkerConfig, info: ModelInfo) -> tpb.GetModelInfoResponse:
    vision = not config.language_model_only
    return tpb.GetModelInfoResponse(
        model_path=str(info.model_dir),
        tokenizer_path=str(info.model_dir),
        served_model_name=config.model_name,
        model_type=info.model_type,
        architectures=list(_config(info).get("architectures", [])),
        max_context_length=info.max_context,
        max_req_input_len=info.max_context - 1,
        vocab_size=info.vocab_size,
        eos_token_ids=list(info.eos_token_ids),
        pad_token_id=_special_id(info, "pad_token_id"),
        bos_token_id=_special_id(info, "bos_token_id"),
        default_sampling_params_json="",  # no overrides of TokenSpeed's defaults
        supports_vision=vision,
        supports_multimodal=vision,
        supported_modalities=[IMAGE] if vision else [],
        model_dtype="float32",
        multimodal_encoder_dtype="float32" if vision else "",
    )


def server_args(config: WorkerConfig, info: ModelInfo, bootstrap_port: int) -> dict[str, Any]:
    """TokenSpeed's ``server_args`` members that describe this worker."""
    return {
        "model": config.model,
        "model_path": str(info.model_dir),
        "served_model_name": config.model_name,
        "tokenizer": str(info.model_dir),
        "tokenizer_path": str(info.model_dir),
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "context_length": info.max_context,
        "max_total_tokens": info.max_context,
        "max_running_requests": 0,
        "is_embedding": False,
        "vocab_size": info.vocab_size,
        "disaggregation_mode": DISAGGREGATION_MODES[config.role],
        "disaggregation_bootstrap_port": bootstrap_port,
        "kv_cache_dtype": "float32",
        "page_size": config.block_size,
    }


def server_info(
    config: WorkerConfig, info: ModelInfo, bootstrap_port: int, started: float, active: int
) -> tpb.GetServerInfoResponse:
    args = struct_pb2.Struct()
    args.update(server_args(config, info, bootstrap_port))
    uptime = time.monotonic() - started
    start_time = timestamp_pb2.Timestamp()
    start_time.FromSeconds(int(time.time() - uptime))
    return tpb.GetServerInfoResponse(
        server_args=args,
        scheduler_info=struct_pb2.Struct(),
        active_requests=active,
        uptime_seconds=uptime,
        max_total_num_tokens=info.max_context,
        tokenspeed_version=TOKENSPEED_VERSION,
        start_time=start_time,
        # A grammar only when the request asks for one (a forced tool call, a JSON format).
        constrained_decoding="requested",
    )


def loads(config: WorkerConfig, running: int, waiting: int) -> tpb.GetLoadsResponse:
    """One rank's counts; none on an encode worker (it runs no generation: no load)."""
    reply = tpb.GetLoadsResponse(
        timestamp=datetime.now(UTC).isoformat(), version=TOKENSPEED_VERSION, dp_rank_count=1
    )
    if config.role != "encode":
        reply.loads.add(
            dp_rank=0,
            num_running_reqs=running,
            num_waiting_reqs=waiting,
            num_total_reqs=running + waiting,
        )
    return reply


def health(config: WorkerConfig, alive: bool) -> tpb.HealthCheckResponse:
    """Aggregated workers answer from the engine; disaggregated ones shallowly, as
    TokenSpeed's do (a probe request of their own would need a PD partner)."""
    if config.role != "both":
        return tpb.HealthCheckResponse(healthy=True, message=SHALLOW_HEALTH)
    return tpb.HealthCheckResponse(healthy=alive, message="ok" if alive else "engine stopped")
