"""A vLLM worker's ``GetModelInfo`` / ``GetServerInfo`` answers as string labels (the rules
are every protocol's: ``backends/labels.py``)."""

from __future__ import annotations

from tandem.gateway.backends.labels import flatten, model_name_from_path
from tandem.wire.proto import pb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

# GetServerInfo fields 1-4 are the worker's runtime state at the moment of the call
# (uptime, pause flag, …), not capabilities; frozen into labels they would only mislead.
SERVER_RUNTIME_FIELDS = frozenset(
    {"active_requests", "is_paused", "last_receive_timestamp", "uptime_seconds"}
)


def model_labels(info: pb.GetModelInfoResponse) -> dict[str, str]:
    return flatten(info)


def server_labels(info: pb.GetServerInfoResponse) -> dict[str, str]:
    return flatten(info, skip=SERVER_RUNTIME_FIELDS)


def worker_labels(
    model_info: pb.GetModelInfoResponse,
    server_info: pb.GetServerInfoResponse,
    tandem_marker: str = "",
) -> dict[str, str]:
    """Model labels, then server labels (the two messages share no field names).

    ``tandem_marker`` is what a Tandem worker sent beside its server info
    (:mod:`tandem.wire.worker_marker`); it becomes the ``tandem_worker`` label.
    """
    labels = {**model_labels(model_info), **server_labels(server_info)}
    if tandem_marker:
        labels[TANDEM_WORKER_LABEL] = tandem_marker
    return labels


def model_id_of(info: pb.GetModelInfoResponse) -> str:
    """The served name, else the last path component of ``model_path`` ("" if neither)."""
    if info.served_model_name:
        return str(info.served_model_name)
    return model_name_from_path(str(info.model_path))
