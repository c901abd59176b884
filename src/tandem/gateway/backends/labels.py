"""A worker's info messages flattened into string labels, whatever the protocol.

Rules (docs/pd-contract.md §2): empty strings and zero numbers are skipped, booleans are
kept as ``"true"``/``"false"`` (so ``supports_vision="false"`` survives), repeated fields
are JSON-encoded (an empty list is skipped), and so are the values of a
``google.protobuf.Struct`` (SGLang's ``server_args``) read by :func:`struct_labels`.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.struct_pb2 import Struct


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


def struct_labels(struct: Struct, keys: frozenset[str] | None = None) -> dict[str, str]:
    """The scalar members of ``struct`` (those in ``keys``, or all) as labels, by the same
    rules as fields: whole numbers without a fraction, empty and zero values skipped."""
    labels: dict[str, str] = {}
    for key, value in struct.items():
        if keys is not None and key not in keys:
            continue
        if isinstance(value, bool | int | float | str):
            text = _scalar_label(value)
        elif value is None:
            text = None
        else:  # a list or a nested struct: kept as its JSON
            text = json.dumps(_plain(value), separators=(",", ":"), sort_keys=True) or None
        if text is not None:
            labels[key] = text
    return labels


def model_name_from_path(path: str) -> str:
    """A model's name from its path: the last component ("" for none)."""
    return posixpath.basename(path.rstrip("/"))


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, str | bool | int | float) or value is None:
        return value
    return [_plain(v) for v in value]


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
