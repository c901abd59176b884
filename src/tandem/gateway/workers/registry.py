"""The set of workers behind the gateway: add and remove at runtime, look up, filter.

``add`` connects, asks the worker what it is (its protocol's client describes it: for
vLLM's, ``GetModelInfo`` + ``GetServerInfo``) and records the answer as labels.
Everything runs on one asyncio loop, so no locks; the only interleaving to guard against
is two concurrent ``add`` calls for the same URL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Literal

import grpc

from tandem.gateway.workers.breaker import CircuitBreaker
from tandem.gateway.workers.protocol import LegSender, WorkerClient
from tandem.gateway.workers.worker import ROLES, Worker, WorkerRole
from tandem.hostport import canonical_address

log = logging.getLogger("tandem.gateway.workers")

WorkerEvent = Literal["added", "removed"]
ChangeCallback = Callable[[WorkerEvent, Worker], None]


class WorkerUnreachableError(ConnectionError):
    """``add`` could not get the worker's model/server info in time."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot register worker {url}: {reason}")


class WorkerRegistry:
    def __init__(
        self,
        *,
        connect_timeout_s: float = 5.0,
        removal_grace_s: float = 30.0,
        sender: LegSender | None = None,
        client_factory: Callable[[str], WorkerClient] | None = None,
        breaker_factory: Callable[[], CircuitBreaker] = CircuitBreaker,
    ) -> None:
        """``sender``: the worker protocol's (``gateway/backends``); the gateway's state sets
        it when it is not given. ``client_factory`` replaces the sender's clients (tests)."""
        self.connect_timeout_s = connect_timeout_s
        self.removal_grace_s = removal_grace_s  # in-flight calls of a removed worker may finish
        self.sender = sender
        self._client_override = client_factory
        self.breaker_factory = breaker_factory  # the gateway's state sets its flags'
        self._workers: dict[str, Worker] = {}
        self._clients: dict[str, WorkerClient] = {}
        self._pending: set[str] = set()
        self._callbacks: list[ChangeCallback] = []
        self._closing: set[asyncio.Task[None]] = set()

    async def add(self, url: str, role: WorkerRole = "regular") -> Worker:
        """Connect to ``url``, discover its labels, and register it as healthy."""
        url = normalize_url(url)
        if role not in ROLES:
            raise ValueError(f"unknown worker role {role!r}; expected one of {', '.join(ROLES)}")
        if url in self._workers or url in self._pending:
            raise ValueError(f"worker {url} is already registered")
        self._pending.add(url)
        client = self._client_factory(url)
        try:
            worker = await self._discover(url, role, client)
        except BaseException:
            await client.close()
            raise
        finally:
            self._pending.discard(url)
        self._workers[url] = worker
        self._clients[url] = client
        log.info("worker %s added: role=%s model=%s", url, role, worker.model_id)
        self._notify("added", worker)
        return worker

    def remove(self, url: str) -> bool:
        """Forget ``url``; its channel closes in the background after a grace period."""
        url = _lookup_key(url)
        worker = self._workers.pop(url, None)
        if worker is None:
            return False
        client = self._clients.pop(url)
        task = asyncio.get_running_loop().create_task(client.close(self.removal_grace_s))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        log.info("worker %s removed", url)
        self._notify("removed", worker)
        return True

    def get(self, url: str) -> Worker | None:
        return self._workers.get(_lookup_key(url))

    def _client_factory(self, url: str) -> WorkerClient:
        if self._client_override is not None:
            return self._client_override(url)
        return self.leg_sender.client(url)

    @property
    def leg_sender(self) -> LegSender:
        if self.sender is None:
            raise RuntimeError("the registry has no worker protocol (sender) yet")
        return self.sender

    def client(self, url: str) -> WorkerClient:
        # Per leg of every request: a worker's own url is its key already, and parsing
        # it again cost about 25 us a lookup (docs/performance.md).
        found = self._clients.get(url)
        if found is not None:
            return found
        try:
            return self._clients[_lookup_key(url)]
        except KeyError:
            raise KeyError(f"no registered worker {url}") from None

    def detached_client(self, url: str) -> WorkerClient:
        """A client of ``url`` outside the registry (the caller closes it): for a call to a
        worker that was removed meanwhile, such as releasing the KV it still holds."""
        return self._client_factory(url)

    def workers(self, role: str | None = None, model_id: str | None = None) -> list[Worker]:
        """Registered workers in registration order, optionally filtered."""
        return [
            w
            for w in self._workers.values()
            if (role is None or w.role == role) and (model_id is None or w.model_id == model_id)
        ]

    def available(self, role: str | None = None, model_id: str | None = None) -> list[Worker]:
        """Like :meth:`workers`, keeping only healthy workers whose breaker lets traffic in."""
        return [w for w in self.workers(role, model_id) if w.available]

    def models(self) -> list[str]:
        return sorted({w.model_id for w in self._workers.values()})

    def on_change(self, callback: ChangeCallback) -> None:
        """Call ``callback(event, worker)`` after each add/remove (e.g. policy cleanup)."""
        self._callbacks.append(callback)

    async def close(self) -> None:
        clients = list(self._clients.values())
        self._workers.clear()
        self._clients.clear()
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._workers)

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and _lookup_key(url) in self._workers

    async def _discover(self, url: str, role: WorkerRole, client: WorkerClient) -> Worker:
        try:
            # The client waits for a worker still starting up, for the whole timeout.
            described = await client.describe(self.connect_timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED and self.sender is not None:
                reason = (
                    f"it does not serve the gateway's worker protocol ({self.sender.name}); "
                    "start the gateway with the --backend its workers speak"
                )
                raise WorkerUnreachableError(url, reason) from err
            raise WorkerUnreachableError(url, f"{err.code().name}: {err.details()}") from err
        return Worker(
            url=url,
            role=role,
            labels=described.labels,
            model_id=described.model_id,
            healthy=True,
            breaker=self.breaker_factory(),
        )

    def _notify(self, event: WorkerEvent, worker: Worker) -> None:
        for callback in list(self._callbacks):
            try:
                callback(event, worker)
            except Exception:  # one bad listener must not break registration
                log.exception("worker %s callback failed for %s", event, worker.url)


def normalize_url(url: str) -> str:
    """``grpc://host:port/`` and ``host:port`` name the same worker; IPv6 in brackets.

    Raises ValueError for text that is no ``host:port`` (e.g. an unbracketed ``::1:50051``).
    """
    return canonical_address(url, "grpc")


def _lookup_key(url: str) -> str:
    # A lookup of malformed text finds nothing; only ``add`` reports the malformation.
    try:
        return normalize_url(url)
    except ValueError:
        return url
