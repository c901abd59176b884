"""Pixel arrays handed from an image pool process to the gateway through /dev/shm files.

The gateway names each segment before the task is sent, so it can remove the file whatever
happens to the pool process that writes it (a crash mid-write, a request cancelled while the
image was being processed). The pool process writes the pixels into the file once; the
gateway maps it read-only as a numpy array (no copy) and unlinks it at once: the mapping
stays valid, and no file outlives the request, even if the gateway is killed later
(docs/operations.md, "Memory bounds for images"). Files of gateways that died between the
write and the unlink are swept when the next pool starts.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import stat
import tempfile
from pathlib import Path

import numpy as np

from tandem.ascii_int import ascii_int
from tandem.wire.shm import pid_alive

# Distinct from the tensor transport's segments (wire/shm*): this sweep must never touch them.
PREFIX = "tandem-mmpool-"


def segment_dir() -> Path:
    """tmpfs where there is one (Linux), else the temp dir: same code, slower pages."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def new_segment_path(directory: Path | None = None) -> str:
    """A fresh, unguessable path owned by this process (its pid is in the name)."""
    base = directory if directory is not None else segment_dir()
    return str(base / f"{PREFIX}{os.getpid()}-{secrets.token_hex(8)}")


def write_segment(path: str, array: np.ndarray) -> None:
    """Create ``path`` (never an existing file or a link) holding ``array``'s bytes."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    with open(fd, "wb", closefd=True) as out:
        out.write(np.ascontiguousarray(array).data)


def map_segment(path: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The array in ``path``, mapped read-only without a copy; the file is unlinked here.

    Refuses anything but a regular file of exactly the expected size (a bug or a tampered
    /dev/shm would otherwise hand the worker garbage pixels).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    finally:
        # Unlinked first thing, whatever follows: the open fd (or nothing) keeps the pages.
        discard_segment(path)
    try:
        info = os.fstat(fd)
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if not stat.S_ISREG(info.st_mode) or info.st_size != want:
            raise ValueError(f"pixel segment has {info.st_size} bytes, expected {want}")
        if want == 0:
            return np.empty(shape, dtype=dtype)
        mapped = mmap.mmap(fd, want, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    # The array keeps the mapping alive; ACCESS_READ makes it read-only for good.
    return np.frombuffer(mapped, dtype=dtype).reshape(shape)


def discard_segment(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sweep_stale_segments(directory: Path | None = None) -> int:
    """Remove the segments of gateway processes that no longer exist; how many were removed."""
    base = directory if directory is not None else segment_dir()
    removed = 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(PREFIX):
            continue
        owner = ascii_int(name[len(PREFIX) :].partition("-")[0])
        if owner is None or pid_alive(owner):
            continue
        with contextlib.suppress(OSError):
            os.unlink(base / name)
            removed += 1
    return removed
