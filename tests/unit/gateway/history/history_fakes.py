"""What the history store tests share: a fake clock, a stored turn, the backends' names.

The fixtures that build stores on each backend are in conftest.py beside this file.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tandem.gateway.history.store import NO_TENANT, ResponseStore, StoredResponse

T0 = 1_700_000_000.0
BACKENDS = ("memory", "sqlite", "postgres")
# Files, schemas, several processes: what only the SQL backends have (the memory one is
# one process's own and needs no start).
SQL_ONLY = pytest.mark.parametrize("backend", ["sqlite", "postgres"], indirect=True)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def turn(
    response_id: str,
    previous_id: str | None = None,
    tenant: str = NO_TENANT,
    created_at: float = T0,
    text: str = "hello",
    status: str = "completed",
) -> StoredResponse:
    return StoredResponse(
        id=response_id,
        tenant=tenant,
        previous_id=previous_id,
        created_at=created_at,
        status=status,
        model="tiny-qwen3-vl",
        response={"id": response_id, "object": "response", "output_text": text},
        input_items=[{"id": f"msg_{response_id}", "type": "message", "content": text}],
    )


MakeStore = Callable[..., Awaitable[ResponseStore]]
