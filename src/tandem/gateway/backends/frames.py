"""What a worker stream yields, in the gateway's own terms (no protocol's messages).

A protocol's client reads its wire frames into :class:`Frame` as they arrive, so the
answer's collection, the PD flows and the fan-out merge never look at a protocol's
message. Converting is cheap: token ids stay the protocol's own sequence (no copy), and
logprobs are read only when asked for (:attr:`Frame.logprobs` is a thunk).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tandem.gateway.logprobs import LogprobEntry

# A protocol's pixel-free description of the media a prefill leg processed, relayed as
# it came to that protocol's decode leg; only the protocol's folder reads it.
MediaIdentity = object


@dataclass(slots=True)
class Frame:
    """One frame of one choice: new tokens (a chunk), or the choice's end (``final``).

    A final frame carries the finish reason and the counts; its ``token_ids`` are every
    output token where the worker did not stream (and a repeat, or nothing, where it
    did: the collector reads chunks only then). ``kv_params`` and ``media_identity`` are
    what a prefill leg's final frame hands the decode leg.
    """

    index: int
    token_ids: Sequence[int]
    logprobs: Callable[[], list[LogprobEntry]] | None = None
    final: bool = False
    finish_reason: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    kv_params: str | None = None
    media_identity: MediaIdentity | None = None
