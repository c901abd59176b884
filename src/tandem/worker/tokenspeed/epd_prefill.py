"""E/P/D on the prefill leg: each image's features pulled from the encode worker that
computed them, so this worker runs no vision tower for it (a language-model-only worker
can serve such legs).

``encode_bootstrap_info.items[i]`` names, for item ``item_index``, the encode worker's
bootstrap address (its host and ``--disaggregation-bootstrap-port``, or gRPC port) and the
item's room; the features wait there under ``embedding_transfer_id(room)`` (the encode may
still be running: the pull waits up to ``--kv-pull-wait-secs``); a prompt whose image
tokens, ranges and grids disagree is refused before any pull. Each item's identity (its
``mm_hash``, which salts the prefix cache and the KV the decode leg pulls) is the encode
worker's digest of the pixels it encoded, never the gateway's hash. An item that carries
its own pixels and no entry is encoded here as usual.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from tandem.engine.types import ImageFeatures, MediaInputs, MediaItem
from tandem.hostport import check_host, join_host_port
from tandem.models.info import ModelInfo
from tandem.wire.tokenspeed import embedding_transfer_id, tpb
from tandem.worker.embedding_channel import EmbeddingClient, PulledEmbedding
from tandem.worker.refusals import RequestRefused
from tandem.worker.tokenspeed.media import LMO_REASON, WireItem, check_layout, stack_tensors

PULL_FAILED = "could not pull an image's embedding from its encode worker"


def embedding_sources(
    request: tpb.GenerateRequest, items: list[WireItem]
) -> dict[int, tuple[str, str]]:
    """Item index → (encode worker address, transfer id), checked."""
    sources: dict[int, tuple[str, str]] = {}
    for k, entry in enumerate(request.encode_bootstrap_info.items):
        where = f"encode_bootstrap_info.items[{k}]"
        index = int(entry.item_index)
        if index >= len(items):
            raise ValueError(
                f"{where}.item_index {index} is out of range: the request has {len(items)} item(s)"
            )
        if index in sources:
            raise ValueError(f"{where}: item {index} is named twice")
        if items[index].pixels is not None:
            raise ValueError(
                f"{where}: item {index} carries its own encoder_input; an item is either "
                "encoded here from its pixels or by an encode worker, not both"
            )
        if not entry.bootstrap_host:
            raise ValueError(f"{where}.bootstrap_host is empty")
        host = check_host(entry.bootstrap_host, f"{where}.bootstrap_host")
        if not 0 < entry.bootstrap_port < 65536:
            raise ValueError(f"{where}.bootstrap_port must be in 1..65535")
        if entry.bootstrap_room < 0:
            raise ValueError(f"{where}.bootstrap_room must be >= 0")
        address = join_host_port(host, entry.bootstrap_port)
        sources[index] = (address, embedding_transfer_id(entry.bootstrap_room))
    missing = [item.index for item in items if item.pixels is None and item.index not in sources]
    if missing:
        raise ValueError(
            f"mm_inputs.items[{missing[0]}] has neither encoder_input nor an "
            "encode_bootstrap_info entry: nothing says where its embedding comes from"
        )
    return sources


async def embedded_media(
    request: tpb.GenerateRequest,
    ids: list[int],
    items: list[WireItem],
    model: ModelInfo,
    client: EmbeddingClient,
    wait_s: float,
    *,
    supports_vision: bool,
) -> MediaInputs:
    """The leg's media with every named item's features pulled (concurrently)."""
    if not items:
        raise ValueError("encode_bootstrap_info needs mm_inputs items to go with")
    sources = embedding_sources(request, items)
    if len(sources) < len(items) and not supports_vision:
        raise ValueError(f"{LMO_REASON}: items without an encode worker need one")
    # Before the pulls: they would wait out their timeout for encodes that a prompt the
    # engine would refuse never gets (the encode worker refuses such an item too).
    check_layout(ids, items, model)
    pulled = await asyncio.gather(
        *(_pull(client, address, transfer, wait_s) for address, transfer in sources.values())
    )
    got: dict[int, PulledEmbedding] = dict(zip(sources, pulled, strict=True))
    features: dict[int, ImageFeatures] = {k: p.features for k, p in got.items()}
    rows = [item.pixels for item in items if item.pixels is not None]
    return MediaInputs(
        items=[
            MediaItem(
                got[item.index].digest if item.index in got else item.digest,
                item.offset,
                item.length,
            )
            for item in items
        ],
        im_token_id=model.image_token_id,
        pixel_values=np.concatenate(rows, axis=0) if rows else None,
        grids=stack_tensors(items),
        features=features,
    )


async def _pull(
    client: EmbeddingClient, address: str, transfer_id: str, wait_s: float
) -> PulledEmbedding:
    try:
        return await client.pull(address, transfer_id, wait_s)
    except grpc.aio.AioRpcError as err:
        status = err.code()
        if status == grpc.StatusCode.FAILED_PRECONDITION:  # the encode itself failed
            detail = f"{PULL_FAILED}: {err.details()}"
            raise RequestRefused(grpc.StatusCode.INTERNAL, detail) from None
        raise RequestRefused(
            grpc.StatusCode.UNAVAILABLE,
            f"{PULL_FAILED} at {address}: {status.name}: {err.details()}",
        ) from None
    except ValueError as exc:  # frames that do not decode
        detail = f"{PULL_FAILED} at {address}: {exc}"
        raise RequestRefused(grpc.StatusCode.INTERNAL, detail) from None
