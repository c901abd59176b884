"""``sglang.grpc.scheduler.SglangScheduler`` over a Tandem engine (``engine.protocol.Engine``).

Three legs (``bootstrap.py``): aggregated (no ``disaggregated_params``: the whole request
here, whatever the role), prefill (``--role prefill``: the prompt KV held under the room's
transfer id with the pixel-free media description, one greedy token answered) and decode
(``--role decode``: the prefill described over the KV side channel, the missing KV pulled,
the client's sampling run). Errors are gRPC statuses only (``worker/refusals.py``); a decode
leg refused or failed before its pull frees the prefill's KV.

Answers: streamed, one chunk per engine output with tokens (the new ids; the counts
cumulative; the chunk's logprobs) and, when a sample ends, a ``complete`` repeating its
last chunk's ids; not streamed, one ``complete`` per sample with every id and logprob.
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
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.types import MediaInputs
from tandem.models.info import ModelInfo
from tandem.wire.sglang import spb, spb_grpc
from tandem.worker import handoff
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.kv_events.stream import KvEventRpcs
from tandem.worker.output_plan import plan_outputs
from tandem.worker.refusals import (
    RequestRefused,
    generation_refusal,
    planning_refusal,
)
from tandem.worker.room_legs import RoomKvLegs
from tandem.worker.sglang import bootstrap, info
from tandem.worker.sglang.inputs import (
    prefill_sampling,
    prompt_ids,
    refuse_unsupported,
    sampling_config,
    sampling_n,
    wire_constraint,
)
from tandem.worker.sglang.logprobs import output_logprobs
from tandem.worker.sglang.media import has_pixels, refuse_unread_media, wire_media
from tandem.worker.sglang.unimplemented import Unimplemented
from tandem.worker.tokenizer_files import tokenizer_archive, tokenizer_chunks

log = logging.getLogger("tandem.worker")


@dataclass(slots=True)
class _Plan:
    engine_request: EngineRequest
    leg: bootstrap.Leg
    stop_ids: frozenset[int]  # a "stop" ending on one of these names it (matched_token_id)


class SglangServicer(RoomKvLegs, KvEventRpcs, Unimplemented, spb_grpc.SglangSchedulerServicer):
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

    # -- Generate -----------------------------------------------------------------------

    async def Generate(self, request: spb.GenerateRequest, context: grpc.aio.ServicerContext):
        rid = request.request_id or f"tandem-{uuid.uuid4().hex}"
        log.info(
            "Generate request %s: stream=%s, pixels=%s, room=%s",
            rid,
            request.stream,
            has_pixels(request),
            request.disaggregated_params.bootstrap_room
            if request.HasField("disaggregated_params")
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

    async def _plan(self, request: spb.GenerateRequest, rid: str) -> _Plan:
        remote: handoff.RemoteKv | None = None
        pulling = False
        try:
            boot = bootstrap.bootstrap_of(request)
            leg = bootstrap.check_leg(boot, self.config.role)
            if boot is not None and leg == "decode":
                remote = bootstrap.prefill_kv(boot, rid)
            refuse_unsupported(request)
            refuse_unread_media(request)
            ids = prompt_ids(request)
            if boot is not None and leg == "prefill":
                return self._prefill_plan(request, rid, ids, boot.transfer_id(rid))
            engine_request, stop_ids = await self._engine_request(request, rid, ids, leg)
            if remote is not None:
                pulling = True
                await self._import(engine_request, remote)
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

    def _prefill_plan(
        self, request: spb.GenerateRequest, rid: str, ids: list[int], transfer_id: str
    ) -> _Plan:
        shape = self.engine.shape
        # Validated as the decode leg will validate it, so both legs refuse alike.
        sampling_config(request, len(ids), shape.max_context, shape.vocab_size)
        engine_request = EngineRequest(
            request_id=rid,
            prompt_ids=ids,
            sampling=prefill_sampling(),
            media=self._media(request, ids),
            export_transfer_id=transfer_id,
        )
        return _Plan(engine_request, "prefill", frozenset())

    async def _engine_request(
        self, request: spb.GenerateRequest, rid: str, ids: list[int], leg: bootstrap.Leg
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
            media=None if leg == "decode" else self._media(request, ids),
            n=sampling_n(request),
            constraint=compiled,
        )
        stop_ids = frozenset(sampling.stop_token_ids) | frozenset(self.model.eos_token_ids)
        return engine_request, stop_ids

    def _media(self, request: spb.GenerateRequest, ids: list[int]) -> MediaInputs | None:
        return wire_media(
            request, ids, self.model, supports_vision=not self.config.language_model_only
        )

    async def _run(
        self, request: spb.GenerateRequest, rid: str, plan: _Plan
    ) -> AsyncIterator[spb.GenerateResponse]:
        top = plan.engine_request.sampling.logprobs or 0
        async for out in self.engine.generate(plan.engine_request):
            if request.stream and out.token_ids:
                yield spb.GenerateResponse(request_id=rid, chunk=_chunk(out, top))
            if out.finished:
                complete = _complete(out, request.stream, plan.stop_ids)
                if not request.stream:
                    wire = output_logprobs(out.output_logprobs, top)
                    if wire is not None:
                        complete.output_logprobs.CopyFrom(wire)
                yield spb.GenerateResponse(request_id=rid, complete=complete)

    # -- other RPCs ---------------------------------------------------------------------

    async def HealthCheck(self, request: Any, context: Any) -> spb.HealthCheckResponse:
        alive = self.engine.alive
        return spb.HealthCheckResponse(healthy=alive, message="ok" if alive else "engine stopped")

    async def Abort(self, request: spb.AbortRequest, context: Any) -> spb.AbortResponse:
        self.engine.abort(request.request_id)
        return spb.AbortResponse(success=True, message="")

    async def GetModelInfo(self, request: Any, context: Any) -> spb.GetModelInfoResponse:
        return info.model_info(self.config, self.model)

    async def GetServerInfo(self, request: Any, context: Any) -> spb.GetServerInfoResponse:
        return info.server_info(
            self.config, self.model, self.bootstrap_port, self.started, self.engine.num_running
        )

    async def GetLoads(self, request: spb.GetLoadsRequest, context: grpc.aio.ServicerContext):
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


def _chunk(out: EngineOutput, top: int) -> spb.GenerateStreamChunk:
    return spb.GenerateStreamChunk(
        token_ids=out.token_ids,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=output_logprobs(out.logprobs, top),
        index=out.index,
    )


def _complete(out: EngineOutput, stream: bool, stop_ids: frozenset[int]) -> spb.GenerateComplete:
    # Streamed, the chunks carried every id: the complete repeats the last chunk's.
    ids = out.token_ids if stream else out.output_ids
    complete = spb.GenerateComplete(
        output_ids=ids,
        finish_reason=out.finish_reason or "stop",
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        index=out.index,
    )
    last = out.output_ids[-1] if out.output_ids else None
    if out.finish_reason == "stop" and last is not None and last in stop_ids:
        complete.matched_token_id = last
    return complete
