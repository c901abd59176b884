"""Same-host tensor payloads in ``/dev/shm`` (``TensorData.shm``, docs/pd-contract.md §17a).

The writer (the gateway) puts a tensor's wire bytes into a fresh segment and sends only a
``ShmHandle`` naming it; the reader (a worker on the same host) reads exactly the handle's
bytes and unlinks the segment. Segment names carry their owner so that segments of a
process that died can be swept: ``tandem-<pid>-<pid namespace>-<seq>``.

Everything here is synchronous and small: a segment is one ``open``/``write``/``close`` on
a tmpfs, far below the cost of serializing the same bytes into a gRPC message.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tandem.wire.proto import common

log = logging.getLogger("tandem.wire.shm")

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "tandem-"
_SEGMENT_NAME = re.compile(r"^tandem-(\d+)-(\d+)-(\d+)$")
# What a worker agrees to read (and then remove): Tandem's segments, and smg's
# (``smg-<runtime>-<pid>-<nanos>-<seq>``, docs/pd-contract.md §17a). Any other name in
# /dev/shm belongs to someone else (vLLM's ``psm_*``, a database's): a handle cannot
# make a worker read or delete it.
_READABLE_NAME = re.compile(r"^(?:tandem-\d+-\d+-\d+|smg-[a-z0-9]+-\d+-\d+-\d+)$")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a handle naming a FIFO must fail the regular-file check, not block the open.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class ShmError(ValueError):
    """A handle that cannot be read here (bad name, not a file, wrong size, unreadable)."""


def shm_namespace_id(shm_dir: Path = SHM_DIR) -> str:
    """``<boot_id>:<st_dev of /dev/shm>``: equal for two processes iff they share /dev/shm.

    The boot id pins the host (it is not namespaced); the device number pins the tmpfs
    mount, so two containers that share it (``--ipc``, a bind mount) still match. "" when
    either cannot be read. vLLM's servicer advertises the same token (docs/pd-contract.md).
    """
    try:
        boot_id = _BOOT_ID.read_text(encoding="ascii").strip()
        device = os.stat(shm_dir).st_dev
    except OSError:
        return ""
    return f"{boot_id}:{device}" if boot_id else ""


def pid_namespace() -> int:
    """The inode of this process's pid namespace (0 when unknown).

    Part of every segment name: a pid is only meaningful inside its own pid namespace, so
    the sweep judges only segments written from the same one.
    """
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def validated_name(name: str) -> str:
    """The segment name of a handle, refused unless it is one plain file name that a
    Tandem or smg writer would have made."""
    bare = name.lstrip("/")
    if not bare or "/" in bare or bare in (".", "..") or "\x00" in bare:
        raise ShmError(f"invalid TensorData.shm name {name!r}: expected one file name")
    if not _READABLE_NAME.match(bare):
        raise ShmError(
            f"TensorData.shm name {name[:80]!r} is not a gateway's tensor segment "
            "(tandem-<pid>-<ns>-<seq> or smg-<runtime>-<pid>-<nanos>-<seq>); refusing it"
        )
    return bare


def unlink_quietly(path: Path) -> None:
    """Remove a segment; one that is already gone (the reader unlinked it) is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove shared-memory segment %s: %s", path, exc)


