from __future__ import annotations

from pathlib import Path

import pytest

from tandem.media import MediaPolicy


def test_defaults_refuse_private_hosts_and_file_urls() -> None:
    policy = MediaPolicy()
    assert policy.allow_private_hosts is False
    assert policy.schemes() == ("http", "https", "data")
    assert policy.schemes_label() == "http,https,data"
    assert policy.max_bytes == 32 * 1024 * 1024


def test_file_scheme_appears_only_with_a_local_directory(tmp_path: Path) -> None:
    policy = MediaPolicy(allowed_local_path=tmp_path)
    assert policy.schemes() == ("http", "https", "data", "file")
    assert policy.schemes_label() == "http,https,data,file"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_bytes": 0},
        {"max_bytes": -1},
        {"connect_timeout_s": 0},
        {"read_timeout_s": -1.0},
        {"total_timeout_s": 0},
        {"max_redirects": -1},
        {"max_image_pixels": 0},
        {"allowed_local_path": Path("relative/dir")},
        {"allowed_domains": "example.test"},
        {"allowed_domains": ("",)},
        {"allowed_domains": ("http://example.test",)},
        {"allowed_domains": ("example.test/path",)},
        {"allowed_domains": ("*.example.test",)},
    ],
)
def test_invalid_settings_raise_value_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MediaPolicy(**kwargs)  # type: ignore[arg-type]


def test_domains_are_normalised() -> None:
    policy = MediaPolicy(allowed_domains=(" Images.Example.TEST. ", "bücher.example.test"))
    assert policy.allowed_domains == ("images.example.test", "xn--bcher-kva.example.test")


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("images.example.test", True),
        ("cdn.images.example.test", True),
        ("images.example.test.", True),
        ("badimages.example.test", False),
        ("images.example.test.evil.test", False),
        ("example.test", False),
    ],
)
def test_domain_matching_is_exact_or_dot_suffix(host: str, allowed: bool) -> None:
    policy = MediaPolicy(allowed_domains=("images.example.test",))
    assert policy.domain_allowed(host) is allowed


def test_empty_allow_list_allows_any_domain() -> None:
    assert MediaPolicy().domain_allowed("anything.example.test")


def test_policy_is_frozen() -> None:
    policy = MediaPolicy()
    with pytest.raises(AttributeError):
        policy.max_bytes = 1  # type: ignore[misc]
