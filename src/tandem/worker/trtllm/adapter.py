"""The worker's TensorRT-LLM service on a gRPC server: what ``worker/adapters.py`` calls."""

from __future__ import annotations

import grpc

from tandem.models.processor import load_processor
from tandem.wire.trtllm import GET_SERVER_INFO_METHOD, trpb_grpc
from tandem.worker.context import WorkerContext
from tandem.worker.media_limits import MediaRefsLimits
from tandem.worker.trtllm.leg_counter import CountingTrtllmServicer
from tandem.worker.trtllm.media import ImageBytes

SERVER_INFO_METHOD = GET_SERVER_INFO_METHOD


def serve(context: WorkerContext, server: grpc.aio.Server) -> CountingTrtllmServicer:
    """Serve ``trtllm.TrtllmService`` on ``server``; the servicer, for its stats.

    Images come as their source bytes, so a worker with a vision tower always decodes
    them itself (``--mm-processor`` is about vLLM's ``media_refs`` and does not apply); a
    ``--language-model-only`` worker loads no processor and refuses them.
    """
    config = context.config
    images = None
    if not config.language_model_only:
        images = ImageBytes(
            context.model,
            load_processor(context.model_dir),
            config.media,
            MediaRefsLimits(config.media_limits),
        )
    servicer = CountingTrtllmServicer(config, context.model, context.engine, images)
    trpb_grpc.add_TrtllmServiceServicer_to_server(servicer, server)
    servicer.serve_kv_events(context.kv_events, context.prefix_cache)
    return servicer
