"""An abandoned decode leg is dropped (Abort) only once its first frame is in, or after
the deferral bound; the prefill's KV release runs at once.

The worker stream is a stand-in with the two methods the gateway uses (``__anext__``,
``aclose``): the point is the order of events, which a real worker cannot pin down.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tandem.gateway.backends.frames import Frame
from tandem.gateway.pd import deferred_abort
from tandem.gateway.pd.deferred_abort import first_decode_frame


class HeldStream:
    """A decode stream whose first frame arrives when the test says so."""

    def __init__(self) -> None:
        self.request_id = "r-1"
        self.first = asyncio.Event()
        self.closed_after_first: bool | None = None

    def __aiter__(self) -> HeldStream:
        return self

    async def __anext__(self) -> Frame:
        try:
            await self.first.wait()
        except asyncio.CancelledError:
            await self.aclose()  # as GenerateStream does: a cancelled read drops the call
            raise
        return Frame(0, [1])

    async def aclose(self) -> None:
        if self.closed_after_first is None:
            self.closed_after_first = self.first.is_set()


async def _abandon(stream: HeldStream, released: list[str]) -> None:
    async def release() -> None:
        released.append("prefill")

    waiter = asyncio.ensure_future(
        first_decode_frame(
            stream, SimpleNamespace(url="d:1"), "decode_worker_failed_to_start", release
        )  # type: ignore[arg-type]
    )
    await asyncio.sleep(0.01)
    waiter.cancel()  # the client hangs up while the decode leg pulls its KV
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_abort_waits_for_the_first_frame() -> None:
    stream, released = HeldStream(), []
    await _abandon(stream, released)
    assert released == ["prefill"]  # freed at once
    await asyncio.sleep(0.05)
    assert stream.closed_after_first is None  # not aborted mid-pull
    stream.first.set()
    for _ in range(100):
        if stream.closed_after_first is not None:
            break
        await asyncio.sleep(0.01)
    assert stream.closed_after_first is True


async def test_abort_comes_after_the_bound_without_a_first_frame(monkeypatch) -> None:
    monkeypatch.setattr(deferred_abort, "DEFER_ABORT_S", 0.05)
    stream, released = HeldStream(), []
    await _abandon(stream, released)
    for _ in range(100):
        if stream.closed_after_first is not None:
            break
        await asyncio.sleep(0.01)
    assert stream.closed_after_first is False  # dropped although no frame came
    assert not deferred_abort._pending  # nothing left behind


async def test_a_leg_that_answers_in_time_is_not_aborted() -> None:
    stream = HeldStream()
    stream.first.set()

    async def release() -> None:
        raise AssertionError("nothing to release: the leg was not abandoned")

    got, first = await first_decode_frame(stream, SimpleNamespace(url="d:1"), "x", release)  # type: ignore[arg-type]
    assert got is stream and list(first.token_ids) == [1]
    assert stream.closed_after_first is None
