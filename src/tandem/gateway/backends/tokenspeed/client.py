"""A typed client for one worker's ``tokenspeed.grpc.scheduler.TokenSpeedScheduler`` (and,
on an encode worker, ``tokenspeed.grpc.encoder.TokenSpeedEncoder``): the scheduler client
(``backends/scheduler/client.py``) with TokenSpeed's messages and labels, each item's pixels
spliced in as its ``encoder_input`` (``splice.py``), and ``Encode``. An encode worker
answers ``GetLoads`` with no ranks: no load, not zero load."""

from __future__ import annotations

from typing import Any

from tandem.gateway.backends.scheduler.client import SchedulerClient
from tandem.gateway.backends.tokenspeed.labels import model_id_of, worker_labels
from tandem.gateway.backends.tokenspeed.splice import serialize_with_pixels
from tandem.wire.pixels import PixelPayload
from tandem.wire.tokenspeed import ENCODER_SERVICE_NAME, GENERATE_METHOD, epb, tpb, tpb_grpc

ENCODE_METHOD = f"/{ENCODER_SERVICE_NAME}/Encode"


class TokenSpeedClient(SchedulerClient):
    messages = tpb
    generate_method = GENERATE_METHOD
    kv_events_method = "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/SubscribeKvEvents"

    def __init__(self, url: str, *, abort_timeout_s: float = 5.0) -> None:
        super().__init__(url, tpb_grpc.TokenSpeedSchedulerStub, abort_timeout_s)
        self._encode_raw = self._channel.unary_unary(
            ENCODE_METHOD,
            request_serializer=bytes,
            response_deserializer=epb.EncodeResponse.FromString,
        )

    def labels(self, model_info: Any, server_info: Any, marker: str) -> dict[str, str]:
        return worker_labels(model_info, server_info, marker)

    def model_id(self, model_info: Any) -> str:
        return model_id_of(model_info)

    def serialize(self, request: Any, pixels: PixelPayload) -> bytes:
        return serialize_with_pixels(request, pixels)

    async def encode(
        self, request: epb.EncodeRequest, pixels: PixelPayload | None, timeout: float
    ) -> epb.EncodeResponse:
        """``Encode`` on an encode worker: one item, its pixels spliced in."""
        response: epb.EncodeResponse = await self._encode_raw(
            serialize_with_pixels(request, pixels), timeout=timeout
        )
        return response
