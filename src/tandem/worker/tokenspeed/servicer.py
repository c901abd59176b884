"""``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` over a Tandem engine
(``engine.protocol.Engine``).

Three legs (``bootstrap.py``): aggregated (no ``kv_bootstrap_info``: the whole request here,
whatever the role), prefill (``--role prefill``: the prompt KV held under the room's
transfer id with the pixel-free media description, one greedy token answered) and decode
(``--role decode``: the prefill described over the KV side channel, the missing KV pulled,
the client's sampling run; its items' metadata must match the description's count and any
pixels it carries are not read). Errors are gRPC statuses only (``worker/refusals.py``); a
decode leg refused or failed before its pull frees the prefill's KV. The answer frames are
``answers.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from tandem.engine.protocol import Engine
from tandem.engine.request import EngineRequest
from tandem.engine.types import MediaInputs
from tandem.models.info import ModelInfo
from tandem.wire.tokenspeed import tpb, tpb_grpc
from tandem.worker import handoff
from tandem.worker.config import WorkerConfig
from tandem.worker.embedding_channel import EmbeddingClient
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.kv_events.stream import KvEventRpcs
from tandem.worker.output_plan import plan_outputs
from tandem.worker.refusals import (
    RequestRefused,
    generation_refusal,
    planning_refusal,
)
from tandem.worker.room_legs import RoomKvLegs
from tandem.worker.tokenizer_files import tokenizer_archive, tokenizer_chunks
from tandem.worker.tokenspeed import answers, bootstrap, info, media
from tandem.worker.tokenspeed.epd_prefill import embedded_media
from tandem.worker.tokenspeed.inputs import (
    prefill_sampling,
    prompt_ids,
    refuse_unsupported,
    sampling_config,
    sampling_n,
    wire_constraint,
)
from tandem.worker.tokenspeed.unimplemented import Unimplemented

log = logging.getLogger("tandem.worker")


@dataclass(slots=True)
class _Plan:
    engine_request: EngineRequest
    leg: bootstrap.Leg
    stop_ids: frozenset[int]  # a "stop" ending on one of these names it (matched_token_id)


class TokenSpeedServicer(
    RoomKvLegs, KvEventRpcs, Unimplemented, tpb_grpc.TokenSpeedSchedulerServicer
):
    def __init__(
        self,
        config: WorkerConfig,
        model: ModelInfo,
        engine: Engine,
        kv_client: KvChannelClient,
        bootstrap_port: int,
    ) -> None:
        self.config = config
        self.model = model
        self.engine = engine
        self.kv_client = kv_client
        self.bootstrap_port = bootstrap_port
        self.started = time.monotonic()
        self._archive = tokenizer_archive(model)
        self._background: set[asyncio.Task[Any]] = set()
        self._embeddings = EmbeddingClient()  # E/P/D: features from encode workers

    # -- Generate -----------------------------------------------------------------------

    async def Generate(self, request: tpb.GenerateRequest, context: grpc.aio.ServicerContext):
        rid = request.request_id or f"tandem-{uuid.uuid4().hex}"
        log.info(
            "Generate request %s: stream=%s, items=%d, pixels=%s, room=%s",
            rid,
            request.stream,
            len(request.mm_inputs.items),
            media.has_pixels(request),
            request.kv_bootstrap_info.bootstrap_room
            if request.HasField("kv_bootstrap_info")
            else None,
        )
        try:
            plan = await self._plan(request, rid)
        except RequestRefused as exc:
            await context.abort(exc.status, str(exc), exc.trailing_metadata())
        try:
            async for response in self._run(request, rid, plan):
                yield response
        except Exception as exc:
            refused = generation_refusal(exc, rid)
            await context.abort(refused.status, str(refused), refused.trailing_metadata())

    async def _plan(self, request: tpb.GenerateRequest, rid: str) -> _Plan:
        remote: handoff.RemoteKv | None = None
        pulling = False
        try:
            boot = bootstrap.bootstrap_of(request)
            leg = bootstrap.check_leg(boot, self.config.role)
            if boot is not None and leg == "decode":
                remote = bootstrap.prefill_kv(boot, rid)
            bootstrap.refuse_embeddings_on_decode(request, leg)
            refuse_unsupported(request)
            ids = prompt_ids(request)
            # A decode leg's items are metadata: their pixels, if any came, are not read.
            items = media.read_items(request, len(ids), self.model, pixels=leg != "decode")
            if boot is not None and leg == "prefill":
                return await self._prefill_plan(request, rid, ids, items, boot.transfer_id(rid))
            engine_request, stop_ids = await self._engine_request(request, rid, ids, items, leg)
            if remote is not None:
                pulling = True
                await self._import(engine_request, remote)
                media.check_described(items, engine_request.media)
            return _Plan(engine_request, leg, stop_ids)
        except asyncio.CancelledError:
            if remote is not None:  # the caller went away: the KV is nobody's now
                self._spawn(self._release(remote, wait=not pulling))
            raise
        except Exception as exc:
            if remote is not None:
                # This decode leg will never pull: free the prefill's KV now, not at lease
                # end (or once it appears, if the prefill is still computing it).
                await self._release(remote, wait=not pulling)
            raise planning_refusal(exc, rid) from None

    async def _prefill_plan(
        self,
        request: tpb.GenerateRequest,
        rid: str,
        ids: list[int],
        items: list[media.WireItem],
        transfer_id: str,
    ) -> _Plan:
        shape = self.engine.shape
        # Validated as the decode leg will validate it, so both legs refuse alike.
        sampling_config(request, len(ids), shape.max_context, shape.vocab_size)
        engine_request = EngineRequest(
            request_id=rid,
            prompt_ids=ids,
            sampling=prefill_sampling(),
            media=await self._media(request, ids, items),
            export_transfer_id=transfer_id,
        )
        return _Plan(engine_request, "prefill", frozenset())

    async def _engine_request(
        self,
        request: tpb.GenerateRequest,
        rid: str,
        ids: list[int],
        items: list[media.WireItem],
        leg: bootstrap.Leg,
    ) -> tuple[EngineRequest, frozenset[int]]:
        shape = self.engine.shape
        sampling = sampling_config(request, len(ids), shape.max_context, shape.vocab_size)
        # Before any media or KV work: a bad constraint is refused at once.
        compiled = await plan_outputs(
            self.engine,
            wire_constraint(request.sampling_params),
            list(sampling.stop_token_ids),
            sampling.logprobs is not None,
            self.config.engine,
        )
        engine_request = EngineRequest(
            request_id=rid,
            prompt_ids=ids,
            sampling=sampling,
            media=None if leg == "decode" else await self._media(request, ids, items),
            n=sampling_n(request),
            constraint=compiled,
        )
        stop_ids = frozenset(sampling.stop_token_ids) | frozenset(self.model.eos_token_ids)
        return engine_request, stop_ids

    async def _media(
        self, request: tpb.GenerateRequest, ids: list[int], items: list[media.WireItem]
    ) -> MediaInputs | None:
        """An aggregated or prefill leg's media: the items' own pixels, or (E/P/D) the
        embeddings encode workers computed for them."""
        if request.HasField("encode_bootstrap_info"):
            return await self._embedded_media(request, ids, items)
        if not items:
            media.refuse_media_tokens(ids, self.model)
            return None
        return media.pixel_media(
            items, self.model, supports_vision=not self.config.language_model_only
        )

    async def _embedded_media(
        self, request: tpb.GenerateRequest, ids: list[int], items: list[media.WireItem]
    ) -> MediaInputs | None:
        """E/P/D: the one place where items' embeddings are taken from encode workers
        (``encode_bootstrap_info``, one room per item) instead of computed from pixels."""
        return await embedded_media(
            request,
            ids,
            items,
            self.model,
            self._embeddings,
            self.config.kv_pull_wait_s,
            supports_vision=not self.config.language_model_only,
        )

    async def _run(
        self, request: tpb.GenerateRequest, rid: str, plan: _Plan
    ) -> AsyncIterator[tpb.GenerateResponse]:
        async for out in self.engine.generate(plan.engine_request):
            if request.stream and out.token_ids:
                yield tpb.GenerateResponse(request_id=rid, chunk=answers.chunk(out))
            if out.finished:
                complete = answers.complete(out, request.stream, plan.stop_ids)
                yield tpb.GenerateResponse(request_id=rid, complete=complete)

    # -- other RPCs ---------------------------------------------------------------------

    async def HealthCheck(self, request: Any, context: Any) -> tpb.HealthCheckResponse:
        return info.health(self.config, self.engine.alive)

    async def Abort(self, request: tpb.AbortRequest, context: Any) -> tpb.AbortResponse:
        self.engine.abort(request.request_id)  # every sample of an n > 1 request ends
        return tpb.AbortResponse(success=True, message="")

    async def GetModelInfo(self, request: Any, context: Any) -> tpb.GetModelInfoResponse:
        return info.model_info(self.config, self.model)

    async def GetServerInfo(self, request: Any, context: Any) -> tpb.GetServerInfoResponse:
        return info.server_info(
            self.config, self.model, self.bootstrap_port, self.started, self.engine.num_running
        )

    async def GetLoads(self, request: tpb.GetLoadsRequest, context: grpc.aio.ServicerContext):
        if request.HasField("dp_rank") and request.dp_rank != 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"dp_rank {request.dp_rank}: this worker has one data-parallel rank, 0",
            )
        return info.loads(self.config, self.engine.num_running, self.engine.num_waiting)

    async def GetTokenizer(self, request: Any, context: Any):
        for chunk in tokenizer_chunks(self._archive):
            yield chunk

    def stats(self) -> dict[str, Any]:
        """Counters for the side channel's Stats call and tests."""
        return {**self.engine.counters(), "media_items_processed": 0}
