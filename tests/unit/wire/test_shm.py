"""Shared-memory tensor segments (``tandem.wire.shm``) and their decoding as ``TensorData``.

Real files throughout: /dev/shm itself where the code reads it, a temporary directory
where a test needs a directory of its own (the sweep, a writer that fails).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tandem.wire import shm as shm_module
from tandem.wire.pixel_splice import serialize_with_pixels
from tandem.wire.pixels import PixelPayload
from tandem.wire.proto import GenerateRequest, TensorData, common
from tandem.wire.shm import (
    SHM_DIR,
    SegmentWriter,
    ShmError,
    pid_namespace,
    read_segment,
    shm_namespace_id,
    sweep_stale_segments,
    validated_name,
)
from tandem.wire.tensors import TensorCodecError, decode_tensor, tensor_nbytes


@pytest.fixture
def writer():
    w = SegmentWriter()
    yield w
    w.close()


def test_written_segment_is_private_named_for_its_owner_and_read_once(writer) -> None:
    data = np.arange(1000, dtype="<f4")
    segment = writer.write([data.data], data.nbytes)
    info = os.stat(segment.path)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert segment.path.parent == SHM_DIR
    assert segment.handle.name == f"tandem-{os.getpid()}-{pid_namespace()}-1"
    assert segment.handle.owner_id == f"tandem:{os.getpid()}"
    assert (segment.handle.offset, segment.handle.nbytes) == (0, data.nbytes)
    assert writer.live == 1
    assert read_segment(segment.handle) == data.tobytes()
    assert not segment.path.exists()  # the reader unlinks
    writer.release([segment])  # already gone: fine
    assert writer.live == 0


def test_a_leading_slash_is_stripped(writer) -> None:
    segment = writer.write([b"abc"], 3)
    handle = common.ShmHandle(name="/" + segment.handle.name, nbytes=3)
    assert read_segment(handle) == b"abc"


@pytest.mark.parametrize("name", ["", "/", "a/b", ".", "..", "/..", "a\x00b"])
def test_bad_names_are_refused_before_anything_is_opened(name: str) -> None:
    with pytest.raises(ShmError, match=r"invalid TensorData\.shm name"):
        validated_name(name)
    with pytest.raises(ShmError):
        read_segment(common.ShmHandle(name=name, nbytes=1))


def test_symlinks_fifos_and_directories_are_refused_and_kept(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"x" * 16)
    link, fifo, folder = "tandem-1-1-1", "tandem-1-1-2", "smg-vllm-1-2-3"
    (tmp_path / link).symlink_to(target)
    os.mkfifo(tmp_path / fifo)
    (tmp_path / folder).mkdir()
    with pytest.raises(ShmError, match="symlink"):
        read_segment(common.ShmHandle(name=link, nbytes=4), tmp_path)
    with pytest.raises(ShmError, match="not a regular file"):
        read_segment(common.ShmHandle(name=fifo, nbytes=4), tmp_path)  # and no hang
    with pytest.raises(ShmError, match="not a regular file"):
        read_segment(common.ShmHandle(name=folder, nbytes=4), tmp_path)
    assert (tmp_path / link).is_symlink() and (tmp_path / fifo).exists()
    assert target.read_bytes() == b"x" * 16


@pytest.mark.parametrize("name", ["psm_victim", "tandem-1-2", "tandem-a-1-1", "smg-1-2-3"])
def test_names_no_gateway_writes_are_refused_and_kept(tmp_path: Path, name: str) -> None:
    """Another program's shared memory (vLLM's psm_* segments, say) is neither read nor
    removed, whatever a handle claims: anyone who reaches a worker's port could send one."""
    (tmp_path / name).write_bytes(b"z" * 8)
    for nbytes in (8, 64):  # the right size and a wrong one
        with pytest.raises(ShmError, match="not a gateway's tensor segment"):
            read_segment(common.ShmHandle(name=name, nbytes=nbytes), tmp_path)
    assert (tmp_path / name).read_bytes() == b"z" * 8


def test_another_users_segment_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "tandem-7-7-7"
    path.write_bytes(b"q" * 8)
    os.chown(path, os.geteuid() + 4242, -1)  # the suite runs as root (CI does too)
    with pytest.raises(ShmError, match="another user"):
        read_segment(common.ShmHandle(name=path.name, nbytes=8), tmp_path)
    assert path.exists()


