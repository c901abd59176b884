"""What a worker says about itself: model info, server info, loads (tokenizer files:
``worker/tokenizer_files.py``).

Capabilities are advertised honestly: a language-model-only worker reports
``supports_vision=false`` and no media processor, so gateways never send it
pixels or media refs.
"""

from __future__ import annotations

import functools
import json
import time
from datetime import UTC, datetime

from tandem import __version__
from tandem.models.info import ModelInfo
from tandem.wire.proto import pb
from tandem.wire.shm import shm_namespace_id
from tandem.worker.config import Role, WorkerConfig

KV_ROLES: dict[Role, str] = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}


def model_info(config: WorkerConfig, info: ModelInfo) -> pb.GetModelInfoResponse:
    architectures = json.loads((info.model_dir / "config.json").read_text()).get(
        "architectures", []
    )
    return pb.GetModelInfoResponse(
        model_path=str(info.model_dir),
        is_generation=True,
        max_context_length=info.max_context,
        vocab_size=info.vocab_size,
        supports_vision=not config.language_model_only,
        served_model_name=config.model_name,
        tokenizer_path=str(info.model_dir),
        model_type=info.model_type,
        architectures=architectures,
        eos_token_ids=list(info.eos_token_ids),
        max_req_input_len=info.max_context - 1,
    )


def server_info(
    config: WorkerConfig, engine_id: str, started: float, active: int
) -> pb.GetServerInfoResponse:
    refs = config.accepts_media_refs
    return pb.GetServerInfoResponse(
        active_requests=active,
        uptime_seconds=time.monotonic() - started,
        server_type="vllm-grpc",
        kv_connector=config.kv_connector,
        kv_role=KV_ROLES[config.role],
        kv_engine_id=engine_id,
        data_parallel_size=1,
        # Tensors may come as /dev/shm segments (tandem.wire.shm): gateways that share our
        # /dev/shm (equal id) send them so under --multimodal-tensor-transport auto.
        shm_namespace_id=_shm_namespace(),
        kv_cache_dtype="float32",
        block_size=config.block_size,
        model_dtype="float32",
        mm_processor="inprocess" if refs else "",
        mm_media_ref_schemes=config.media.schemes_label() if refs else "",
        mm_processor_source="flag" if refs else "",
        mm_device_do_normalize=False,
        multimodal_encoder_dtype="" if config.language_model_only else "float32",
    )


@functools.cache
def _shm_namespace() -> str:
    return shm_namespace_id()  # fixed for the process's life; read on every GetServerInfo


def loads(running: int, waiting: int) -> pb.GetLoadsResponse:
    load = pb.SchedulerLoad(
        dp_rank=0,
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_total_reqs=running + waiting,
    )
    return pb.GetLoadsResponse(
        timestamp=datetime.now(UTC).isoformat(),
        version=f"tandem-{__version__}",
        dp_rank_count=1,
        loads=[load],
    )
