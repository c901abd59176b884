"""The media-policy flags, shared by `tandem gateway` and `tandem worker` (one media policy)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tandem.media.policy import MediaPolicy


def add_media_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mm-allow-private-media-hosts",
        action="store_true",
        help="allow media URLs on private, loopback and link-local addresses",
    )
    parser.add_argument("--mm-allowed-media-domains", nargs="*", default=[])
    parser.add_argument("--allowed-local-media-path", type=Path, default=None)
    parser.add_argument(
        "--mm-jpeg-draft",
        action="store_true",
        help="decode large JPEGs at a reduced scale (>= 2x the resize target): faster, "
        "but pixels differ slightly from the model's own image processor",
    )


def media_policy_from_args(args: argparse.Namespace) -> MediaPolicy:
    return MediaPolicy(
        allow_private_hosts=args.mm_allow_private_media_hosts,
        allowed_domains=tuple(args.mm_allowed_media_domains),
        allowed_local_path=args.allowed_local_media_path,
        jpeg_draft=args.mm_jpeg_draft,
    )
