"""One request's state as it moves through the gateway's stages."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.events import Usage
from tandem.gateway.pipeline.generation_request import GenerationRequest, SamplingSummary
from tandem.gateway.pipeline.shaping_plan import ShapingPlan
from tandem.gateway.types import MmPath, Route
from tandem.gateway.workers.protocol import Leg
from tandem.wire.pixels import PixelPayload


@dataclass(slots=True)
class RequestContext:
    """The input (route, the endpoint's request converted, model) plus what the stages fill
    in, in order. ``request`` is replaced, never changed, by a stage that refines it (the
    answer-or-calls constraint, ``pipeline/answer_or_calls.py``)."""

    route: Route
    request_id: str
    request: GenerationRequest
    model: ModelHandle
    arrived: float = field(default_factory=time.perf_counter)
    # prompt stage
    prompt_text: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    # The ids as the workers see them where they differ (the router path expands each
    # media anchor into its run); None: ``prompt_ids``.
    worker_ids: list[int] | None = None
    # Every image and video part's URL in the order written, and each one's modality.
    media_urls: list[str] = field(default_factory=list)
    media_kinds: list[str] = field(default_factory=list)
    # media stage
    mm_path: MmPath | None = None  # None: no media
    # Worker path: the media_refs carry http(s) URLs for the worker to fetch, so only Tandem
    # workers (which fetch under Tandem's media guard) may be selected. When the gateway
    # fetched them instead (data: refs), ``media_urls`` then holds the forwarded schemes'
    # form: an inlined item as its bare "data:<type>;base64," header.
    refs_for_tandem_workers_only: bool = False
    media_runs: list[tuple[int, int, str]] = field(default_factory=list)  # (offset, len, hash)
    # how the answer's text becomes reasoning, content and tool calls; None: plain text
    shaping: ShapingPlan | None = None
    # request stage: the worker protocol's message (gateway/backends); the pixels stay
    # beside it until a leg is sent (tandem.wire.pixels)
    wire: Leg = None
    pixels: PixelPayload | None = None
    had_pixels: bool = False
    # what the access log reports: the legs that served it, the usage the answer carried
    served_by: list[str] = field(default_factory=list)
    usage: Usage | None = None

    @property
    def sampling(self) -> SamplingSummary:
        return self.request.sampling

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def is_chat(self) -> bool:
        """A conversation (chat, the Responses API): chat-shaped frames and answers."""
        return self.request.chat

    @property
    def n(self) -> int:
        return self.sampling.n

    @property
    def worker_streams(self) -> bool:
        """The workers stream their answer: the client streams, or the gateway applies stop
        strings itself and drops the stream (aborting the worker) once every choice stopped."""
        return self.stream or bool(self.sampling.stop)

    def routing_ids(self) -> list[int]:
        """Token ids as the workers will see them (expanded on the router path)."""
        return self.prompt_ids if self.worker_ids is None else self.worker_ids
