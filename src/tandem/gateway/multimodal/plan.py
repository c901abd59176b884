"""The media plan of one request: its image URLs in authored order, and the checks on them
that need neither the network nor the model's processor (docs/pd-contract.md §3, §4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tandem.errors import make_error
from tandem.models.info import ModelInfo
from tandem.models.placeholders import count_anchors


@dataclass(frozen=True, slots=True)
class MediaPlan:
    """Image parts of a request, in the order the client wrote them.

    Item ``k`` pairs with the ``k``-th anchor token of the rendered prompt on both paths.
    """

    image_urls: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.image_urls)

    @property
    def is_empty(self) -> bool:
        return not self.image_urls

    @property
    def forwardable(self) -> bool:
        """Whether a worker can take every item as a ``MediaRef`` (docs/pd-contract.md §3).

        Only image URLs without per-image hints exist today, and a ``data:`` URL is still a
        URL, so every plan is forwardable. Inline bytes, hints, audio or embeddings would make
        a plan non-forwardable once the schema layer accepts them.
        """
        return True


def plan_images(urls: Sequence[str], limit: int | None = None) -> MediaPlan:
    """Build the plan; more than ``limit`` images is a 400 ``multimodal_too_many_items``.

    ``limit`` is ``--mm-per-request-image-limit``; ``None`` means no limit (0 allows none).
    Checked before anything is fetched, so an oversized request costs no network.
    """
    if isinstance(urls, str):
        # A bare string would otherwise become one "URL" per character.
        raise TypeError("plan_images takes a sequence of URLs, not a string")
    if limit is not None and len(urls) > limit:
        raise make_error(
            "multimodal_too_many_items",
            f"the request has {len(urls)} images; at most {limit} are allowed per request",
        )
    return MediaPlan(tuple(urls))


def check_anchors(input_ids: Sequence[int], info: ModelInfo, image_count: int) -> None:
    """400 ``multimodal_prompt_contract_mismatch`` unless the prompt has one anchor per image.

    Run on the tokenized prompt before fetching (router path) or forwarding (worker path):
    a prompt that cannot pair its images with placeholders must not cost any media traffic.
    """
    anchors = count_anchors(input_ids, info.anchor_token_id)
    if anchors != image_count:
        token = info.family.anchor_token
        raise make_error(
            "multimodal_prompt_contract_mismatch",
            f"the prompt has {anchors} image placeholder token(s) {token!r} "
            f"(id {info.anchor_token_id}) but the request has {image_count} image(s); "
            "each image part must render exactly one placeholder and the text must not "
            "contain the placeholder token itself",
        )
