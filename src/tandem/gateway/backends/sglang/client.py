"""A typed client for one worker's ``sglang.grpc.scheduler.SglangScheduler`` service: the
scheduler client (``backends/scheduler/client.py``) with SGLang's messages, its labels,
the load sections smg asks for, and the pixels spliced into the request bytes as
``mm_inputs.pixel_values`` (``splice.py``)."""

from __future__ import annotations

from typing import Any

from tandem.gateway.backends.scheduler.client import SchedulerClient
from tandem.gateway.backends.sglang.labels import model_id_of, worker_labels
from tandem.gateway.backends.sglang.splice import serialize_with_pixels
from tandem.wire.pixels import PixelPayload
from tandem.wire.sglang import GENERATE_METHOD, spb, spb_grpc

# What smg asks GetLoads for; a worker answers the sections it has.
LOAD_SECTIONS = ("core", "disagg", "queues", "memory")


class SglangClient(SchedulerClient):
    messages = spb
    generate_method = GENERATE_METHOD
    kv_events_method = "/sglang.grpc.scheduler.SglangScheduler/SubscribeKvEvents"

    def __init__(self, url: str, *, abort_timeout_s: float = 5.0) -> None:
        super().__init__(url, spb_grpc.SglangSchedulerStub, abort_timeout_s)

    def labels(self, model_info: Any, server_info: Any, marker: str) -> dict[str, str]:
        return worker_labels(model_info, server_info, marker)

    def model_id(self, model_info: Any) -> str:
        return model_id_of(model_info)

    def loads_request(self) -> spb.GetLoadsRequest:
        return spb.GetLoadsRequest(include=list(LOAD_SECTIONS))

    def serialize(self, request: Any, pixels: PixelPayload) -> bytes:
        return serialize_with_pixels(request, pixels)
