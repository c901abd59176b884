"""The routing-policy interface: pick one worker out of the available ones.

Policies see only workers that are already filtered (healthy, breaker closed,
right role and model); they decide among equals. Stateful policies are told when
a request finishes and when a worker leaves, so they can drop what they keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tandem.gateway.workers.worker import Worker


@dataclass(frozen=True, slots=True)
class SelectionInput:
    """What a policy may look at. ``media_runs`` are ``(offset, length, mm_hash)``
    per image: the image's placeholder run inside ``token_ids``."""

    token_ids: Sequence[int] = ()
    media_runs: Sequence[tuple[int, int, str]] = ()
    request_id: str = ""


@runtime_checkable
class Policy(Protocol):
    name: str

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None: ...

    def on_request_complete(self, worker: Worker, request: SelectionInput) -> None: ...

    def remove_worker(self, url: str) -> None: ...


class BasePolicy:
    """No-op hooks for policies that keep no per-worker state."""

    name = "base"

    def select(self, workers: Sequence[Worker], request: SelectionInput) -> Worker | None:
        raise NotImplementedError

    def on_request_complete(self, worker: Worker, request: SelectionInput) -> None:
        return None

    def remove_worker(self, url: str) -> None:
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
