"""A TensorRT-LLM worker's ``GetModelInfo`` / ``GetServerInfo`` answers as string labels.

Both messages are flattened field by field (the rules are every protocol's:
``backends/labels.py``); the parallelism sizes take the short names other protocols'
labels use (``tp_size``, ``pp_size``, ``cp_size``), ``max_seq_len`` is also the
``context_length``, and ``supported_features`` stays as its JSON list.

``supports_vision``: the protocol has no such field. A Tandem worker lists ``"vision"`` in
``supported_features`` exactly when it runs a vision tower, so a Tandem worker without it
is a language model only (``"false"``). Any other TensorRT-LLM worker is taken as able to
process images: its engine does so itself, and a model whose processor takes no images is
refused by the gateway's own model before any worker is chosen
(``pipeline/media.checked_media_plan``).
"""

from __future__ import annotations

from tandem.gateway.backends.labels import flatten
from tandem.gateway.workers.worker import SUPPORTS_VISION_LABEL
from tandem.wire.trtllm import trpb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

# GetServerInfo's field names → the label names the other protocols' workers report.
SERVER_RENAMES = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "context_parallel_size": "cp_size",
}
VISION_FEATURE = "vision"
CONTEXT_LABEL = "context_length"
PROTOCOL_LABEL = "protocol"


def worker_labels(
    model_info: trpb.GetModelInfoResponse,
    server_info: trpb.GetServerInfoResponse,
    tandem_marker: str = "",
) -> dict[str, str]:
    """Server labels, then the model's (the two messages share no field names)."""
    labels = {SERVER_RENAMES.get(k, k): v for k, v in flatten(server_info).items()}
    labels.update(flatten(model_info))
    if model_info.max_seq_len > 0:
        labels[CONTEXT_LABEL] = str(model_info.max_seq_len)
    features = {f.strip().lower() for f in model_info.supported_features}
    vision = VISION_FEATURE in features or not tandem_marker
    labels[SUPPORTS_VISION_LABEL] = "true" if vision else "false"
    labels[PROTOCOL_LABEL] = "trtllm"
    if tandem_marker:
        labels[TANDEM_WORKER_LABEL] = tandem_marker
    return labels


def model_id_of(info: trpb.GetModelInfoResponse) -> str:
    """``model_id`` as the worker states it (the protocol has no served name)."""
    return str(info.model_id).strip()
