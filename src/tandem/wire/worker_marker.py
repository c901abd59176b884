"""How a Tandem worker tells a gateway that it is one, and so enforces Tandem's media policy.

The vLLM protocol has no field for "which implementation am I" (a Tandem worker reports
``server_type="vllm-grpc"`` like vLLM's servicer, so that other gateways treat it alike).
A Tandem worker therefore adds one trailing-metadata entry to its ``GetServerInfo`` answer;
vLLM's servicer never sends it. The gateway keeps it as the worker label
``tandem_worker`` (value: the worker's Tandem version).

Why it matters (docs/operations.md, "Media URLs and vLLM workers"): a Tandem worker fetches
``media_refs`` URLs under the same guard as the gateway, so it may be handed URLs; any other
worker gets the gateway-fetched bytes as ``data:`` URLs instead.
"""

from __future__ import annotations

# gRPC metadata keys are lowercase ASCII; this one is sent only on GetServerInfo.
TANDEM_WORKER_METADATA_KEY = "tandem-worker"
# The worker label the gateway records it under (labels are otherwise proto field names).
TANDEM_WORKER_LABEL = "tandem_worker"
GET_SERVER_INFO_METHOD = "/vllm.grpc.engine.VllmEngine/GetServerInfo"
