"""The gateway's closed sets of names, each written once as a ``Literal``.

The config dataclass, the argparse ``choices`` (``typing.get_args``) and the request context
use these same types, so a new value is added in one place and a misspelt one is a type error.
The worker roles of the gateway's pool live with the worker (``gateway/workers/worker.py``).
"""

from __future__ import annotations

from typing import Literal, get_args

# --mm-processing: where a request's images are processed (docs/operations.md).
MmProcessingMode = Literal["auto", "router", "worker"]
# Where one request's images were processed: by the gateway, or by the workers (media_refs).
MmPath = Literal["router", "worker"]
# --multimodal-tensor-transport: how a leg's tensors reach a worker (gateway/backends/vllm/
# tensor_transport.py): in the message, or as same-host shared memory.
TensorTransportMode = Literal["inline", "shm", "auto"]
WorkerStreamClient = Literal["h2", "grpcio"]
# --pd-dispatch: prefill then decode, or both legs at once.
PdDispatch = Literal["sequential", "parallel"]
# --backend: the worker protocol the gateway speaks (docs/worker-protocols.md); "auto" asks
# the first configured worker, in smg's order (SGLang, vLLM, TensorRT-LLM, TokenSpeed, MLX).
WorkerProtocol = Literal["vllm", "sglang", "tokenspeed", "trtllm", "mlx"]
BackendChoice = Literal["auto", "vllm", "sglang", "tokenspeed", "trtllm", "mlx"]
# --encode-policy: which encode worker an image goes to under E/P/D (smg's names;
# consistent_hashing by content hash, so a repeated image finds its cached embedding).
EncodePolicy = Literal["consistent_hashing", "round_robin", "random"]
# The generation routes: /v1/chat/completions, /v1/completions, /v1/responses and
# /v1/messages (served by the chat pipeline: its requests are chat requests, its answers
# are reshaped).
Route = Literal["chat", "completions", "responses", "messages"]
# --event-loop: auto takes uvloop when it is installed.
EventLoop = Literal["auto", "uvloop", "asyncio"]
# --history-backend: where stored Responses API conversations live (gateway/history).
HistoryBackend = Literal["none", "memory", "sqlite", "postgres"]

MM_PROCESSING_MODES: tuple[MmProcessingMode, ...] = get_args(MmProcessingMode)
PD_DISPATCH_MODES: tuple[PdDispatch, ...] = get_args(PdDispatch)
TENSOR_TRANSPORT_MODES: tuple[TensorTransportMode, ...] = get_args(TensorTransportMode)
WORKER_STREAM_CLIENTS: tuple[WorkerStreamClient, ...] = get_args(WorkerStreamClient)
EVENT_LOOPS: tuple[EventLoop, ...] = get_args(EventLoop)
WORKER_PROTOCOLS: tuple[WorkerProtocol, ...] = get_args(WorkerProtocol)
BACKEND_CHOICES: tuple[BackendChoice, ...] = get_args(BackendChoice)
HISTORY_BACKENDS: tuple[HistoryBackend, ...] = get_args(HistoryBackend)
ENCODE_POLICIES: tuple[EncodePolicy, ...] = get_args(EncodePolicy)
