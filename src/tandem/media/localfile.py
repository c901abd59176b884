"""``file://`` URLs: only under ``policy.allowed_local_path``, after resolving symlinks."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tandem.media.errors import MediaFetchFailed, MediaRefused, MediaTooLarge, describe_url
from tandem.media.policy import MediaPolicy
from tandem.media.types import FetchedMedia


def resolve_local_path(url: str, policy: MediaPolicy) -> Path:
    """The real path a file:// URL names, refused unless it lies inside the allowed directory.

    Containment is judged on fully resolved paths (symlinks and '..' removed), so neither a
    symlink inside the directory nor a '..' segment can reach a file outside it.
    """
    root = policy.allowed_local_path
    if root is None:
        raise MediaRefused("file:// URLs are not accepted (no local media directory is set)")
    try:
        parts = urlsplit(url)
        raw = unquote(parts.path, errors="strict")
    except (ValueError, UnicodeError) as exc:
        raise MediaRefused(f"malformed file URL: {describe_url(url)!r}") from exc
    if parts.scheme.lower() != "file":
        raise MediaRefused(f"not a file URL: {describe_url(url)!r}")
    if parts.netloc not in ("", "localhost"):
        raise MediaRefused(f"file URL names a remote host: {describe_url(url)!r}")
    if parts.query or parts.fragment:
        raise MediaRefused(f"file URL must not have a query or fragment: {describe_url(url)!r}")
    if not raw.startswith("/") or "\x00" in raw:
        raise MediaRefused(f"file URL path is not an absolute path: {describe_url(url)!r}")
    try:
        real_root = root.resolve(strict=True)
        real = Path(os.path.realpath(raw))
    except (OSError, RuntimeError) as exc:
        raise MediaRefused(f"local media path cannot be resolved: {describe_url(url)!r}") from exc
    if real == real_root or not real.is_relative_to(real_root):
        shown = describe_url(url)
        raise MediaRefused(f"file URL is outside the allowed media directory: {shown!r}")
    return real


def _read_capped(path: Path, max_bytes: int) -> bytes:
    # O_NOFOLLOW on the final component: the path was already resolved, so a symlink here
    # means it was swapped in after the check. O_NONBLOCK keeps a FIFO from blocking the
    # open until some writer appears; it changes nothing for regular files.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        raise MediaFetchFailed(f"local media file not found: {path.name!r}") from exc
    except OSError as exc:
        raise MediaRefused(f"local media file cannot be opened: {path.name!r}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MediaRefused(f"local media path is not a regular file: {path.name!r}")
        if info.st_size > max_bytes:
            raise MediaTooLarge(
                f"local media file is {info.st_size} bytes, over the {max_bytes}-byte limit"
            )
        # Read one byte past the cap in case the file grew after fstat.
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise MediaTooLarge(f"local media file is over the {max_bytes}-byte limit")
    return data


async def read_local_file(url: str, policy: MediaPolicy) -> FetchedMedia:
    path = resolve_local_path(url, policy)
    # File reads block; keep them off the event loop.
    data = await asyncio.to_thread(_read_capped, path, policy.max_bytes)
    return FetchedMedia(data=data, content_type=None, source_scheme="file")
