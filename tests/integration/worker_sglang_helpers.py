"""Build SGLang (and matching vLLM) wire requests and drive real workers over gRPC.

The images are preprocessed with ``tandem.models``' processor and expanded as the router
path does (the gateway's SGLang and vLLM backends use the same code), and written into
each protocol's ``mm_inputs`` by hand: the worker tests exercise the worker, not the
gateway's request builders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from tandem.models import expand_placeholders, load_model_info, load_processor
from tandem.wire import sglang, tensors
from tandem.wire.proto import Modality, pb
from tandem.wire.sglang import spb, spb_grpc

from .wire_helpers import chat_prompt_ids


@dataclass
class Prompt:
    """An expanded prompt and its preprocessed images (none for text)."""

    ids: list[int]
    pixels: np.ndarray | None = None
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    ranges: list[tuple[int, int]] = field(default_factory=list)
    image_token_id: int = 0


def prompt(model_dir: Path, text: str, images: Sequence[Image.Image] = ()) -> Prompt:
    ids = chat_prompt_ids(model_dir, text, len(images))
    if not images:
        return Prompt(ids)
    info = load_model_info(model_dir)
    pre = load_processor(model_dir).preprocess(list(images))
    ids, ranges = expand_placeholders(
        ids, info.anchor_token_id, pre.tokens_per_image, info.image_token_id
    )
    model_tensors = {k: np.asarray(v) for k, v in pre.grids.items()}
    if pre.patches_per_image is not None:
        model_tensors["patches_per_image"] = np.asarray(pre.patches_per_image, dtype=np.int64)
    return Prompt(ids, pre.pixel_values, model_tensors, ranges, info.image_token_id)


def sglang_request(
    rid: str, p: Prompt, max_new_tokens: int = 8, *, stream: bool = False, **sampling: object
) -> spb.GenerateRequest:
    """As a gateway writes it: every sampling number explicit, greedy unless told."""
    req = spb.GenerateRequest(request_id=rid, stream=stream, logprob_start_len=-1)
    req.tokenized.original_text = "(not read)"
    req.tokenized.input_ids.extend(p.ids)
    params = req.sampling_params
    params.temperature = 0.0
    params.top_p = 1.0
    params.top_k = -1
    params.repetition_penalty = 1.0
    params.max_new_tokens = max_new_tokens
    params.skip_special_tokens = True
    params.spaces_between_special_tokens = True
    for name, value in sampling.items():
        setattr(params, name, value)
    if p.pixels is not None:
        batch = req.mm_inputs
        batch.modalities.append("image")
        sglang.encode_into(batch.pixel_values, p.pixels, "float32")
        for key, array in p.tensors.items():
            sglang.encode_into(batch.model_specific_tensors[key], array)
        batch.im_token_id = p.image_token_id
        for offset, length in p.ranges:
            batch.mm_placeholders.add(offset=offset, length=length)
    return req


def with_room(req: spb.GenerateRequest, host: str, port: int, room: int) -> spb.GenerateRequest:
    leg = spb.GenerateRequest.FromString(req.SerializeToString())
    leg.disaggregated_params.bootstrap_host = host
    leg.disaggregated_params.bootstrap_port = port
    leg.disaggregated_params.bootstrap_room = room
    return leg


def decode_leg(req: spb.GenerateRequest) -> spb.GenerateRequest:
    """The decode leg: the same request without ``mm_inputs``."""
    leg = spb.GenerateRequest.FromString(req.SerializeToString())
    leg.ClearField("mm_inputs")
    return leg


def vllm_request(rid: str, p: Prompt, max_tokens: int = 8) -> pb.GenerateRequest:
    """The same prompt and images in vLLM's messages (no hashes: the worker derives them)."""
    req = pb.GenerateRequest(request_id=rid)
    req.tokenized.input_ids.extend(p.ids)
    req.sampling_params.max_tokens = max_tokens
    req.sampling_params.temperature = 0.0
    if p.pixels is not None:
        batch = req.mm_inputs
        batch.modality = Modality.IMAGE
        tensors.encode_into(batch.pixel_values, p.pixels, "float32")
        for key, array in p.tensors.items():
            tensors.encode_into(batch.model_specific_tensors[key], array)
        batch.im_token_id = p.image_token_id
        for offset, length in p.ranges:
            batch.mm_placeholders.add(offset=offset, length=length)
    return req


@dataclass
class SglangOutcome:
    chunks: list[spb.GenerateStreamChunk] = field(default_factory=list)
    completes: list[spb.GenerateComplete] = field(default_factory=list)
    request_ids: set[str] = field(default_factory=set)

    def streamed(self, index: int = 0) -> list[int]:
        return [t for c in self.chunks if c.index == index for t in c.token_ids]

    @property
    def tokens(self) -> list[int]:
        """Sample 0's ids: from the chunks when streamed, else from its complete."""
        if self.chunks:
            return self.streamed(0)
        return list(next(c for c in self.completes if c.index == 0).output_ids)


async def generate(address: str, req: spb.GenerateRequest, timeout: float = 60.0) -> SglangOutcome:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = spb_grpc.SglangSchedulerStub(channel)
        outcome = SglangOutcome()
        async for response in stub.Generate(req, timeout=timeout):
            outcome.request_ids.add(response.request_id)
            if response.HasField("chunk"):
                outcome.chunks.append(response.chunk)
            else:
                outcome.completes.append(response.complete)
        return outcome


async def call(address: str, method: str, message: object) -> object:
    async with grpc.aio.insecure_channel(address) as channel:
        return await getattr(spb_grpc.SglangSchedulerStub(channel), method)(message, timeout=10)


def text_of(model_dir: Path, ids: Sequence[int]) -> str:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tokenizer.decode(list(ids), skip_special_tokens=True).strip()