def read_segment(handle: common.ShmHandle, shm_dir: Path = SHM_DIR) -> bytes:
    """Exactly ``handle.nbytes`` bytes at ``handle.offset`` of the segment, then unlink it.

    Refused (``ShmError``): a name no gateway writes, a symlink (``O_NOFOLLOW``), anything
    but a regular file, a file another user owns, a segment shorter than
    ``offset + nbytes``, and any OS error (not found, not permitted: the writer is not on
    this host, or runs as another user). A refused segment is left where it is: only one
    read whole is unlinked.
    """
    name = validated_name(handle.name)
    path = shm_dir / name
    offset, nbytes = int(handle.offset), int(handle.nbytes)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ShmError(f"TensorData.shm {name!r} is a symlink; refusing it") from None
        raise ShmError(
            f"TensorData.shm {name!r} cannot be opened on this worker ({exc.strerror}); "
            "shared-memory tensors need the gateway on the same host and /dev/shm "
            "(--multimodal-tensor-transport auto checks that)"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ShmError(f"TensorData.shm {name!r} is not a regular file")
        if info.st_uid != os.geteuid():
            raise ShmError(f"TensorData.shm {name!r} belongs to another user; refusing it")
        if offset + nbytes > info.st_size:
            raise ShmError(
                f"TensorData.shm {name!r} holds {info.st_size} bytes; the handle asks for "
                f"{nbytes} at offset {offset}"
            )
        try:
            data = os.pread(fd, nbytes, offset)
        except OSError as exc:
            raise ShmError(f"TensorData.shm {name!r} could not be read: {exc.strerror}") from None
        if len(data) != nbytes:
            raise ShmError(f"TensorData.shm {name!r}: short read of {len(data)} of {nbytes} bytes")
    finally:
        os.close(fd)
    unlink_quietly(path)  # read whole: the segment was meant for this one read
    return data


@dataclass(frozen=True, slots=True)
class Segment:
    """One written segment and the handle that names it."""

    path: Path
    handle: common.ShmHandle

    def unlink(self) -> None:
        unlink_quietly(self.path)


class SegmentWriter:
    """Creates this process's segments and remembers the ones not yet released.

    ``write`` is called on the event loop; the lock only guards the counter and the live
    set against a thread that might write too (the media pool hands arrays back to the loop).
    """

    def __init__(self, shm_dir: Path = SHM_DIR) -> None:
        self.shm_dir = shm_dir
        self.pid = os.getpid()
        self.pidns = pid_namespace()
        self.owner_id = f"tandem:{self.pid}"
        self._seq = 0
        self._lock = threading.Lock()
        self._live: set[Path] = set()

    def writable(self) -> bool:
        return os.access(self.shm_dir, os.W_OK | os.X_OK)

    def _next_path(self) -> Path:
        with self._lock:
            self._seq += 1
            seq = self._seq
        return self.shm_dir / f"{SEGMENT_PREFIX}{self.pid}-{self.pidns}-{seq}"

    def write(self, chunks: Iterable[memoryview | bytes], nbytes: int) -> Segment:
        """A new 0600 segment holding ``chunks`` (``nbytes`` in all); raises ``OSError``.

        The space is reserved first (``posix_fallocate``), so a full tmpfs fails here with
        ENOSPC rather than later; a half-written segment is removed before the error leaves.
        """
        for _ in range(8):
            path = self._next_path()
            try:
                fd = os.open(path, _CREATE_FLAGS, 0o600)
                break
            except FileExistsError:
                # Left by a dead process that had our pid: the start-up sweep missed it.
                continue
        else:
            raise OSError(errno.EEXIST, f"no free segment name under {self.shm_dir}")
        try:
            if nbytes and hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, nbytes)
            written = 0
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view:
                    count = os.write(fd, view)
                    written += count
                    view = view[count:]
            if written != nbytes:
                raise OSError(errno.EIO, f"wrote {written} of {nbytes} bytes")
        except BaseException:
            os.close(fd)
            unlink_quietly(path)
            raise
        os.close(fd)
        with self._lock:
            self._live.add(path)
        handle = common.ShmHandle(name=path.name, offset=0, nbytes=nbytes, owner_id=self.owner_id)
        return Segment(path, handle)

    def release(self, segments: Iterable[Segment]) -> None:
        """Unlink segments whose leg is over (read or not) and forget them."""
        for segment in segments:
            segment.unlink()
            with self._lock:
                self._live.discard(segment.path)

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._live)

    def close(self) -> None:
        """Unlink every segment still outstanding (the gateway is stopping)."""
        with self._lock:
            live, self._live = self._live, set()
        for path in live:
            unlink_quietly(path)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a live process (owners of leftover /dev/shm files)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


_swept_own_pid = False


def sweep_stale_segments(shm_dir: Path = SHM_DIR) -> list[str]:
    """Remove ``tandem-*`` segments left by dead processes of this pid namespace.

    Segments of another pid namespace are left alone (their pids mean nothing here). On the
    first call in a process, segments carrying this process's own pid are stale too: they
    were written by an earlier process that had the same pid, as this one has written none
    yet. Returns the names removed.
    """
    global _swept_own_pid
    own_pid, own_ns = os.getpid(), pid_namespace()
    include_own, _swept_own_pid = not _swept_own_pid, True
    removed: list[str] = []
    try:
        entries = os.listdir(shm_dir)
    except OSError as exc:
        log.debug("no shared-memory sweep: %s", exc)
        return removed
    for name in entries:
        match = _SEGMENT_NAME.match(name)
        if match is None or int(match.group(2)) != own_ns:
            continue
        pid = int(match.group(1))
        stale = include_own if pid == own_pid else not pid_alive(pid)
        if not stale:
            continue
        try:
            os.unlink(shm_dir / name)
        except FileNotFoundError:
            continue
        except OSError as exc:  # another user's segment: not ours to remove
            log.debug("left stale segment %s: %s", name, exc)
            continue
        removed.append(name)
    if removed:
        log.info("removed %d stale shared-memory segment(s) of dead processes", len(removed))
    return removed
