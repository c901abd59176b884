"""An MLX worker's ``GetModelInfo`` / ``GetServerInfo`` answers as string labels (the rules
are every protocol's: ``backends/labels.py``).

Zero numbers are skipped, so a ``max_context_length`` of 0 (MLX's servicer reports it for a
checkpoint whose config names no context) leaves no label: an unknown context, never a
zero-token one (the gateway's own limits come from the model's files). The server's
``active_requests`` and ``uptime_seconds`` are its state at the moment of the call, not
capabilities, and are left out; ``server_type`` says whose servicer it is ("mlx-grpc",
Tandem's "tandem-mlx-grpc"). The protocol carries no media, so every MLX worker is labelled
``supports_vision=false``.
"""

from __future__ import annotations

from tandem.gateway.backends.labels import flatten, model_name_from_path
from tandem.gateway.workers.worker import SUPPORTS_VISION_LABEL
from tandem.wire.mlx import mpb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

SERVER_RUNTIME_FIELDS = frozenset({"active_requests", "uptime_seconds"})
PROTOCOL_LABEL = "protocol"


def worker_labels(
    model_info: mpb.GetModelInfoResponse,
    server_info: mpb.GetServerInfoResponse,
    tandem_marker: str = "",
) -> dict[str, str]:
    """Model labels, then the server's (the two messages share no field names)."""
    labels = flatten(model_info)
    labels.update(flatten(server_info, skip=SERVER_RUNTIME_FIELDS))
    labels[SUPPORTS_VISION_LABEL] = "false"
    labels[PROTOCOL_LABEL] = "mlx"
    if tandem_marker:
        labels[TANDEM_WORKER_LABEL] = tandem_marker
    return labels


def model_id_of(info: mpb.GetModelInfoResponse) -> str:
    """The served name as sent (MLX's servicer sends the model's path: that is the id its
    clients use), else the last path component of ``model_path`` ("" if neither)."""
    if info.served_model_name:
        return str(info.served_model_name)
    return model_name_from_path(str(info.model_path))
