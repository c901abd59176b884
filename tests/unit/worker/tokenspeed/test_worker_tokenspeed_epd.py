"""E/P/D failures that must reach the prefill leg at once, not after its embedding wait.

Found with smg 1.13 in front (tests/compat/test_smg_tokenspeed.py): smg gives a LLaVA
image fewer tokens than the model needs. The encode worker refused that ``Encode``, but
the prefill leg waited out ``--kv-pull-wait-secs`` for an embedding that never came, and
smg, which gives up on a prefill silent for 3 s, answered 504 where aggregated and PD
answer 400 with the reason. Now the prefill checks the prompt against the items' grids
before it pulls, and a refused ``Encode`` marks its room failed for whoever pulls it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import grpc
import numpy as np
import pytest
import torch
from PIL import Image

from tandem.engine.types import ImageFeatures
from tandem.models import expand_placeholders, load_model_info, load_processor
from tandem.models.info import ModelInfo
from tandem.wire.tokenspeed import IMAGE, embedding_transfer_id, encode_into, epb, tpb
from tandem.worker.embedding_channel import EmbeddingFailed, EmbeddingStore
from tandem.worker.tokenspeed.encode_service import EncodeService
from tandem.worker.tokenspeed.epd_prefill import embedded_media
from tandem.worker.tokenspeed.media import read_items

pytestmark = pytest.mark.timeout(30)
PICTURE = Image.new("RGB", (64, 64), (255, 0, 0))


class Pulled(Exception):
    """The leg went on to pull an embedding."""


class RecordingClient:
    """An ``EmbeddingClient`` stand-in that records pulls and never answers one."""

    def __init__(self) -> None:
        self.pulls: list[str] = []

    async def pull(self, address: str, transfer_id: str, wait_s: float) -> NoReturn:
        self.pulls.append(transfer_id)
        raise Pulled(transfer_id)


def epd_prefill_leg(model_dir: Path, short_by: int) -> tuple[tpb.GenerateRequest, ModelInfo]:
    """One image's prefill leg under E/P/D (no pixels, one encode room), its run of image
    tokens ``short_by`` shorter than the model needs (smg's LLaVA count is 16 of 64)."""
    info = load_model_info(model_dir)
    pre = load_processor(model_dir).preprocess([PICTURE])
    tokens = pre.tokens_per_image[0] - short_by
    ids = [5, info.anchor_token_id, 6, 7]
    ids, [(offset, length)] = expand_placeholders(
        ids, info.anchor_token_id, [tokens], info.image_token_id
    )
    req = tpb.GenerateRequest(request_id="epd")
    req.tokenized.input_ids.extend(ids)
    item = req.mm_inputs.items.add(modality=IMAGE, content_hash=b"h" * 32)
    for key, value in pre.grids.items():
        encode_into(item.model_specific_tensors[key], np.asarray(value))
    item.placeholders.add(offset=offset, length=length)
    item.placeholder_token_id = info.image_token_id
    req.encode_bootstrap_info.items.add(
        item_index=0, bootstrap_host="127.0.0.1", bootstrap_port=9, bootstrap_room=42
    )
    return req, info


async def prefill_media(req: tpb.GenerateRequest, info: ModelInfo, client: Any) -> Any:
    ids = list(req.tokenized.input_ids)
    items = read_items(req, len(ids), info, pixels=True)
    return await embedded_media(req, ids, items, info, client, 30.0, supports_vision=True)


@pytest.fixture(params=["qwen", "llava"])
def family_dir(request: pytest.FixtureRequest, qwen_meta_dir: Path, llava_meta_dir: Path) -> Path:
    return qwen_meta_dir if request.param == "qwen" else llava_meta_dir


async def test_a_mislaid_prompt_is_refused_before_any_pull(family_dir: Path) -> None:
    req, info = epd_prefill_leg(family_dir, short_by=1)
    client = RecordingClient()
    with pytest.raises(ValueError, match=r"the prompt has \d+ image tokens but its 1 image"):
        await prefill_media(req, info, client)
    assert client.pulls == []


async def test_a_well_laid_prompt_goes_on_to_pull(family_dir: Path) -> None:
    req, info = epd_prefill_leg(family_dir, short_by=0)
    client = RecordingClient()
    with pytest.raises(Pulled):
        await prefill_media(req, info, client)
    assert client.pulls == [embedding_transfer_id(42)]


class AbortingContext:
    """The part of ``grpc.aio.ServicerContext`` that ``Encode`` uses to refuse."""

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise RuntimeError(f"{code.name}: {details}")


async def test_a_refused_encode_fails_its_room_at_once(qwen_meta_dir: Path) -> None:
    info = load_model_info(qwen_meta_dir)
    store = EmbeddingStore()
    # Refused before any encoder or cache is touched: neither is needed here.
    service = EncodeService(None, None, store, info, "m")  # type: ignore[arg-type]
    request = epb.EncodeRequest(request_id="encode-1")
    item = request.mm_inputs.items.add(modality=IMAGE)
    item.placeholders.add(offset=1, length=4)
    request.items.add(bootstrap_room=42)
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT: the item carries no encoder_input"):
        await service.Encode(request, AbortingContext())  # type: ignore[arg-type]
    assert service.refused == 1
    with pytest.raises(EmbeddingFailed, match="the encode worker refused it: the item carries"):
        await store.wait_take(embedding_transfer_id(42), wait_s=0.0)


async def test_a_refused_encode_leaves_a_held_embedding_alone(qwen_meta_dir: Path) -> None:
    """A repeat of a room that already holds features (a retried ``Encode``) keeps them."""
    info = load_model_info(qwen_meta_dir)
    store = EmbeddingStore()
    store.put(embedding_transfer_id(7), "digest", ImageFeatures(torch.zeros(4, 8)))
    service = EncodeService(None, None, store, info, "m")  # type: ignore[arg-type]
    request = epb.EncodeRequest(request_id="encode-2")
    request.items.add(bootstrap_room=7)
    with pytest.raises(RuntimeError, match="mm_inputs is required"):
        await service.Encode(request, AbortingContext())  # type: ignore[arg-type]
    assert (await store.wait_take(embedding_transfer_id(7), wait_s=0.0)).digest == "digest"
