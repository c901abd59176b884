"""``vllm.grpc.engine.VllmEngine`` over a Tandem engine (``engine.protocol.Engine``).

Error mapping (``worker/refusals.py``, shared with the other protocols): a request the
worker cannot serve as sent (bad shape, bad tensors, refused media, a pixel-less leg
without KV) is INVALID_ARGUMENT with a readable message; a transient media or KV-pull
failure is UNAVAILABLE; a bug is INTERNAL. None of them stops the worker.

Structured outputs: the constraint is compiled while planning (`worker/output_plan.py`), so a
bad schema, regex or grammar is INVALID_ARGUMENT with ``invalid_structured_output`` before
any KV is imported, and a decode leg's KV lease is released like any other refusal.
Logprobs, when asked: each streamed chunk carries its tokens' entries and the Complete
none; a non-streamed Complete carries every token's entry.
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
from tandem.engine.request import EngineOutput, EngineRequest
from tandem.engine.types import MediaInputs
from tandem.models.info import ModelInfo
from tandem.wire.kv_params import request_kv_params
from tandem.wire.proto import MediaIdentity, pb, pb_grpc
from tandem.wire.requests import has_media_refs, has_mm_inputs, sampling_n
from tandem.worker import handoff
from tandem.worker.config import WorkerConfig
from tandem.worker.kv_channel import KvChannelClient
from tandem.worker.kv_events.stream import KvEventRpcs
from tandem.worker.output_plan import plan_outputs
from tandem.worker.refusals import (
    KvImportError,
    RequestRefused,
    generation_refusal,
    planning_refusal,
)
from tandem.worker.tokenizer_files import tokenizer_archive, tokenizer_chunks
from tandem.worker.vllm import info
from tandem.worker.vllm.inputs import (
    LMO_REASON,
    prompt_ids,
    sampling_config,
    wire_constraint,
    wire_media,
)
from tandem.worker.vllm.logprobs import output_logprobs
from tandem.worker.vllm.media_refs import MediaRefsProcessor, build_media_identity

log = logging.getLogger("tandem.worker")


@dataclass(slots=True)
class _Plan:
    engine_request: EngineRequest
    identity: MediaIdentity | None
    remote: handoff.RemoteKv | None
    export_json: str | None


class WorkerServicer(KvEventRpcs, pb_grpc.VllmEngineServicer):
    def __init__(
        self,
        config: WorkerConfig,
        model: ModelInfo,
        engine: Engine,
        refs: MediaRefsProcessor | None,
        kv_client: KvChannelClient,
        advertised: tuple[str, int],
    ) -> None:
        self.config = config
        self.model = model
        self.engine = engine
        self.refs = refs
        self.kv_client = kv_client
        self.advertised = advertised
        self.engine_id = f"tandem-{uuid.uuid4().hex[:12]}"
        self.started = time.monotonic()
        self._archive = tokenizer_archive(model)

    # -- Generate -----------------------------------------------------------------------

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext):
        rid = request.request_id or f"tandem-{uuid.uuid4().hex}"
        log.info(
            "Generate request %s: input_type=%s, stream=%s, preprocessed_mm=%s, media_refs=%d",
            rid,
            request.WhichOneof("input"),
            request.stream,
            has_mm_inputs(request),
            len(request.media_refs.items),
        )
        try:
            plan = await self._plan(request, rid)
        except RequestRefused as exc:
            await context.abort(exc.status, str(exc), exc.trailing_metadata())
        try:
            async for response in self._run(request, plan):
                yield response
        except Exception as exc:
            refused = generation_refusal(exc, rid)
            await context.abort(refused.status, str(refused), refused.trailing_metadata())

    async def _plan(self, request: pb.GenerateRequest, rid: str) -> _Plan:
        remote: handoff.RemoteKv | None = None
        try:
            params = request_kv_params(request)
            if handoff.wants_import(params):
                remote = handoff.RemoteKv.from_params(params)
            return await self._build(request, rid, params, remote)
        except Exception as exc:
            if remote is not None:
                # This decode leg will never pull: free the prefill's KV now, not at lease end.
                await handoff.release_quietly(self.kv_client, remote)
            raise planning_refusal(exc, rid) from None

    async def _build(
        self,
        request: pb.GenerateRequest,
        rid: str,
        params: dict[str, Any] | None,
        remote: handoff.RemoteKv | None,
    ) -> _Plan:
        ids = prompt_ids(request)
        # Before any media work: a bad constraint is refused at once, for nothing fetched.
        sampling = request.sampling_params
        compiled = await plan_outputs(
            self.engine,
            wire_constraint(sampling),
            list(sampling.stop_token_ids),
            sampling.HasField("logprobs"),
            self.config.engine,
        )
        identity = None
        media: MediaInputs | None
        if has_media_refs(request):
            media, ids, salt, identity = await self._process_refs(request, ids, params, rid)
        else:
            wire = wire_media(
                request,
                ids,
                has_kv=remote is not None,
                supports_vision=not self.config.language_model_only,
                video_token_id=self.model.video_token_id,
            )
            media, salt = wire.media, wire.cache_salt
        shape = self.engine.shape
        engine_request = EngineRequest(
            request_id=rid,
            prompt_ids=ids,
            sampling=sampling_config(
                request.sampling_params, len(ids), shape.max_context, shape.vocab_size
            ),
            media=media,
            n=sampling_n(request),
            cache_salt=salt,
            constraint=compiled,
        )
        export_json = None
        if remote is not None:
            items = media.items if media else []
            try:
                (
                    engine_request.imported_kv,
                    engine_request.local_cached_tokens,
                ) = await handoff.import_kv(
                    self.kv_client,
                    self.engine,
                    remote,
                    ids,
                    items,
                    salt,
                    self.config.kv_pull_wait_s,
                )
            except Exception as exc:
                raise KvImportError(str(exc)) from exc
        elif handoff.wants_export(params):
            transfer_id = handoff.export_transfer_id(params, rid)
            engine_request.export_transfer_id = transfer_id
            host, port = self.advertised
            export_json = handoff.export_params(transfer_id, host, port, self.engine_id, len(ids))
        return _Plan(engine_request, identity, remote, export_json)

    async def _process_refs(
        self, request: pb.GenerateRequest, ids: list[int], params: dict[str, Any] | None, rid: str
    ) -> tuple[MediaInputs, list[int], None, MediaIdentity | None]:
        if has_mm_inputs(request):
            raise ValueError(
                "media_refs requires tokenized input and cannot be combined with "
                "preprocessed multimodal inputs"
            )
        if self.config.language_model_only:
            raise ValueError(f"{LMO_REASON}: it cannot process media_refs")
        if self.refs is None:
            raise ValueError(
                "media_refs sent but the media processor is off on this worker "
                "(--no-mm-processor); check the gateway's --mm-processing and this worker's "
                "mm_processor label"
            )
        processed = await self.refs.process(request.media_refs, ids)
        identity = None
        if params is not None:
            try:
                identity = build_media_identity(processed)
            except ValueError as exc:
                log.warning(
                    "Request %s: media identity not built (%s); the decode side will "
                    "reprocess the media",
                    rid,
                    exc,
                )
        return processed.media, processed.prompt_ids, None, identity

    async def _run(self, request: pb.GenerateRequest, plan: _Plan) -> AsyncIterator:
        top = plan.engine_request.sampling.logprobs or 0
        async for out in self.engine.generate(plan.engine_request):
            if request.stream and out.token_ids:
                yield pb.GenerateResponse(chunk=_chunk(out, top))
            if out.finished:
                complete = self._complete(out, plan)
                if not request.stream:
                    # Streamed, every entry went out with its chunk already.
                    wire = output_logprobs(out.output_logprobs, top)
                    if wire is not None:
                        complete.output_logprobs.CopyFrom(wire)
                yield pb.GenerateResponse(complete=complete)

    def _complete(self, out: EngineOutput, plan: _Plan) -> pb.GenerateComplete:
        complete = pb.GenerateComplete(
            output_ids=out.output_ids,
            finish_reason=out.finish_reason or "stop",
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            index=out.index,
        )
        if plan.export_json is not None and out.finish_reason != "abort":
            complete.kv_transfer_params_json = plan.export_json
        if plan.identity is not None:
            complete.media_identity.CopyFrom(plan.identity)
        return complete

    # -- other RPCs ---------------------------------------------------------------------

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        for rid in request.request_ids:
            self.engine.abort(rid)
        return pb.AbortResponse()

    async def HealthCheck(self, request, context) -> pb.HealthCheckResponse:
        alive = self.engine.alive
        return pb.HealthCheckResponse(healthy=alive, message="ok" if alive else "engine stopped")

    async def GetModelInfo(self, request, context) -> pb.GetModelInfoResponse:
        return info.model_info(self.config, self.model)

    async def GetServerInfo(self, request, context) -> pb.GetServerInfoResponse:
        return info.server_info(self.config, self.engine_id, self.started, self.engine.num_running)

    async def GetLoads(self, request, context) -> pb.GetLoadsResponse:
        return info.loads(self.engine.num_running, self.engine.num_waiting)

    async def GetTokenizer(self, request, context):
        for chunk in tokenizer_chunks(self._archive):
            yield chunk

    def stats(self) -> dict[str, Any]:
        """Counters for the side channel's Stats call and tests."""
        return {
            **self.engine.counters(),
            "media_items_processed": self.refs.items_processed if self.refs else 0,
        }


def _chunk(out: EngineOutput, top: int) -> pb.GenerateStreamChunk:
    return pb.GenerateStreamChunk(
        token_ids=out.token_ids,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        output_logprobs=output_logprobs(out.logprobs, top),
        index=out.index,
    )