def test_a_handle_larger_than_its_segment_is_refused(tmp_path: Path) -> None:
    seg, seg2 = tmp_path / "tandem-5-5-1", tmp_path / "smg-tokenspeed-5-99-2"
    seg.write_bytes(b"y" * 8)
    with pytest.raises(ShmError, match="holds 8 bytes"):
        read_segment(common.ShmHandle(name=seg.name, offset=4, nbytes=8), tmp_path)
    assert seg.exists()  # refused, so not removed: only a whole read unlinks
    # Exactly the asked range at an offset is fine, and then the segment is gone.
    seg2.write_bytes(b"0123456789")
    assert read_segment(common.ShmHandle(name=seg2.name, offset=6, nbytes=4), tmp_path) == b"6789"
    assert not seg2.exists()


def test_a_missing_segment_says_the_gateway_must_share_this_host() -> None:
    with pytest.raises(ShmError, match="same host"):
        read_segment(common.ShmHandle(name="tandem-0-0-424242", nbytes=4))


def test_a_full_or_missing_directory_fails_the_write_and_leaves_nothing(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    w = SegmentWriter(gone)
    gone.rmdir()
    with pytest.raises(OSError):
        w.write([b"abc"], 3)
    w2 = SegmentWriter(tmp_path)
    with pytest.raises(OSError, match="wrote 3 of 5"):
        w2.write([b"abc"], 5)
    assert list(tmp_path.iterdir()) == []


def test_close_unlinks_what_no_reader_took(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path)
    paths = [w.write([b"a"], 1).path for _ in range(3)]
    assert all(p.exists() for p in paths)
    w.close()
    assert not any(p.exists() for p in paths)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_sweep_removes_only_segments_of_dead_owners_of_our_pid_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = pid_namespace()
    dead, alive = _dead_pid(), os.getppid()
    names = {
        "dead": f"tandem-{dead}-{ns}-1",
        "alive": f"tandem-{alive}-{ns}-1",
        "other_ns": f"tandem-{dead}-{ns + 1}-1",
        "own": f"tandem-{os.getpid()}-{ns}-7",
        "foreign": "psm_0123abcd",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"z")
    monkeypatch.setattr(shm_module, "_swept_own_pid", False)
    removed = sweep_stale_segments(tmp_path)
    # Our own pid on the first sweep: an earlier process with this pid left it.
    assert sorted(removed) == sorted([names["dead"], names["own"]])
    assert {p.name for p in tmp_path.iterdir()} == {
        names["alive"],
        names["other_ns"],
        names["foreign"],
    }
    # Later sweeps of the same process never touch its own (live) segments.
    (tmp_path / names["own"]).write_bytes(b"z")
    assert sweep_stale_segments(tmp_path) == []


def test_namespace_id_is_boot_id_and_shm_device() -> None:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert shm_namespace_id() == f"{boot}:{os.stat('/dev/shm').st_dev}"
    assert shm_namespace_id(Path("/no/such/dir")) == ""


def test_decode_tensor_reads_a_shm_payload_and_unlinks_it(writer) -> None:
    array = np.arange(24, dtype="<i8").reshape(2, 3, 4)
    segment = writer.write([array.data], array.nbytes)
    tensor = TensorData(shape=[2, 3, 4], dtype="int64", shm=segment.handle)
    assert tensor_nbytes(tensor) == array.nbytes
    np.testing.assert_array_equal(decode_tensor(tensor), array)
    assert not segment.path.exists()


def test_decode_tensor_refuses_a_handle_that_disagrees_with_its_shape(writer) -> None:
    segment = writer.write([b"\0" * 16], 16)
    tensor = TensorData(shape=[3], dtype="float32", shm=segment.handle)
    with pytest.raises(TensorCodecError, match="expected 12, got 16"):
        decode_tensor(tensor)
    assert segment.path.exists()  # refused before it was opened: the gateway removes it
    bad = TensorData(shape=[1], dtype="float32", shm=common.ShmHandle(name="../etc", nbytes=4))
    with pytest.raises(TensorCodecError, match=r"invalid TensorData\.shm name"):
        decode_tensor(bad)


def test_pixels_in_shm_travel_as_a_handle(writer) -> None:
    pixels = PixelPayload.from_array(np.ones((4, 6), dtype=np.float32))
    segment = writer.write([pixels.array.data], pixels.nbytes)
    sent = pixels.in_shm(segment.handle)
    request = GenerateRequest(request_id="r")
    request.mm_inputs.im_token_id = 9
    wire = serialize_with_pixels(request, sent)
    assert len(wire) < 200  # no pixel bytes inside
    parsed = GenerateRequest.FromString(wire)
    tensor = parsed.mm_inputs.pixel_values
    assert tensor.WhichOneof("payload") == "shm"
    assert list(tensor.shape) == [4, 6] and tensor.dtype == "float32"
    assert tensor.shm == segment.handle
    assert parsed.mm_inputs.im_token_id == 9  # merged with the rest of the batch
    np.testing.assert_array_equal(decode_tensor(tensor), np.ones((4, 6), dtype=np.float32))
