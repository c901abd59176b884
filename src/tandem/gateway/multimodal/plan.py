"""The media plan of one request: its image and video URLs in authored order, and the checks on them
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
    """Image and video parts of a request, in the order the client wrote them.

    The ``k``-th image pairs with the ``k``-th image anchor of the rendered prompt, the
    ``k``-th video with the ``k``-th video anchor, on both paths.
    """

    image_urls: tuple[str, ...]
    video_urls: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()  # "image" / "video" per part, in order; () means all images

    def __len__(self) -> int:
        return len(self.image_urls)

    @property
    def is_empty(self) -> bool:
        return not self.image_urls and not self.video_urls

    @property
    def parts(self) -> list[tuple[str, str]]:
        """``(modality, url)`` of every part, in the order written."""
        kinds = self.kinds or ("image",) * len(self.image_urls)
        images, videos = iter(self.image_urls), iter(self.video_urls)
        return [(kind, next(images if kind == "image" else videos)) for kind in kinds]

    @property
    def forwardable(self) -> bool:
        """Whether a worker can take every item as a ``MediaRef`` (docs/pd-contract.md §3).

        Only image and video URLs without per-item hints (``fps``, sizes) exist today, and a
        ``data:`` URL is still a URL, so every plan is forwardable. Inline bytes, hints,
        audio or embeddings would make a plan non-forwardable once the schema layer accepts
        them.
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


def plan_media(
    parts: Sequence[tuple[str, str]],
    image_limit: int | None = None,
    video_limit: int | None = None,
) -> MediaPlan:
    """The plan of ``(modality, url)`` parts; each limit as for :func:`plan_images`
    (``--mm-per-request-image-limit``, ``--mm-per-request-video-limit``)."""
    images = plan_images([url for kind, url in parts if kind == "image"], image_limit)
    videos = tuple(url for kind, url in parts if kind == "video")
    if video_limit is not None and len(videos) > video_limit:
        raise make_error(
            "multimodal_too_many_items",
            f"the request has {len(videos)} videos; at most {video_limit} are allowed per request",
        )
    return MediaPlan(images.image_urls, videos, tuple(kind for kind, _ in parts))


def check_video_anchors(input_ids: Sequence[int], info: ModelInfo, video_count: int) -> None:
    """As :func:`check_anchors`, for videos and the model's video anchor."""
    anchor = info.video_token_id
    anchors = count_anchors(input_ids, anchor) if anchor is not None else 0
    if anchors != video_count:
        raise make_error(
            "multimodal_prompt_contract_mismatch",
            f"the prompt has {anchors} video placeholder token(s) "
            f"{info.family.video_anchor_token!r} (id {anchor}) but the request has "
            f"{video_count} video(s); each video part must render exactly one placeholder "
            "and the text must not contain the placeholder token itself",
        )


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
