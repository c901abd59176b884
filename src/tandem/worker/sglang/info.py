"""What an SGLang-protocol worker says about itself: model info, server info, loads.

Gateways label workers from these answers (smg reads the ``server_args`` keys below), so
they are honest: a language-model-only worker reports ``supports_vision=false``; the
``disaggregation_mode`` follows ``--role``; ``disaggregation_bootstrap_port`` is where
decode workers reach this worker's KV.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from tandem import __version__
from tandem.models.info import ModelInfo, read_json
from tandem.wire.sglang import spb
from tandem.worker.config import Role, WorkerConfig

# --role → SGLang's --disaggregation-mode.
DISAGGREGATION_MODES: dict[Role, str] = {"prefill": "prefill", "decode": "decode", "both": "null"}
SGLANG_VERSION = f"tandem-{__version__}"


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


def model_info(config: WorkerConfig, info: ModelInfo) -> spb.GetModelInfoResponse:
    return spb.GetModelInfoResponse(
        model_path=str(info.model_dir),
        tokenizer_path=str(info.model_dir),
        is_generation=True,
        served_model_name=config.model_name,
        max_context_length=info.max_context,
        vocab_size=info.vocab_size,
        supports_vision=not config.language_model_only,
        model_type=info.model_type,
        eos_token_ids=list(info.eos_token_ids),
        pad_token_id=_special_id(info, "pad_token_id"),
        bos_token_id=_special_id(info, "bos_token_id"),
        max_req_input_len=info.max_context - 1,
        architectures=list(_config(info).get("architectures", [])),
    )


def server_args(config: WorkerConfig, info: ModelInfo, bootstrap_port: int) -> dict[str, Any]:
    """SGLang's ``server_args`` members that describe this worker."""
    return {
        "model_path": str(info.model_dir),
        "served_model_name": config.model_name,
        "tokenizer_path": str(info.model_dir),
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "context_length": info.max_context,
        "is_embedding": False,
        "vocab_size": info.vocab_size,
        "disaggregation_mode": DISAGGREGATION_MODES[config.role],
        "disaggregation_bootstrap_port": bootstrap_port,
        "kv_cache_dtype": "float32",
        "page_size": config.block_size,
    }


def server_info(
    config: WorkerConfig, info: ModelInfo, bootstrap_port: int, started: float, active: int
) -> spb.GetServerInfoResponse:
    args = struct_pb2.Struct()
    args.update(server_args(config, info, bootstrap_port))
    uptime = time.monotonic() - started
    start_time = timestamp_pb2.Timestamp()
    start_time.FromSeconds(int(time.time() - uptime))
    return spb.GetServerInfoResponse(
        server_args=args,
        active_requests=active,
        uptime_seconds=uptime,
        sglang_version=SGLANG_VERSION,
        server_type="grpc",
        start_time=start_time,
    )


def loads(config: WorkerConfig, running: int, waiting: int) -> spb.GetLoadsResponse:
    load = spb.SchedulerLoad(
        dp_rank=0,
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_total_reqs=running + waiting,
        disaggregation=spb.DisaggregationMetrics(mode=DISAGGREGATION_MODES[config.role]),
    )
    return spb.GetLoadsResponse(
        timestamp=datetime.now(UTC).isoformat(),
        version=SGLANG_VERSION,
        dp_rank_count=1,
        loads=[load],
    )
