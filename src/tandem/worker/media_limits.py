"""Bounds on the worker's ``media_refs`` processing: items, requests at once, decoded bytes.

A worker that fetches and decodes images for the gateway needs the same protection as the
gateway's router path (docs/operations.md, "Memory bounds for images"):

- ``--mm-max-items``: images per request; more is 400 ``multimodal_too_many_items``,
  refused before anything is fetched.
- ``--mm-max-inflight``: requests fetching, decoding and preprocessing at once; one more is
  UNAVAILABLE "worker is saturated…", which gateways retry on another worker.
- ``--mm-max-decoded-bytes``: decoded images (read from their headers, before decoding) and
  pixel values being made at once; over it is UNAVAILABLE "worker is saturated…" as well,
  a single request above the whole budget is 413 ``multimodal_payload_too_large``.

The refusals are ``MediaError``s, so the servicer answers them like refused media: its
status from ``retryable``, its code in the trailing metadata. 0 turns a bound off.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tandem.media import MediaError
from tandem.media.budget import ByteBudget

SATURATED = "worker is saturated"


class TooManyItems(MediaError):
    code = "multimodal_too_many_items"


class Saturated(MediaError):
    """Retryable: another worker, or this one a moment later, can take the request.

    No client-error code: the gateway reports a 503 under the leg's own code.
    """

    code = ""
    retryable = True


class DecodedTooLarge(MediaError):
    code = "multimodal_payload_too_large"


class DecodedBudget(ByteBudget):
    def refuse(self, nbytes: int, *, ever: bool) -> Exception:
        if ever:
            return DecodedTooLarge(
                f"the request's images take {nbytes} bytes while decoded (one at a time) and "
                f"preprocessed, more than this worker's --mm-max-decoded-bytes={self.limit}; "
                "send fewer or smaller images"
            )
        return Saturated(
            f"{SATURATED}: decoded images of other requests hold {self.used} of "
            f"--mm-max-decoded-bytes={self.limit}; retry on another worker or later"
        )


@dataclass(frozen=True, slots=True)
class MediaRefsLimitConfig:
    max_inflight: int = 64
    max_items: int = 8
    max_decoded_bytes: int = 512 << 20

    def __post_init__(self) -> None:
        for flag, value in (
            ("--mm-max-inflight", self.max_inflight),
            ("--mm-max-items", self.max_items),
            ("--mm-max-decoded-bytes", self.max_decoded_bytes),
        ):
            if value < 0:
                raise ValueError(f"{flag} must be >= 0 (0: no limit), got {value}")


class MediaRefsLimits:
    """One worker's live counts against its :class:`MediaRefsLimitConfig`."""

    def __init__(self, config: MediaRefsLimitConfig | None = None) -> None:
        self.config = config or MediaRefsLimitConfig()
        self.inflight = 0
        self.budget = DecodedBudget(self.config.max_decoded_bytes)

    def check_items(self, count: int) -> None:
        limit = self.config.max_items
        if limit and count > limit:
            raise TooManyItems(
                f"media_refs has {count} items; this worker takes at most {limit} a request "
                "(--mm-max-items)"
            )

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Held while one request's media are fetched, decoded and preprocessed."""
        limit = self.config.max_inflight
        if limit and self.inflight >= limit:
            raise Saturated(
                f"{SATURATED}: {self.inflight} media_refs requests are being processed "
                f"(--mm-max-inflight={limit}); retry on another worker or later"
            )
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1


_DEFAULTS = MediaRefsLimitConfig()


def add_media_limit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mm-max-inflight",
        type=int,
        default=_DEFAULTS.max_inflight,
        help="media_refs requests fetched and decoded at once; more: UNAVAILABLE (0: no limit)",
    )
    parser.add_argument(
        "--mm-max-items",
        type=int,
        default=_DEFAULTS.max_items,
        help="images per media_refs request; more: 400 (0: no limit)",
    )
    parser.add_argument(
        "--mm-max-decoded-bytes",
        type=int,
        default=_DEFAULTS.max_decoded_bytes,
        help="decoded image bytes being processed at once, charged from the image headers "
        "before decoding; over: UNAVAILABLE, one request above it: 413 (0: no limit)",
    )


def media_limits_from_args(args: argparse.Namespace) -> MediaRefsLimitConfig:
    return MediaRefsLimitConfig(
        max_inflight=args.mm_max_inflight,
        max_items=args.mm_max_items,
        max_decoded_bytes=args.mm_max_decoded_bytes,
    )
