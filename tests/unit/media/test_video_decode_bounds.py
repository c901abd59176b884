"""Video decode is bounded by work, not by the container's claims (issue 30, item 1).

The header is checked before decoding (frames, frames times pixels, the declared rate), and
a guard counts what the decoder is really fed, so a clip cannot decode more than the
policy's caps whatever it declares; a cancelled decode stops at its next frame.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time

import pytest
from video_clips import repeated_clip

from tandem.media import MediaPolicy, MediaTooLarge
from tandem.media.budget import ByteBudget, run_in_thread_holding
from tandem.media.flags import add_media_flags, media_policy_from_args
from tandem.media.video import DecodeCancelled, DecodeGuard, decode_frames, probe_video

# The issue's clip at a small size: 30 000 frames declaring 3000 fps "last" 10 s.
ISSUE_FRAMES, ISSUE_FPS = 30_000, 3000


def test_the_issue_clip_is_refused_from_its_header() -> None:
    clip = repeated_clip(ISSUE_FRAMES, ISSUE_FPS)
    started = time.process_time()
    with pytest.raises(MediaTooLarge, match="declares 3000 frames per second; at most 240"):
        probe_video(clip, MediaPolicy())
    # Even a trusted rate does not let 30 000 frames be decoded.
    with pytest.raises(MediaTooLarge, match="has 30000 frames; at most 18000 are decoded"):
        probe_video(clip, MediaPolicy(max_video_source_fps=5000))
    # A header read each time; decoding the clip costs about ten times this.
    assert time.process_time() - started < 0.5


def test_frames_times_pixels_are_bounded_before_decoding() -> None:
    clip = repeated_clip(300, 30)  # 10 s of 64x48
    assert probe_video(clip, MediaPolicy()).frames == 300  # the defaults admit it
    with pytest.raises(MediaTooLarge, match="300 frames of 64x48 pixels are more than"):
        probe_video(clip, MediaPolicy(max_video_pixels_decoded=299 * 64 * 48))
    with pytest.raises(MediaTooLarge, match="at most 299 are decoded"):
        probe_video(clip, MediaPolicy(max_video_frames_decoded=299))


def test_the_guard_stops_the_decode_at_the_bound() -> None:
    """A header that under-declares (here: admitted by a looser policy) cannot make the
    decoder go past the guard's cap: the packet over it is never decoded."""
    clip = repeated_clip(300, 30)
    header = probe_video(clip, MediaPolicy())
    guard = DecodeGuard(MediaPolicy(max_video_frames_decoded=50))
    with pytest.raises(MediaTooLarge, match="more than 50 frames to decode"):
        decode_frames(clip, [0, 299], header, guard)
    assert guard.packets == 51 and guard.frames_returned <= 50

    pixels = DecodeGuard(MediaPolicy(max_video_pixels_decoded=20 * 64 * 48))
    with pytest.raises(MediaTooLarge, match="more than 61440 pixels to decode"):
        decode_frames(clip, [0, 299], header, pixels)
    assert pixels.packets == 21


def test_frames_larger_than_the_pixel_cap_midway_are_refused() -> None:
    clip = repeated_clip(30, 30)
    header = probe_video(clip, MediaPolicy())
    guard = DecodeGuard(MediaPolicy(max_image_pixels=64 * 47))
    with pytest.raises(MediaTooLarge, match="frames of 64x48 pixels midway"):
        decode_frames(clip, [0, 29], header, guard)
    assert guard.frames_returned == 0  # refused before its first packet was decoded


def test_a_guarded_decode_within_the_bounds_is_unchanged() -> None:
    clip = repeated_clip(300, 30)
    header = probe_video(clip, MediaPolicy())
    guard = DecodeGuard(MediaPolicy())
    frames = decode_frames(clip, [0, 150, 299], header, guard)
    assert frames.shape == (3, 48, 64, 3)
    assert (frames == decode_frames(clip, [0, 150, 299], header)).all()
    assert guard.frames == 300 and guard.pixels == 300 * 64 * 48


def test_a_cancelled_decode_stops_at_its_next_frame() -> None:
    clip = repeated_clip(300, 30)
    header = probe_video(clip, MediaPolicy())
    cancel = threading.Event()

    class CancelAfter20(DecodeGuard):
        __slots__ = ()

        def frame(self, width: int, height: int) -> None:
            if self.frames_returned == 20:
                cancel.set()  # as the request's task does from the event loop
            super().frame(width, height)

    guard = CancelAfter20(MediaPolicy(), cancel)
    with pytest.raises(DecodeCancelled, match="request ended"):
        decode_frames(clip, [0, 299], header, guard)
    assert guard.frames_returned == 21 and guard.packets < 40


class _Slow(DecodeGuard):
    """2 ms per frame: the 3000-frame clip below would take 6 s without cancellation."""

    __slots__ = ()
    started = threading.Event()

    def frame(self, width: int, height: int) -> None:
        _Slow.started.set()
        time.sleep(0.002)
        super().frame(width, height)


async def test_cancelling_the_caller_stops_the_thread_and_then_releases_the_charge() -> None:
    clip = repeated_clip(3000, 30)
    header = probe_video(clip, MediaPolicy())
    budget = ByteBudget(1000)
    cancel = threading.Event()
    guard = _Slow(MediaPolicy(), cancel)
    _Slow.started.clear()
    caller = asyncio.ensure_future(
        run_in_thread_holding(
            budget.acquire(800),
            lambda: decode_frames(clip, [0, 2999], header, guard),
            cancel=cancel,
        )
    )
    assert await asyncio.to_thread(_Slow.started.wait, 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cancel.is_set()
    for _ in range(100):  # the thread ends within a frame or so, not after 3000 frames
        if not budget.used:
            break
        await asyncio.sleep(0.01)
    assert budget.used == 0
    assert guard.frames_returned < 1000


def _parse(*argv: str) -> MediaPolicy:
    parser = argparse.ArgumentParser()
    add_media_flags(parser)
    return media_policy_from_args(parser.parse_args(list(argv)))


def test_the_decode_flags_reach_the_policy() -> None:
    defaults = _parse()
    assert defaults == MediaPolicy()
    assert defaults.max_video_frames_decoded == 18_000
    assert defaults.max_video_pixels_decoded == 18_000 * 1920 * 1080
    assert defaults.max_video_source_fps == 240
    policy = _parse(
        "--mm-max-video-frames-decoded", "900",
        "--mm-max-video-megapixels-decoded", "2.5",
        "--mm-max-video-source-fps", "960",
    )  # fmt: skip
    assert policy.max_video_frames_decoded == 900
    assert policy.max_video_pixels_decoded == 2_500_000
    assert policy.max_video_source_fps == 960


@pytest.mark.parametrize(
    "argv",
    [
        ("--mm-max-video-frames-decoded", "0"),
        ("--mm-max-video-megapixels-decoded", "-1"),
        ("--mm-max-video-source-fps", "0"),
    ],
)
def test_nonsense_decode_bounds_are_refused(argv: tuple[str, str]) -> None:
    with pytest.raises(SystemExit):
        _parse(*argv)
    field = {
        "--mm-max-video-frames-decoded": "max_video_frames_decoded",
        "--mm-max-video-megapixels-decoded": "max_video_pixels_decoded",
        "--mm-max-video-source-fps": "max_video_source_fps",
    }[argv[0]]
    with pytest.raises(ValueError, match=field):
        MediaPolicy(**{field: 0})
