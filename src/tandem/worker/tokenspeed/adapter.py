"""The worker's TokenSpeed services on a gRPC server: what ``worker/adapters.py`` calls.

Generation workers (``--role both|prefill|decode``) serve ``TokenSpeedScheduler``; an
encode worker (``--role encode``) serves the scheduler's discovery copy
(``discovery.py``) and, beside it, ``TokenSpeedEncoder`` (see ``_serve_encode``).
"""

from __future__ import annotations

from typing import Any

import grpc

from tandem.wire.tokenspeed import GET_SERVER_INFO_METHOD, epb_grpc, tpb_grpc
from tandem.worker.context import ServedProtocol, WorkerContext
from tandem.worker.embedding_cache import EmbeddingCache
from tandem.worker.embedding_channel import EmbeddingChannelServer, EmbeddingStore
from tandem.worker.tokenspeed.discovery import EncodeDiscoveryServicer
from tandem.worker.tokenspeed.encode_service import EncodeService
from tandem.worker.tokenspeed.leg_counter import CountingTokenSpeedServicer

SERVER_INFO_METHOD = GET_SERVER_INFO_METHOD


def serve(context: WorkerContext, server: grpc.aio.Server) -> ServedProtocol:
    """Serve TokenSpeed's services on ``server``; the servicer, for its stats. The KV side
    channel the process adds to the same server is also what decode workers dial at this
    worker's bootstrap port."""
    if context.config.role == "encode":
        return _serve_encode(context, server)
    servicer = CountingTokenSpeedServicer(
        context.config, context.model, context.engine, context.kv_client, context.bootstrap_port
    )
    tpb_grpc.add_TokenSpeedSchedulerServicer_to_server(servicer, server)
    servicer.serve_kv_events(context.kv_events, context.prefix_cache)
    return servicer


class _EncodeWorker:
    """What an encode worker reports: the discovery copy's counters and the encoder's."""

    def __init__(self, discovery: EncodeDiscoveryServicer, encode: EncodeService) -> None:
        self.discovery = discovery
        self.encode = encode

    def stats(self) -> dict[str, Any]:
        return {**self.discovery.stats(), **self.encode.stats()}


def _serve_encode(context: WorkerContext, server: grpc.aio.Server) -> ServedProtocol:
    """The discovery copy, ``TokenSpeedEncoder`` and the embedding side channel (where
    prefill workers pull the features, on the gRPC and the bootstrap port alike)."""
    config = context.config
    discovery = EncodeDiscoveryServicer(
        config, context.model, context.engine, context.kv_client, context.bootstrap_port
    )
    tpb_grpc.add_TokenSpeedSchedulerServicer_to_server(discovery, server)
    if context.image_encoder is None:  # config refuses --engine null with this role
        raise ValueError("--role encode needs the embedded engine's vision tower")
    store = EmbeddingStore(lease_s=config.kv_lease_s)
    encode = EncodeService(
        context.image_encoder,
        EmbeddingCache(config.embedding_cache_mb << 20),
        store,
        context.model,
        config.model_name,
    )
    epb_grpc.add_TokenSpeedEncoderServicer_to_server(encode, server)
    server.add_generic_rpc_handlers((EmbeddingChannelServer(store).handler(),))
    return _EncodeWorker(discovery, encode)
