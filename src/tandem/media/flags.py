"""The media-policy flags, shared by `tandem gateway` and `tandem worker` (one media policy)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from tandem.media.policy import MediaPolicy, MiB

_DEFAULTS = MediaPolicy()
_MEGA = 1_000_000


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type that refuses zero and negative values with a clear message."""

    def parse(raw: str) -> int | float:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {raw}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error messages
    return parse


def add_media_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mm-allow-private-media-hosts",
        action="store_true",
        help="allow media URLs on private, loopback and link-local addresses",
    )
    parser.add_argument("--mm-allowed-media-domains", nargs="*", default=[])
    parser.add_argument("--allowed-local-media-path", type=Path, default=None)
    parser.add_argument(
        "--mm-max-media-mb",
        type=_positive(float),
        default=_DEFAULTS.max_bytes / MiB,
        help="encoded bytes per media item (HTTP body, data URL, file), in MiB",
    )
    parser.add_argument(
        "--mm-fetch-connect-timeout-secs",
        type=_positive(float),
        default=_DEFAULTS.connect_timeout_s,
    )
    parser.add_argument(
        "--mm-fetch-read-timeout-secs", type=_positive(float), default=_DEFAULTS.read_timeout_s
    )
    parser.add_argument(
        "--mm-fetch-timeout-secs",
        type=_positive(float),
        default=_DEFAULTS.total_timeout_s,
        help="one media item in total: DNS, every redirect hop and the body",
    )
    parser.add_argument(
        "--mm-max-redirects",
        type=int,
        choices=range(0, 21),
        metavar="0..20",
        default=_DEFAULTS.max_redirects,
    )
    parser.add_argument(
        "--mm-max-image-pixels",
        type=_positive(int),
        default=_DEFAULTS.max_image_pixels,
        help="declared width*height above which an image is refused before decoding",
    )
    parser.add_argument(
        "--mm-jpeg-draft",
        action="store_true",
        help="decode large JPEGs at a reduced scale (>= 2x the resize target): faster, "
        "but pixels differ slightly from the model's own image processor",
    )
    add_video_flags(parser)


def add_video_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mm-max-video-mb",
        type=_positive(float),
        default=_DEFAULTS.max_video_bytes / MiB,
        help="encoded bytes per video (HTTP body, data URL, file), in MiB",
    )
    parser.add_argument(
        "--mm-max-video-seconds",
        type=_positive(float),
        default=_DEFAULTS.max_video_seconds,
        help="longest video accepted, read from its container before decoding",
    )
    parser.add_argument(
        "--mm-video-fps",
        type=_positive(float),
        default=None,
        help="frames sampled per second of video (default: the model processor's, 2 for Qwen3-VL)",
    )
    parser.add_argument(
        "--mm-max-video-frames",
        type=_at_least_two,
        default=None,
        help="at most this many frames sampled per video (default: the processor's cap)",
    )
    parser.add_argument(
        "--mm-max-video-frames-decoded",
        type=_positive(int),
        default=_DEFAULTS.max_video_frames_decoded,
        help="frames decoded per video (all of them up to the last sampled one): a clip with "
        "more is refused before decoding, and decoding stops there whatever the header said",
    )
    parser.add_argument(
        "--mm-max-video-megapixels-decoded",
        type=_positive(float),
        default=_DEFAULTS.max_video_pixels_decoded / _MEGA,
        help="frames decoded per video times their pixels, in millions (default: 18 000 "
        "frames of 1920x1080); bounds the decode CPU of large frames",
    )
    parser.add_argument(
        "--mm-max-video-source-fps",
        type=_positive(float),
        default=_DEFAULTS.max_video_source_fps,
        help="a video whose container declares a higher frame rate is refused",
    )


def _at_least_two(raw: str) -> int:
    value = int(raw)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (one temporal patch), got {raw}")
    return value


def media_policy_from_args(args: argparse.Namespace) -> MediaPolicy:
    return MediaPolicy(
        allow_private_hosts=args.mm_allow_private_media_hosts,
        allowed_domains=tuple(args.mm_allowed_media_domains),
        allowed_local_path=args.allowed_local_media_path,
        max_bytes=max(1, round(args.mm_max_media_mb * MiB)),
        connect_timeout_s=args.mm_fetch_connect_timeout_secs,
        read_timeout_s=args.mm_fetch_read_timeout_secs,
        total_timeout_s=args.mm_fetch_timeout_secs,
        max_redirects=args.mm_max_redirects,
        max_image_pixels=args.mm_max_image_pixels,
        jpeg_draft=args.mm_jpeg_draft,
        max_video_bytes=max(1, round(args.mm_max_video_mb * MiB)),
        max_video_seconds=args.mm_max_video_seconds,
        video_fps=args.mm_video_fps,
        max_video_frames=args.mm_max_video_frames,
        max_video_frames_decoded=args.mm_max_video_frames_decoded,
        max_video_pixels_decoded=max(1, round(args.mm_max_video_megapixels_decoded * _MEGA)),
        max_video_source_fps=args.mm_max_video_source_fps,
    )
