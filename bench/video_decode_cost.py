"""Worst-case video decode CPU per request under a media policy (docs/operations.md).

A video is decoded from its first frame to its last (media/video.py), so its decode CPU is
the frames the policy lets through times the cost of one frame at their size. For each
frame size this encodes a short H.264 clip whose every block moves (a textured ramp
scrolling sideways, CABAC, deblocking and B-frames on: libx264 ``veryfast``), decodes it
with Tandem's own ``decode_frames`` on one thread, as the gateway does, and multiplies the
CPU per frame by the frames the policy admits at that size
(``min(max_video_frames_decoded, max_video_pixels_decoded // (width * height))``).

    .venv/bin/python -m bench.video_decode_cost [--frames 24] [--sizes 640x480 1920x1080 ...]

Prints a Markdown table; numbers, not assertions. The clip must also fit the byte cap at
that frame count (its bytes per frame are printed): more bytes per frame would cost more.
"""

from __future__ import annotations

import argparse
import io
import time
from fractions import Fraction

import numpy as np

from tandem.media import MediaPolicy
from tandem.media.video import DecodeGuard, decode_frames, probe_video


def moving_clip(width: int, height: int, frames: int, frame_bytes: int, fps: int = 30) -> bytes:
    """A textured ramp scrolling sideways under fresh noise, at ``frame_bytes`` per frame
    (x264's average-bitrate mode): every block moves and carries a residual."""
    import av

    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 180, width, dtype=np.float32)[None, :, None]
    base = (ramp + rng.integers(0, 56, (height, width, 3), dtype=np.uint8)).astype(np.uint8)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps, 1))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.bit_rate = frame_bytes * 8 * fps
        stream.options = {"preset": "veryfast", "threads": "2"}
        for k in range(frames):
            noise = rng.integers(0, 20, (height, width, 1), dtype=np.uint8)
            picture = np.roll(base, 3 * k, axis=1) + noise
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts = k
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def inter_frame_bytes(clip: bytes) -> float:
    """Mean size of the clip's packets other than key frames."""
    import av

    with av.open(io.BytesIO(clip)) as container:
        sizes = [
            packet.size
            for packet in container.demux(video=0)
            if packet.size and not packet.is_keyframe
        ]
    return sum(sizes) / len(sizes)


def decode_cpu(clip: bytes, last: int, policy: MediaPolicy) -> float:
    """CPU seconds of ``decode_frames`` up to frame ``last`` (it stops there)."""
    header = probe_video(clip, policy)
    started = time.process_time()
    decode_frames(clip, [0, last], header, DecodeGuard(policy))
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=48, help="frames per measured clip")
    parser.add_argument(
        "--sizes", nargs="*", default=["640x480", "1920x1080", "3840x2160", "8192x8192"]
    )
    args = parser.parse_args()
    policy = MediaPolicy()
    print(
        "| frame size | CPU per frame | frames admitted | decode CPU per video "
        "| bytes per frame (the byte cap's share) |"
    )
    print("|---|---|---|---|---|")
    for size in args.sizes:
        width, height = (int(side) for side in size.split("x"))
        admitted = min(
            policy.max_video_frames_decoded, policy.max_video_pixels_decoded // (width * height)
        )
        share = policy.max_video_bytes // admitted
        clip = moving_clip(width, height, args.frames, share)
        # The second half's frames alone: opening the file and the key frame left out (an
        # admitted clip needs just one key frame, so they do not scale with its length).
        half = args.frames // 2
        cpu = decode_cpu(clip, args.frames - 1, policy) - decode_cpu(clip, half - 1, policy)
        per_frame = cpu / (args.frames - half)
        print(
            f"| {width}x{height} | {per_frame * 1000:.2f} ms | {admitted} "
            f"| {per_frame * admitted:.1f} s | {inter_frame_bytes(clip) / 1024:.0f} KiB "
            f"({share / 1024:.0f} KiB) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
