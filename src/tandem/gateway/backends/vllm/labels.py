"""Flatten a worker's ``GetModelInfo`` / ``GetServerInfo`` answers into string labels.

Rules (docs/pd-contract.md §2): empty strings and zero numbers are skipped, booleans are
kept as ``"true"``/``"false"`` (so ``supports_vision="false"`` survives), and
repeated fields are JSON-encoded (an empty list is skipped).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from tandem.wire.proto import pb
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

# GetServerInfo fields 1-4 are the worker's runtime state at the moment of the call
# (uptime, pause flag, …), not capabilities; frozen into labels they would only mislead.
SERVER_RUNTIME_FIELDS = frozenset(
    {"active_requests", "is_paused", "last_receive_timestamp", "uptime_seconds"}
)


def flatten(message: Message, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """Every scalar or repeated-scalar field of ``message`` as a label, by field name."""
    labels: dict[str, str] = {}
    for fd in message.DESCRIPTOR.fields:
        if fd.name in skip or fd.type == FieldDescriptor.TYPE_MESSAGE:
            continue  # nested messages are not capabilities on these two messages
        value = getattr(message, fd.name)
        if _is_repeated(fd):
            items = [_json_scalar(v) for v in value]
            if items:
                labels[fd.name] = json.dumps(items, separators=(",", ":"))
            continue
        if fd.has_presence and not message.HasField(fd.name):
            continue
        text = _scalar_label(value)
        if text is not None:
            labels[fd.name] = text
    return labels


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
    return posixpath.basename(str(info.model_path).rstrip("/"))


def _is_repeated(fd: FieldDescriptor) -> bool:
    # ``is_repeated`` is the newer protobuf spelling; ``label`` is deprecated there.
    flag = getattr(fd, "is_repeated", None)
    if flag is not None:
        return bool(flag)
    return bool(fd.label == FieldDescriptor.LABEL_REPEATED)


def _scalar_label(value: Any) -> str | None:
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int | float):
        return None if value == 0 else _number(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace") or None
    return str(value) or None


def _number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _json_scalar(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
