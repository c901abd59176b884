"""One MLX leg: the request message, and what the protocol cannot say in it.

MLX's ``GenerateRequest`` holds one sample and its ``logprobs`` count only means something
from 1 up (the servicer returns nothing for 0). So the leg keeps beside the message how many
samples the client asked for (each becomes a request of its own, ``samples``) and how many
alternatives per token it wants shown (the frames are trimmed to that many: a client asking
for logprobs without alternatives is sent 1 and shown 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.wire.mlx import mpb

INT32_SPAN = 1 << 32
INT32_MIN = -(1 << 31)


def wrap_int32(value: int) -> int:
    """``value`` wrapped into the int32 range (the wire's seed)."""
    return (value - INT32_MIN) % INT32_SPAN + INT32_MIN


@dataclass(slots=True)
class MlxLeg:
    """A request for ``n`` samples; ``alternatives``: top logprobs to show per token (None:
    no logprobs asked for)."""

    request: mpb.GenerateRequest
    n: int = 1
    alternatives: int | None = None

    @property
    def request_id(self) -> str:
        return str(self.request.request_id)

    def samples(self) -> list[mpb.GenerateRequest]:
        """One request per sample: the message itself for n = 1, else ``{id}-{i}`` with the
        seed ``s + i`` (wrapping in int32) where a seed was given, so that the samples differ
        yet repeat, as an engine's own n > 1 draws them."""
        if self.n <= 1:
            return [self.request]
        subs = []
        for index in range(self.n):
            sub = mpb.GenerateRequest()
            sub.CopyFrom(self.request)
            sub.request_id = f"{self.request.request_id}-{index}"
            if self.request.sampling_params.HasField("seed"):
                sub.sampling_params.seed = wrap_int32(self.request.sampling_params.seed + index)
            subs.append(sub)
        return subs

    def single(self, request: mpb.GenerateRequest) -> MlxLeg:
        """A leg of one of :meth:`samples`."""
        return MlxLeg(request, 1, self.alternatives)
