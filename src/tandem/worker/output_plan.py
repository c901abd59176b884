"""Planning a request's output controls: its structured-output constraint and logprobs.

Done first when a request is planned, before any media work or KV import, so a bad
schema, regex or grammar is refused at once (INVALID_ARGUMENT, ``invalid_structured_output``)
and a decode leg's KV lease is released like any other refusal.
"""

from __future__ import annotations

import asyncio

from tandem.engine.protocol import Engine
from tandem.engine.request import RefusedField
from tandem.engine.structured import CompiledConstraint
from tandem.engine.structured_spec import StructuredOutputError
from tandem.wire.proto import pb
from tandem.worker.inputs import wire_constraint

# A constraint that takes longer than this to compile is refused: xgrammar compiles the
# schemas and regexes people send in milliseconds, a pathological one could take minutes.
COMPILE_TIMEOUT_S = 10.0


async def plan_outputs(
    engine: Engine, params: pb.SamplingParams, engine_name: str
) -> CompiledConstraint | None:
    """The request's constraint compiled for ``engine`` (off the event loop), or None.

    Refuses logprobs an engine cannot compute (the null engine) rather than ignoring them.
    """
    if params.HasField("logprobs") and not engine.returns_logprobs:
        raise RefusedField(f"logprobs: the {engine_name} engine of this worker has none")
    constraint = wire_constraint(params)
    if constraint is None:
        return None
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(engine.compile_constraint, constraint, list(params.stop_token_ids)),
            COMPILE_TIMEOUT_S,
        )
    except TimeoutError:
        # The compiling thread runs on; the request does not wait for it.
        raise StructuredOutputError(
            f"{constraint.kind} took more than {COMPILE_TIMEOUT_S:g} s to compile; simplify it"
        ) from None
