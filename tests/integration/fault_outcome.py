"""What a client saw of one request under a fault, and what the workers kept afterwards.

Shared by the fault-matrix tests (issue 38, item 3). A request under a fault ends one of
two ways, and both are checked to the letter:

- answered: HTTP 200 and a whole answer (a stream's last choice has a finish reason, then
  ``[DONE]``);
- a coded error: a non-200 status with an OpenAI error body, or a 200 stream that ends with
  an error event and then ``[DONE]``. Either way the ``code`` is Tandem's and the message
  holds none of gRPC core's words.

Anything else (a cut connection, a stream without ``[DONE]``, an error without a code) fails
the test: it would be a lost request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from .gateway_probe import eventually, sse_payloads
from .processes import Proc
from .wire_helpers import stats

# Words of gRPC core that must never reach a client (issue 38).
GRPC_WORDS = (
    "deadline exceeded",
    "socket closed",
    "stream removed",
    "failed to connect",
    "connection reset",
    "rst_stream",
)


@dataclass(frozen=True)
class Outcome:
    status: int  # the HTTP status
    code: str | None  # the error's code; None when answered
    tokens: int  # content deltas streamed before the end

    @property
    def answered(self) -> bool:
        return self.code is None


def _error(body: dict[str, Any]) -> str:
    error = body["error"]
    assert error.get("code"), f"an error without a code: {error}"
    message = str(error.get("message", "")).lower()
    assert not any(words in message for words in GRPC_WORDS), f"gRPC's words: {error}"
    return str(error["code"])


async def streamed(
    url: str, body: dict[str, Any], on_token: Callable[[], None] | None = None
) -> Outcome:
    """POST a streamed request; ``on_token()`` runs once, at the first content delta."""
    lines: list[str] = []
    async with (
        httpx.AsyncClient(timeout=60) as http,
        http.stream("POST", url, json=body) as response,
    ):
        if response.status_code != 200:
            await response.aread()
            return Outcome(response.status_code, _error(response.json()), 0)
        async for line in response.aiter_lines():
            lines.append(line)
            if on_token is not None and '"content"' in line:
                on_token()
                on_token = None
    payloads = sse_payloads(lines)
    assert payloads and payloads[-1] == "[DONE]", f"no [DONE]: {payloads[-3:]}"
    events = [p for p in payloads[:-1] if isinstance(p, dict)]
    tokens = sum(1 for p in events if p.get("choices") and p["choices"][0]["delta"].get("content"))
    if events and "error" in events[-1]:
        return Outcome(200, _error(events[-1]), tokens)
    finishes = [c["finish_reason"] for p in events for c in p.get("choices", [])]
    assert finishes and finishes[-1] in ("stop", "length"), f"no finish: {events[-2:]}"
    return Outcome(200, None, tokens)


async def in_background(make: Awaitable[Outcome]) -> asyncio.Future[Outcome]:
    """Start the request now; the test stages its fault while it runs."""
    future = asyncio.ensure_future(make)
    await asyncio.sleep(0)
    return future


async def nothing_held(workers: list[Proc], within: float) -> None:
    """Every live worker holds no KV lease and runs no request, within ``within`` s."""

    async def clean() -> bool:
        for worker in workers:
            if worker.popen.poll() is not None:
                continue  # killed by the test: it holds nothing by construction
            counters = await stats(worker.address)
            if int(counters["held_kv_blocks"]) or int(counters["running"]):
                return False
        return True

    await eventually(clean, timeout=within)


def assert_no_traceback(gateway: Proc) -> None:
    assert gateway.count("Traceback") == 0, gateway.output()[-4000:]
