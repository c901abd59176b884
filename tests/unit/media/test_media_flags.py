"""The media flags shared by `tandem gateway` and `tandem worker` build the policy they name."""

from __future__ import annotations

import argparse

import pytest

from tandem.media.flags import add_media_flags, media_policy_from_args
from tandem.media.policy import MediaPolicy, MiB


def parse(*argv: str) -> MediaPolicy:
    parser = argparse.ArgumentParser()
    add_media_flags(parser)
    return media_policy_from_args(parser.parse_args(list(argv)))


def test_defaults_are_the_policy_defaults() -> None:
    assert parse() == MediaPolicy()


def test_every_limit_flag_reaches_the_policy() -> None:
    policy = parse(
        "--mm-max-media-mb", "1.5",
        "--mm-fetch-connect-timeout-secs", "0.5",
        "--mm-fetch-read-timeout-secs", "2",
        "--mm-fetch-timeout-secs", "7",
        "--mm-max-redirects", "0",
        "--mm-max-image-pixels", "1000000",
    )  # fmt: skip
    assert policy.max_bytes == int(1.5 * MiB)
    assert (policy.connect_timeout_s, policy.read_timeout_s, policy.total_timeout_s) == (0.5, 2, 7)
    assert policy.max_redirects == 0
    assert policy.max_image_pixels == 1_000_000


def test_video_flags_reach_the_policy() -> None:
    policy = parse(
        "--mm-max-video-mb", "3",
        "--mm-max-video-seconds", "30",
        "--mm-video-fps", "0.5",
        "--mm-max-video-frames", "16",
    )  # fmt: skip
    assert policy.max_video_bytes == 3 * MiB and policy.max_video_seconds == 30
    assert (policy.video_fps, policy.max_video_frames) == (0.5, 16)
    assert policy.for_video().max_bytes == 3 * MiB and policy.max_bytes == MediaPolicy().max_bytes
    defaults = parse()
    assert (defaults.video_fps, defaults.max_video_frames) == (None, None)  # the processor's


@pytest.mark.parametrize(
    "argv",
    [
        ("--mm-max-media-mb", "0"),
        ("--mm-max-media-mb", "-1"),
        ("--mm-fetch-timeout-secs", "0"),
        ("--mm-fetch-read-timeout-secs", "soon"),
        ("--mm-max-redirects", "-1"),
        ("--mm-max-redirects", "100"),
        ("--mm-max-image-pixels", "0"),
        ("--mm-max-video-mb", "0"),
        ("--mm-max-video-seconds", "-5"),
        ("--mm-video-fps", "0"),
        ("--mm-max-video-frames", "1"),
    ],
)
def test_nonsense_values_are_refused_by_the_parser(
    argv: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse(*argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err
