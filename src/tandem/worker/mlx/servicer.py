"""``mlx.grpc.engine.MlxEngine`` over a Tandem engine (``engine.protocol.Engine``).

It answers as MLX's servicer does where a gateway can tell (docs/worker-protocols.md):
tokenized input only, one sample per request, one token per chunk then an empty
``complete`` when streaming, a single ``complete`` otherwise (``answers.py``), the sampling
fields read as MLX reads them (``inputs.py``), an aborted request's stream ended without a
``complete``, an instant ``HealthCheck``. Where it says more it says the truth about this
worker: the served name, the context, its own ``server_type`` (``info.py``). Errors are gRPC
statuses naming the field (``worker/refusals.py``); none stops the worker.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from tandem.engine.protocol import Engine
from tandem.engine.request import EngineRequest
from tandem.models.info import ModelInfo
from tandem.wire.mlx import mpb, mpb_grpc
from tandem.worker.config import WorkerConfig
from tandem.worker.mlx import answers, info
from tandem.worker.mlx.inputs import prompt_ids, refuse_media_tokens, sampling_config, stop_ids
from tandem.worker.output_plan import plan_outputs
from tandem.worker.refusals import RequestRefused, generation_refusal, planning_refusal
from tandem.worker.tokenizer_files import tokenizer_archive, tokenizer_chunks

log = logging.getLogger("tandem.worker")


@dataclass(slots=True)
class _Plan:
    engine_request: EngineRequest
    stop_ids: frozenset[int]  # a "stop" ending on one of these names it


class MlxServicer(mpb_grpc.MlxEngineServicer):
    def __init__(self, config: WorkerConfig, model: ModelInfo, engine: Engine) -> None:
        self.config = config
        self.model = model
        self.engine = engine
        self.started = time.monotonic()
        self.active = 0  # Generate calls in progress (GetServerInfo's active_requests)
        self._archive = tokenizer_archive(model)

    # -- Generate -----------------------------------------------------------------------

    async def Generate(self, request: mpb.GenerateRequest, context: grpc.aio.ServicerContext):
        rid = request.request_id or f"tandem-{uuid.uuid4().hex}"
        log.info(
            "Generate request %s: input=%s, stream=%s",
            rid,
            request.WhichOneof("input"),
            request.stream,
        )
        try:
            plan = await self._plan(request, rid)
        except RequestRefused as exc:
            await context.abort(exc.status, str(exc), exc.trailing_metadata())
        self.active += 1
        try:
            async for response in self._run(request, plan):
                yield response
        except Exception as exc:
            refused = generation_refusal(exc, rid)
            await context.abort(refused.status, str(refused), refused.trailing_metadata())
        finally:
            self.active -= 1

    async def _plan(self, request: mpb.GenerateRequest, rid: str) -> _Plan:
        try:
            ids = prompt_ids(request)
            refuse_media_tokens(ids, self.model)
            shape = self.engine.shape
            sampling = sampling_config(request, len(ids), shape.max_context, shape.vocab_size)
            # No constraint travels here; this refuses logprobs an engine has none of.
            await plan_outputs(
                self.engine,
                None,
                list(sampling.stop_token_ids),
                sampling.logprobs is not None,
                self.config.engine,
            )
            engine_request = EngineRequest(request_id=rid, prompt_ids=ids, sampling=sampling)
            return _Plan(engine_request, stop_ids(request, self.model))
        except Exception as exc:
            raise planning_refusal(exc, rid) from None

    async def _run(
        self, request: mpb.GenerateRequest, plan: _Plan
    ) -> AsyncIterator[mpb.GenerateResponse]:
        async for out in self.engine.generate(plan.engine_request):
            if out.finish_reason == "abort":
                return  # as MLX's servicer: an aborted request's stream just ends
            if request.stream:
                for chunk in answers.chunks(out):
                    yield chunk
            if out.finished:
                yield answers.complete(out, request.stream, plan.stop_ids)

    # -- other RPCs ---------------------------------------------------------------------

    async def HealthCheck(self, request: Any, context: Any) -> mpb.HealthCheckResponse:
        return info.health(self.engine.alive)

    async def Abort(self, request: mpb.AbortRequest, context: Any) -> mpb.AbortResponse:
        for rid in request.request_ids:
            self.engine.abort(rid)
        return mpb.AbortResponse()

    async def GetModelInfo(self, request: Any, context: Any) -> mpb.GetModelInfoResponse:
        return info.model_info(self.config, self.model)

    async def GetServerInfo(self, request: Any, context: Any) -> mpb.GetServerInfoResponse:
        return info.server_info(self.started, self.active)

    async def GetTokenizer(self, request: Any, context: Any):
        for chunk in tokenizer_chunks(self._archive):
            yield chunk

    def stats(self) -> dict[str, Any]:
        """Counters for the side channel's Stats call and tests."""
        return {**self.engine.counters(), "media_items_processed": 0}
