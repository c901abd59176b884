"""An SGLang worker's ``GetModelInfo`` / ``GetServerInfo`` answers as string labels.

The model info is flattened field by field, the server info only by the ``server_args``
members that describe the worker (smg reads the same ones), plus ``sglang_version`` as
``version`` and the Tandem marker (``tandem.wire.worker_marker``). A Tandem worker also
states its bootstrap port there (``pd/bootstrap_ports.py``).
"""

from __future__ import annotations

from tandem.gateway.backends.labels import flatten, model_name_from_path, struct_labels
from tandem.wire.sglang import spb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

SERVER_ARG_KEYS = frozenset(
    {
        "model_path",
        "served_model_name",
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
# What a worker's labels say about the protocol it speaks (workers_admin shows it).
PROTOCOL_LABEL = "protocol"


def worker_labels(
    model_info: spb.GetModelInfoResponse,
    server_info: spb.GetServerInfoResponse,
    tandem_marker: str = "",
) -> dict[str, str]:
    """Model labels, then the server's (``server_args`` may repeat a model field: the
    model info's value wins, it is the one the worker reports about itself)."""
    labels = struct_labels(server_info.server_args, SERVER_ARG_KEYS)
    labels.update(flatten(model_info))
    if server_info.sglang_version:
        labels["version"] = server_info.sglang_version
    labels[PROTOCOL_LABEL] = "sglang"
    if tandem_marker:
        labels[TANDEM_WORKER_LABEL] = tandem_marker
    return labels


def model_id_of(info: spb.GetModelInfoResponse) -> str:
    """The served name, else the last path component of ``model_path`` ("" if neither)."""
    if info.served_model_name:
        return str(info.served_model_name)
    return model_name_from_path(str(info.model_path))
