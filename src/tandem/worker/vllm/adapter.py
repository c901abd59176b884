"""The worker's vLLM service on a gRPC server: what ``worker/adapters.py`` calls."""

from __future__ import annotations

import grpc

from tandem.models.processor import load_processor
from tandem.models.video import load_video_processor, text_encoder
from tandem.wire.proto import pb_grpc
from tandem.wire.worker_marker import GET_SERVER_INFO_METHOD
from tandem.worker.context import WorkerContext
from tandem.worker.media_limits import MediaRefsLimits
from tandem.worker.vllm.leg_counter import CountingServicer
from tandem.worker.vllm.media_refs import MediaRefsProcessor

SERVER_INFO_METHOD = GET_SERVER_INFO_METHOD


def serve(context: WorkerContext, server: grpc.aio.Server) -> CountingServicer:
    """Serve ``vllm.grpc.engine.VllmEngine`` on ``server``; the servicer, for its stats.

    Every worker counts what each PD leg brings it (bytes, pixel bytes): cheap, and how
    benchmarks and compatibility tests see what a gateway put on each leg.
    """
    config = context.config
    refs = None
    if config.accepts_media_refs:
        info, model_dir = context.model, context.model_dir
        refs = MediaRefsProcessor(
            info,
            load_processor(model_dir),
            config.media,
            MediaRefsLimits(config.media_limits),
            video=load_video_processor(model_dir, info.takes_video),
            encode=text_encoder(model_dir) if info.takes_video else None,
        )
    servicer = CountingServicer(
        config, context.model, context.engine, refs, context.kv_client, context.advertised
    )
    pb_grpc.add_VllmEngineServicer_to_server(servicer, server)
    servicer.serve_kv_events(context.kv_events, context.prefix_cache)
    return servicer
