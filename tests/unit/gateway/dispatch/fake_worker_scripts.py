"""Scripted worker behaviour for fake_worker_client.py: frames, and handlers built from them.

A handler is what one fake worker does with one Generate: it returns the frames to stream
(a list, or an async iterator that may wait on a test's events) or raises the worker's
``grpc.aio.AioRpcError``. :func:`well_behaved` is a worker that works: a tagged prefill leg
gets a Tandem worker's KV export, any other leg gets tokens.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc

from tandem.errors import WORKER_ERROR_CODE_KEY
from tandem.wire.kv_params import dumps_compact
from tandem.wire.proto import GenerateRequest, MediaIdentity, pb

Frames = Sequence[pb.GenerateResponse] | AsyncIterator[pb.GenerateResponse]
# What a scripted worker does with one Generate: frames, or a raised grpc.aio.AioRpcError.
Handler = Callable[[str, GenerateRequest], Frames | Awaitable[Frames]]


def rpc_error(
    code: grpc.StatusCode, details: str = "", worker_code: str | None = None
) -> grpc.aio.AioRpcError:
    """The error a worker's failed call raises; ``worker_code`` goes in trailing metadata."""
    trailing = (
        grpc.aio.Metadata((WORKER_ERROR_CODE_KEY, worker_code))
        if worker_code
        else grpc.aio.Metadata()
    )
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details or code.name)


def chunk(tokens: Sequence[int], index: int = 0) -> pb.GenerateResponse:
    return pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=list(tokens), index=index))


def complete(
    tokens: Sequence[int] = (),
    index: int = 0,
    *,
    kv_json: str | None = None,
    identity: MediaIdentity | None = None,
    prompt_tokens: int = 0,
) -> pb.GenerateResponse:
    done = pb.GenerateComplete(
        output_ids=list(tokens),
        finish_reason="length",
        completion_tokens=len(tokens),
        prompt_tokens=prompt_tokens,
        index=index,
    )
    if kv_json is not None:
        done.kv_transfer_params_json = kv_json
    if identity is not None:
        done.media_identity.CopyFrom(identity)
    return pb.GenerateResponse(complete=done)


def request_kv(request: GenerateRequest) -> dict[str, object]:
    """The leg's ``kv_transfer_params_json`` as a dict ({} when it has none)."""
    text = request.kv_transfer_params_json
    return json.loads(text) if text else {}


def is_prefill_leg(request: GenerateRequest) -> bool:
    return bool(request_kv(request).get("do_remote_decode"))


def tandem_export(url: str, request: GenerateRequest) -> str:
    """What a Tandem prefill worker answers: its transfer id (the minted one, if any)."""
    host, _, port = url.rpartition(":")
    transfer_id = request_kv(request).get("transfer_id") or f"{request.request_id}-held"
    return dumps_compact(
        {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": transfer_id,
            "remote_host": host,
            "remote_port": int(port),
            "num_tokens": len(request.tokenized.input_ids),
        }
    )


def decode_tokens(request: GenerateRequest) -> list[int]:
    """Tokens a scripted decode worker generates: distinct per request id."""
    seed = sum(request.request_id.encode()) % 100
    return [seed + 1, seed + 2]


def prefill_answer(url: str, request: GenerateRequest) -> list[pb.GenerateResponse]:
    n = len(request.tokenized.input_ids)
    return [complete(kv_json=tandem_export(url, request), prompt_tokens=n)]


def decode_answer(request: GenerateRequest) -> list[pb.GenerateResponse]:
    frames: list[pb.GenerateResponse] = []
    for i in range(max(1, request.sampling_params.n)):
        tokens = decode_tokens(request)
        frames.append(chunk(tokens, i))
        frames.append(complete(tokens, i))
    return frames


def well_behaved(url: str, request: GenerateRequest) -> Frames:
    """A worker that works: a tagged prefill leg gets its KV export, anything else tokens."""
    if is_prefill_leg(request):
        return prefill_answer(url, request)
    return decode_answer(request)


async def held(until: Awaitable[object], frames: Frames) -> AsyncIterator[pb.GenerateResponse]:
    """Frames that start only once ``until`` is done (a worker still busy, e.g. pulling KV)."""
    await until
    if isinstance(frames, Sequence):
        for frame in frames:
            yield frame
    else:
        async for frame in frames:
            yield frame


async def failing_after(
    until: Awaitable[object], error: grpc.aio.AioRpcError
) -> AsyncIterator[pb.GenerateResponse]:
    """No frame, and ``error`` once ``until`` is done."""
    await until
    raise error
    yield  # an async generator  # pragma: no cover
