"""The one media policy that the gateway (router path) and the worker (media_refs path) share.

Keeping a single validated object means a URL refused on one path is refused on the other
(docs/pd-contract.md §5): both sides build a ``MediaPolicy`` from the same flags.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import httpx

MiB = 1024 * 1024

# Schemes that need no local configuration; "file" is added only with an allowed directory.
_BASE_SCHEMES: tuple[str, ...] = ("http", "https", "data")


@dataclass(slots=True, frozen=True)
class MediaPolicy:
    # Off by default: private, loopback and link-local hosts are how SSRF reaches internal
    # services. Tests and single-host deployments turn it on explicitly.
    allow_private_hosts: bool = False
    # Empty means any host; an entry matches the host itself or any subdomain of it.
    allowed_domains: tuple[str, ...] = ()
    # file:// URLs are accepted only for files that resolve inside this directory.
    allowed_local_path: Path | None = None
    # Cap on encoded bytes per item (HTTP body, decoded data-URL payload, file contents).
    max_bytes: int = 32 * MiB
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    # Wall-clock budget for one item across DNS, every redirect hop and the body.
    total_timeout_s: float = 30.0
    max_redirects: int = 5
    # Decompression-bomb cap on declared width*height, checked before pixels are decoded.
    max_image_pixels: int = 8192 * 8192
    # Decode large JPEGs at 1/2, 1/4 or 1/8 scale (still >= 2x the preprocessor's resize
    # target): about half the CPU of decode + resize, but pixel values then differ slightly
    # from the checkpoint's processor, so it is opt-in.
    jpeg_draft: bool = False
    # Video (docs/pd-contract.md §4, "Video"): encoded bytes per video, its longest duration,
    # and the sampling: frames per second (None: the model processor's own rate) and at
    # most this many frames per video (None: the processor's own cap).
    max_video_bytes: int = 256 * MiB
    max_video_seconds: float = 600.0
    video_fps: float | None = None
    max_video_frames: int | None = None
    # Decode work per video. Frames are decoded from the start, every one up to the last
    # sampled frame (the last frame of the clip), so CPU grows with the frames and pixels a
    # clip holds, not with the frames sampled. 18 000 frames is the longest clip the duration
    # cap admits at 30 fps; the pixel cap is those frames at 1920x1080, so that large frames
    # cannot cost more than that (docs/operations.md, "Memory bounds for images").
    max_video_frames_decoded: int = 18_000
    max_video_pixels_decoded: int = 18_000 * 1920 * 1080
    # A declared rate above this is not a camera's: it only shrinks the duration the caps
    # see (30 000 frames at 3000 fps "last" 10 s), so such a clip is refused.
    max_video_source_fps: float = 240.0

    def __post_init__(self) -> None:
        # Normalise so that matching is a plain comparison later; frozen dataclasses allow
        # this only through object.__setattr__.
        object.__setattr__(self, "allowed_domains", _normalise_domains(self.allowed_domains))
        if self.allowed_local_path is not None:
            root = Path(self.allowed_local_path)
            if not root.is_absolute():
                raise ValueError(f"allowed_local_path must be absolute, got {str(root)!r}")
            object.__setattr__(self, "allowed_local_path", root)
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {self.max_bytes}")
        for name in ("connect_timeout_s", "read_timeout_s", "total_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.max_redirects < 0:
            raise ValueError(f"max_redirects must be >= 0, got {self.max_redirects}")
        if self.max_image_pixels <= 0:
            raise ValueError(f"max_image_pixels must be positive, got {self.max_image_pixels}")
        if self.max_video_bytes <= 0 or not self.max_video_seconds > 0:
            raise ValueError("max_video_bytes and max_video_seconds must be positive")
        if self.video_fps is not None and not self.video_fps > 0:
            raise ValueError(f"video_fps must be positive, got {self.video_fps}")
        if self.max_video_frames is not None and self.max_video_frames < 2:
            raise ValueError(f"max_video_frames must be at least 2, got {self.max_video_frames}")
        for name in ("max_video_frames_decoded", "max_video_pixels_decoded"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.max_video_source_fps > 0:
            fps = self.max_video_source_fps
            raise ValueError(f"max_video_source_fps must be positive, got {fps}")

    def for_video(self) -> MediaPolicy:
        """This policy with the per-video byte cap in place of the per-image one."""
        return replace(self, max_bytes=self.max_video_bytes)

    def schemes(self) -> tuple[str, ...]:
        """Accepted URL schemes, in the order advertised to routers."""
        if self.allowed_local_path is None:
            return _BASE_SCHEMES
        return (*_BASE_SCHEMES, "file")

    def schemes_label(self) -> str:
        """Comma list as advertised in GetServerInfo's mm_media_ref_schemes."""
        return ",".join(self.schemes())

    def domain_allowed(self, host: str) -> bool:
        """Whether ``host`` (lowercase ASCII/IDNA form) passes the domain allow-list."""
        if not self.allowed_domains:
            return True
        host = host.rstrip(".")
        return any(host == d or host.endswith("." + d) for d in self.allowed_domains)


def _normalise_domains(domains: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    if isinstance(domains, str):
        # A bare string would otherwise be split into one-letter "domains".
        raise ValueError("allowed_domains must be a sequence of domain names, not a string")
    out: list[str] = []
    for raw in domains:
        entry = str(raw).strip().lower().strip(".")
        if not entry or any(c in entry for c in "/:@ *?#"):
            raise ValueError(f"allowed_domains entry {raw!r} is not a plain domain name")
        try:
            # Store the ASCII (IDNA) form that httpx gives URL hosts, using httpx's own
            # parser so that both sides of the comparison are normalised the same way.
            entry = httpx.URL(f"http://{entry}/").raw_host.decode("ascii")
        except (httpx.InvalidURL, UnicodeError) as exc:
            raise ValueError(f"allowed_domains entry {raw!r} is not a valid domain") from exc
        out.append(entry)
    return tuple(out)
