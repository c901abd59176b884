"""The worker protocols a worker can serve, by ``--protocol`` (``WorkerConfig.protocol``).

Each protocol's folder (``worker/vllm``, ``worker/sglang``, ``worker/tokenspeed``,
``worker/trtllm``, ``worker/mlx``) has an
``adapter`` module with ``SERVER_INFO_METHOD`` (the full gRPC name of its
``GetServerInfo``, where the Tandem marker goes: ``worker/marker.py``) and
``serve(context, server)``, which puts the protocol's service on the server and returns
its servicer. Only this module names the folders, so the process never imports a
protocol's messages (docs/architecture.md, "Add a worker protocol"); a folder is imported
only when its protocol is served.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import grpc

from tandem.worker.config import PROTOCOLS, WorkerProtocol
from tandem.worker.context import ServedProtocol, WorkerContext


@dataclass(frozen=True, slots=True)
class Adapter:
    protocol: WorkerProtocol
    server_info_method: str
    serve: Callable[[WorkerContext, grpc.aio.Server], ServedProtocol]


def adapter_for(protocol: WorkerProtocol) -> Adapter:
    module: ModuleType
    if protocol == "vllm":
        from tandem.worker.vllm import adapter as module
    elif protocol == "sglang":
        from tandem.worker.sglang import adapter as module
    elif protocol == "tokenspeed":
        from tandem.worker.tokenspeed import adapter as module
    elif protocol == "trtllm":
        from tandem.worker.trtllm import adapter as module
    elif protocol == "mlx":
        from tandem.worker.mlx import adapter as module
    else:
        raise ValueError(f"unknown worker protocol {protocol!r}; one of {', '.join(PROTOCOLS)}")
    return Adapter(protocol, module.SERVER_INFO_METHOD, module.serve)
