"""Build TokenSpeed wire requests and drive real workers over gRPC.

The prompt and its preprocessed images are ``worker_sglang_helpers.prompt``'s (the
processor of ``tandem.models``, anchors expanded as the router path does), so the SGLang
and TokenSpeed requests of a test carry the same pixels. TokenSpeed's are written one
``MultimodalItem`` per image, by hand: each with its own pixel rows, its own model tensor
rows, its placeholder range and the image token; the worker tests exercise the worker,
not the gateway's request builders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import grpc
import numpy as np

from tandem.wire.tokenspeed import IMAGE, encode_into, tpb, tpb_grpc

from .worker_sglang_helpers import Prompt


def item_rows(p: Prompt) -> list[slice]:
    """Each image's rows of the batch: by its grid (flat layouts), else one row each."""
    if "image_grid_thw" in p.tensors:
        counts = [int(n) for n in np.asarray(p.tensors["image_grid_thw"]).prod(axis=1)]
    else:
        counts = [1] * len(p.ranges)
    starts = np.cumsum([0, *counts])
    return [slice(int(a), int(b)) for a, b in pairwise(starts)]


def tokenspeed_request(
    rid: str,
    p: Prompt,
    max_new_tokens: int = 8,
    *,
    stream: bool = False,
    pixels: bool = True,
    **sampling: object,
) -> tpb.GenerateRequest:
    """As smg writes it: every sampling scalar present, greedy unless told; one item per
    image (``pixels=False``: the items' metadata only, as a decode leg carries them)."""
    req = tpb.GenerateRequest(request_id=rid, stream=stream, logprob_start_len=-1)
    req.tokenized.input_ids.extend(p.ids)
    req.tokenized.original_text = "(not read)"
    params = req.sampling_params
    params.temperature, params.top_p, params.top_k, params.min_p = 0.0, 1.0, -1, 0.0
    params.frequency_penalty, params.presence_penalty = 0.0, 0.0
    params.repetition_penalty = 1.0
    params.max_new_tokens = max_new_tokens
    params.skip_special_tokens = params.spaces_between_special_tokens = True
    for name, value in sampling.items():
        setattr(params, name, value)
    if p.pixels is None:
        return req
    for k, (rows, (offset, length)) in enumerate(zip(item_rows(p), p.ranges, strict=True)):
        item = req.mm_inputs.items.add(modality=IMAGE, content_hash=bytes([k]) * 32)
        if pixels:
            encode_into(item.encoder_input, np.ascontiguousarray(p.pixels[rows]), "float32")
        for key, array in p.tensors.items():
            encode_into(item.model_specific_tensors[key], np.ascontiguousarray(array[k : k + 1]))
        item.placeholders.add(offset=offset, length=length)
        item.placeholder_token_id = p.image_token_id
    return req


def with_room(req: tpb.GenerateRequest, host: str, port: int, room: int) -> tpb.GenerateRequest:
    leg = tpb.GenerateRequest.FromString(req.SerializeToString())
    leg.kv_bootstrap_info.bootstrap_host = host
    leg.kv_bootstrap_info.bootstrap_port = port
    leg.kv_bootstrap_info.bootstrap_room = room
    return leg


def decode_leg(req: tpb.GenerateRequest) -> tpb.GenerateRequest:
    """The decode leg as gateways clone it: every item without its ``encoder_input``."""
    leg = tpb.GenerateRequest.FromString(req.SerializeToString())
    for item in leg.mm_inputs.items:
        item.ClearField("encoder_input")
    leg.ClearField("encode_bootstrap_info")
    return leg


@dataclass
class TokenSpeedOutcome:
    chunks: list[tpb.GenerateStreamChunk] = field(default_factory=list)
    completes: list[tpb.GenerateComplete] = field(default_factory=list)
    request_ids: set[str] = field(default_factory=set)

    def streamed(self, index: int = 0) -> list[int]:
        return [t for c in self.chunks if c.index == index for t in c.token_ids]

    @property
    def tokens(self) -> list[int]:
        """Sample 0's ids: from the chunks when streamed, else from its complete."""
        if self.chunks:
            return self.streamed(0)
        return list(next(c for c in self.completes if c.index == 0).output_ids)


async def generate(
    address: str, req: tpb.GenerateRequest, timeout: float = 60.0
) -> TokenSpeedOutcome:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tpb_grpc.TokenSpeedSchedulerStub(channel)
        outcome = TokenSpeedOutcome()
        async for response in stub.Generate(req, timeout=timeout):
            outcome.request_ids.add(response.request_id)
            if response.HasField("chunk"):
                outcome.chunks.append(response.chunk)
            else:
                outcome.completes.append(response.complete)
        return outcome


async def call(address: str, method: str, message: object) -> object:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = tpb_grpc.TokenSpeedSchedulerStub(channel)
        return await getattr(stub, method)(message, timeout=10)
