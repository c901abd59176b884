"""A TokenSpeed worker's ``GetModelInfo`` / ``GetServerInfo`` answers as string labels.

The model info is flattened field by field; the server info by the ``server_args`` members
that describe the worker (the ones smg reads, plus the disaggregation mode and bootstrap
port a Tandem worker states), ``tokenspeed_version`` as ``version``,
``constrained_decoding``, ``shm_namespace_id`` from ``scheduler_info``, and the Tandem
marker (``tandem.wire.worker_marker``).
"""

from __future__ import annotations

from tandem.gateway.backends.labels import flatten, model_name_from_path, struct_labels
from tandem.wire.tokenspeed import tpb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

SERVER_ARG_KEYS = frozenset(
    {
        "model",
        "model_path",
        "served_model_name",
        "tokenizer",
        "tokenizer_path",
        "tp_size",
        "dp_size",
        "pp_size",
        "context_length",
        "max_total_tokens",
        "max_running_requests",
        "load_balance_method",
        "disaggregation_mode",
        "disaggregation_bootstrap_port",
        "is_embedding",
        "vocab_size",
        "weight_version",
    }
)
DISAGGREGATION_MODE_LABEL = "disaggregation_mode"
PROTOCOL_LABEL = "protocol"


def worker_labels(
    model_info: tpb.GetModelInfoResponse,
    server_info: tpb.GetServerInfoResponse,
    tandem_marker: str = "",
) -> dict[str, str]:
    """Model labels, then the server's (the model info's value wins where both say)."""
    labels = struct_labels(server_info.server_args, SERVER_ARG_KEYS)
    labels.update(struct_labels(server_info.scheduler_info, frozenset({"shm_namespace_id"})))
    labels.update(flatten(model_info))
    if server_info.tokenspeed_version:
        labels["version"] = server_info.tokenspeed_version
    labels["constrained_decoding"] = server_info.constrained_decoding or "requested"
    labels[PROTOCOL_LABEL] = "tokenspeed"
    if tandem_marker:
        labels[TANDEM_WORKER_LABEL] = tandem_marker
    return labels


def model_id_of(info: tpb.GetModelInfoResponse) -> str:
    """The served name, else the last path component of ``model_path`` ("" if neither)."""
    if info.served_model_name:
        return str(info.served_model_name)
    return model_name_from_path(str(info.model_path))
