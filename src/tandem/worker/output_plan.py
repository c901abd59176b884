"""Planning a request's output controls: its structured-output constraint and logprobs.

Done first when a request is planned, before any media work or KV import, so a bad
schema, regex or grammar is refused at once (INVALID_ARGUMENT, ``invalid_structured_output``)
and a decode leg's KV lease is released like any other refusal.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tandem.engine.protocol import Engine
from tandem.engine.refusals import RefusedField
from tandem.engine.structured import CompiledConstraint
from tandem.engine.structured_spec import Constraint, StructuredOutputError

# A constraint that takes longer than this to compile is refused: xgrammar compiles the
# schemas and regexes people send in milliseconds, a pathological one could take minutes.
COMPILE_TIMEOUT_S = 10.0
# Compiles run in a pool of their own, so that one running past its timeout (its thread
# cannot be stopped) never holds a thread that media, DNS or KV work needs.
COMPILE_THREADS = 2


class CompilerSaturated(Exception):
    """Every compile thread is still busy with a constraint that overran its timeout."""

    retryable = True  # UNAVAILABLE: the gateway may try another worker
    code = ""


class CompilePool:
    """A bounded pool for constraint compiles that knows how many have overrun.

    A compile past ``timeout`` is refused to its request but keeps its thread until it
    ends; once every thread is held so, new constraints are refused at once
    (:class:`CompilerSaturated`) instead of queueing behind them without end.
    """

    def __init__(self, threads: int = COMPILE_THREADS) -> None:
        self.threads = threads
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="grammar-compile")
        self._lock = threading.Lock()
        self.overrun = 0  # compiles that timed out and are still running

    async def run(self, fn: Callable[..., Any], *args: Any, timeout: float) -> Any:
        with self._lock:
            if self.overrun >= self.threads:
                raise CompilerSaturated(
                    f"worker is saturated: all {self.threads} grammar compile threads are "
                    f"busy with constraints that took over {timeout:g} s"
                )
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        try:
            # Shielded: a timeout must not mark the compile done while its thread runs.
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            with self._lock:
                self.overrun += 1
            future.add_done_callback(self._ended)
            raise

    def _ended(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved, so asyncio does not log it as never read
        with self._lock:
            self.overrun -= 1


_POOL: CompilePool | None = None


def compile_pool() -> CompilePool:
    global _POOL
    if _POOL is None:
        _POOL = CompilePool()
    return _POOL


async def plan_outputs(
    engine: Engine,
    constraint: Constraint | None,
    stop_token_ids: list[int],
    wants_logprobs: bool,
    engine_name: str,
) -> CompiledConstraint | None:
    """The request's constraint compiled for ``engine`` (off the event loop), or None.

    Refuses logprobs an engine cannot compute (the null engine) rather than ignoring them.
    Each protocol's adapter reads ``constraint`` and the rest from its own request.
    """
    if wants_logprobs and not engine.returns_logprobs:
        raise RefusedField(f"logprobs: the {engine_name} engine of this worker has none")
    if constraint is None:
        return None
    try:
        compiled: CompiledConstraint = await compile_pool().run(
            engine.compile_constraint,
            constraint,
            stop_token_ids,
            timeout=COMPILE_TIMEOUT_S,
        )
        return compiled
    except TimeoutError:
        # The compiling thread runs on (counted by the pool); the request does not wait.
        raise StructuredOutputError(
            f"{constraint.kind} took more than {COMPILE_TIMEOUT_S:g} s to compile; simplify it"
        ) from None
