"""Build wire requests and drive real workers over gRPC, for the worker-level tests."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from PIL import Image
from tokenizers import Tokenizer

from tandem.models.chat import render_chat
from tandem.wire.proto import GenerateComplete, GenerateRequest, Modality, pb, pb_grpc

PREFILL_TAG = json.dumps({"do_remote_decode": True, "do_remote_prefill": False})


def image_data_url(seed: int, size: tuple[int, int] = (64, 48)) -> str:
    """A PNG data URL of a seeded random picture: different seeds, different images."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def chat_prompt_ids(model_dir: Path, text: str, n_images: int) -> list[int]:
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": "x"}}] * n_images
    parts = [*parts, {"type": "text", "text": text}]
    rendered = render_chat(model_dir, [{"role": "user", "content": parts}])
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tokenizer.encode(rendered, add_special_tokens=False).ids


def request(
    rid: str, ids: list[int], urls: list[str] = (), max_tokens: int = 8, **sampling
) -> GenerateRequest:
    req = GenerateRequest(request_id=rid)
    req.tokenized.input_ids.extend(ids)
    req.sampling_params.max_tokens = max_tokens
    req.sampling_params.temperature = sampling.pop("temperature", 0.0)
    for name, value in sampling.items():
        setattr(req.sampling_params, name, value)
    for url in urls:
        req.media_refs.items.add(modality=Modality.IMAGE, url=url)
    return req


@dataclass
class Outcome:
    completes: list[GenerateComplete] = field(default_factory=list)
    streamed: dict[int, list[int]] = field(default_factory=dict)

    @property
    def tokens(self) -> list[int]:
        return list(self.completes[0].output_ids)

    @property
    def complete(self) -> GenerateComplete:
        return self.completes[0]


async def generate(address: str, req: GenerateRequest, timeout: float = 60.0) -> Outcome:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        outcome = Outcome()
        async for response in stub.Generate(req, timeout=timeout):
            if response.HasField("chunk"):
                chunk = response.chunk
                outcome.streamed.setdefault(chunk.index, []).extend(chunk.token_ids)
            else:
                outcome.completes.append(response.complete)
        outcome.completes.sort(key=lambda c: c.index)
        return outcome


async def call(address: str, method: str, message):
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        return await getattr(stub, method)(message, timeout=10)


async def stats(address: str) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        rpc = channel.unary_unary(
            "/tandem.kv.KvTransfer/Stats",
            request_serializer=lambda v: json.dumps(v).encode(),
            response_deserializer=lambda b: json.loads(b),
        )
        return await rpc({}, timeout=10)


async def healthy(address: str) -> bool:
    reply = await call(address, "HealthCheck", pb.HealthCheckRequest())
    return reply.healthy
