"""``trtllm.TrtllmService`` over a Tandem engine (``engine.protocol.Engine``).

One leg only: each ``Generate`` is a whole request (the worker serves ``--role both``;
``disaggregated_params`` asking for a phase are refused). Planning reads and checks every
field first (``inputs.py``, ``sampling.py``), compiles the constraint before any image is
decoded (``worker/output_plan.py``), then decodes and places the images (``media.py``);
the answer frames are ``answers.py``'s. Errors are gRPC statuses only
(``worker/refusals.py``): a request refused as sent is INVALID_ARGUMENT naming the field,
media saturation UNAVAILABLE, a bug INTERNAL.

``Abort`` ends every sequence of the named request (their completes say ``abort``) and
answers ``success`` when it was running here; an abort that comes first is still kept a
minute by the engine, in case its request is on the way. ``Embed`` and
``SubscribeKvEvents`` are UNIMPLEMENTED with a reason.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc

from tandem.engine.protocol import Engine
from tandem.engine.refusals import RefusedField
from tandem.engine.request import EngineRequest
from tandem.engine.types import MediaInputs
from tandem.models.info import ModelInfo
from tandem.wire.trtllm import trpb, trpb_grpc
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_events.stream import KvEventRpcs
from tandem.worker.output_plan import plan_outputs
from tandem.worker.refusals import RequestRefused, generation_refusal, planning_refusal
from tandem.worker.tokenizer_files import tokenizer_archive, tokenizer_chunks
from tandem.worker.trtllm import answers, info
from tandem.worker.trtllm.inputs import (
    cache_salt,
    embedding_bias,
    logprobs_of,
    prompt_ids,
    refuse_unsupported,
    wire_constraint,
)
from tandem.worker.trtllm.media import (
    FIELD,
    LMO_REASON,
    ImageBytes,
    image_blobs,
    refuse_image_tokens,
    refuse_other_media_tokens,
)
from tandem.worker.trtllm.sampling import sampling_config, sampling_n

log = logging.getLogger("tandem.worker")


@dataclass(slots=True)
class _Plan:
    engine_request: EngineRequest
    answers: answers.AnswerPlan


class TrtllmServicer(KvEventRpcs, trpb_grpc.TrtllmServiceServicer):
    def __init__(
        self, config: WorkerConfig, model: ModelInfo, engine: Engine, images: ImageBytes | None
    ) -> None:
        self.config = config
        self.model = model
        self.engine = engine
        self.images = images  # None: --language-model-only, no vision tower
        self._archive = tokenizer_archive(model)
        self._running: Counter[str] = Counter()  # request ids in Generate now

    # -- Generate -----------------------------------------------------------------------

    async def Generate(self, request: trpb.GenerateRequest, context: grpc.aio.ServicerContext):
        rid = request.request_id or f"tandem-{uuid.uuid4().hex}"
        arrival = request.arrival_time if request.HasField("arrival_time") else time.time()
        log.info(
            "Generate request %s: streaming=%s, images=%d, n=%d",
            rid,
            request.streaming,
            len(request.multimodal_input.image_data),
            request.sampling_config.num_return_sequences,
        )
        self._running[rid] += 1
        try:
            try:
                plan = await self._plan(request, rid, arrival)
            except RequestRefused as exc:
                await context.abort(exc.status, str(exc), exc.trailing_metadata())
            try:
                async for response in self._run(plan):
                    yield response
            except Exception as exc:
                refused = generation_refusal(exc, rid)
                await context.abort(refused.status, str(refused), refused.trailing_metadata())
        finally:
            self._running[rid] -= 1
            if self._running[rid] <= 0:
                del self._running[rid]

    async def _plan(self, request: trpb.GenerateRequest, rid: str, arrival: float) -> _Plan:
        try:
            refuse_unsupported(request)
            shape = self.engine.shape
            ids = prompt_ids(request, shape.vocab_size)
            logprobs = logprobs_of(request)
            sampling = sampling_config(
                request,
                len(ids),
                shape.max_context,
                shape.vocab_size,
                logit_bias=embedding_bias(request, shape.vocab_size),
                logprobs=logprobs,
            )
            # Before any image is decoded: a bad constraint is refused at once.
            compiled = await plan_outputs(
                self.engine,
                wire_constraint(request),
                list(sampling.stop_token_ids),
                logprobs is not None,
                self.config.engine,
            )
            engine_request = EngineRequest(
                request_id=rid,
                prompt_ids=ids,
                sampling=sampling,
                media=await self._media(image_blobs(request), ids),
                n=sampling_n(request),
                cache_salt=cache_salt(request),
                constraint=compiled,
            )
        except Exception as exc:
            raise planning_refusal(exc, rid) from None
        perf = None
        if request.output_config.return_perf_metrics:
            perf = answers.PerfClock(arrival, shape.kv_bytes_per_token)
        plan = answers.AnswerPlan(
            request_id=rid,
            stream=request.streaming,
            stop_ids=frozenset(sampling.stop_token_ids) | frozenset(self.model.eos_token_ids),
            keep_stop_token=request.include_stop_token_in_output,
            perf=perf,
        )
        return _Plan(engine_request, plan)

    async def _media(self, blobs: list[bytes], ids: list[int]) -> MediaInputs | None:
        refuse_other_media_tokens(ids, self.model)
        if not blobs:
            refuse_image_tokens(ids, self.model)
            return None
        if self.images is None:
            raise RefusedField(f"{FIELD}: {LMO_REASON}", "multimodal_not_supported")
        return await self.images.media(blobs, ids)

    async def _run(self, plan: _Plan) -> AsyncIterator[trpb.GenerateResponse]:
        if plan.answers.perf is not None:
            plan.answers.perf.scheduled = time.time()
        async for out in self.engine.generate(plan.engine_request):
            for response in answers.frames(out, plan.answers):
                yield response

    # -- other RPCs ---------------------------------------------------------------------

    async def HealthCheck(self, request: Any, context: Any) -> trpb.HealthCheckResponse:
        return info.health(self.engine.alive)

    async def Abort(self, request: trpb.AbortRequest, context: Any) -> trpb.AbortResponse:
        rid = request.request_id
        if not rid:
            return trpb.AbortResponse(success=False, message="request_id is empty")
        self.engine.abort(rid)  # every sequence of an n > 1 request ends
        if rid in self._running:
            return trpb.AbortResponse(success=True, message=f"request {rid} aborted")
        return trpb.AbortResponse(
            success=False,
            message=f"no request {rid} is running on this worker; should it arrive within a "
            "minute, it ends at once",
        )

    async def GetModelInfo(self, request: Any, context: Any) -> trpb.GetModelInfoResponse:
        return info.model_info(
            self.config, self.model, self.engine.shape, self.engine.returns_logprobs
        )

    async def GetServerInfo(self, request: Any, context: Any) -> trpb.GetServerInfoResponse:
        return info.server_info()

    async def GetTokenizer(self, request: Any, context: Any):
        for chunk in tokenizer_chunks(self._archive):
            yield chunk

    async def Embed(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "Tandem workers serve generative models only: Embed is not implemented",
        )

    def stats(self) -> dict[str, Any]:
        """Counters for the side channel's Stats call and tests."""
        processed = self.images.items_processed if self.images is not None else 0
        return {**self.engine.counters(), "media_items_processed": processed}
