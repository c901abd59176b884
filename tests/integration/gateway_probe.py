"""Small helpers for integration tests that watch a live gateway: metrics, SSE, signals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Callable, Iterator
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .processes import Proc


async def metric(gateway: Proc, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when absent)."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{gateway.address}/metrics")).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                total += sample.value
    return total


async def eventually(check: Callable[[], Any], timeout: float = 20.0, every: float = 0.05) -> Any:
    """Await ``check()`` (sync or async) until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        await asyncio.sleep(every)


async def stays(check: Callable[[], Any], seconds: float, every: float = 0.05) -> None:
    """Await ``check()`` (sync or async) for ``seconds``; fail the moment it is falsy.

    For conditions that must keep holding (a process still running): there is no event to
    wait for, so the wait is bounded, but a breach fails at once instead of after a sleep.
    """
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if not value:
            raise AssertionError("condition stopped holding")
        if asyncio.get_running_loop().time() >= deadline:
            return
        await asyncio.sleep(every)


@contextlib.contextmanager
def paused(proc: Proc) -> Iterator[None]:
    """SIGSTOP ``proc`` (its calls hang, as a hung worker's would), SIGCONT on the way out."""
    proc.popen.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGCONT)


def sse_payloads(lines: list[str]) -> list[Any]:
    """The ``data:`` payloads of an SSE stream: parsed JSON, or the literal ``[DONE]``."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def chat(model: str, text: str = "hello", stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
        **extra,
    }


async def hang_up_at_first_data(url: str, body: dict[str, Any]) -> None:
    """POST a streamed request and leave as soon as the first SSE ``data:`` line arrives
    (the decode leg's first frame is in: the legs are running)."""
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", url, json=body) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                return
