"""Fan-out of a text request with n > 1 into n single-sample PD pairs (docs/pd-contract.md §13).

Only parallel dispatch fans out: each pair gets its own transfer id, so n
decode legs can pull n copies of the prompt KV. Sequential dispatch relays a
single-consumer handoff and never fans out. Multimodal requests never fan out
either: their media would have to be sent (and processed) n times.
"""

from __future__ import annotations

from tandem.wire.proto import pb
from tandem.wire.requests import has_media_refs, has_mm_inputs, sampling_n

_INT32_SPAN = 1 << 32
_INT32_MIN = -(1 << 31)


def fanout_width(request: pb.GenerateRequest, parallel: bool) -> int | None:
    """The number of pairs to dispatch, or None to keep a single dispatch."""
    if not parallel or has_mm_inputs(request) or has_media_refs(request):
        return None
    n = sampling_n(request)
    return n if n > 1 else None


def fanout_requests(request: pb.GenerateRequest, width: int) -> list[pb.GenerateRequest]:
    """``width`` copies of ``request``, each one sample with its own id and seed.

    Sub-request ``i`` is ``"{id}-{i}"`` with n=1 and, when a seed is pinned, seed + i
    (wrapping within int32, the wire type) so the samples differ yet stay reproducible;
    an unset seed stays unset. ``request`` itself is not modified.
    """
    if width < 1:
        raise ValueError(f"fan-out width must be at least 1, got {width}")
    if has_mm_inputs(request) or has_media_refs(request):
        # A copy per pair would duplicate the media payload; fanout_width never allows it.
        raise ValueError("a multimodal request is never fanned out")
    subs: list[pb.GenerateRequest] = []
    for i in range(width):
        sub = pb.GenerateRequest()
        sub.CopyFrom(request)
        sub.request_id = f"{request.request_id}-{i}"
        sub.sampling_params.n = 1
        if request.sampling_params.HasField("seed"):
            sub.sampling_params.seed = _wrap_int32(request.sampling_params.seed + i)
        subs.append(sub)
    return subs


def _wrap_int32(value: int) -> int:
    return (value - _INT32_MIN) % _INT32_SPAN + _INT32_MIN
