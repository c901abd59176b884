"""Fixtures for the gateway multimodal tests: a loopback image origin and the built-in models.

The models are the session's weightless built-in checkpoints (``qwen_meta_dir`` /
``llava_meta_dir``, tests/unit/conftest.py): the gateway reads their tokenizer, template
and processor files only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mm_gateway_models import Model
from mm_gateway_origin import ImageOrigin

from tandem.media import MediaPolicy

BUILTIN_DIR_FIXTURES = {"tiny-qwen3-vl": "qwen_meta_dir", "tiny-llava-1.5": "llava_meta_dir"}


@pytest.fixture(scope="session")
def _models(request: pytest.FixtureRequest) -> dict[str, Model]:
    return {
        name: Model(name, request.getfixturevalue(fixture))
        for name, fixture in BUILTIN_DIR_FIXTURES.items()
    }


@pytest.fixture(params=sorted(BUILTIN_DIR_FIXTURES))
def model(request: pytest.FixtureRequest, _models: dict[str, Model]) -> Model:
    """Each built-in model in turn."""
    return _models[request.param]


@pytest.fixture
def qwen(_models: dict[str, Model]) -> Model:
    return _models["tiny-qwen3-vl"]


@pytest.fixture
def llava(_models: dict[str, Model]) -> Model:
    return _models["tiny-llava-1.5"]


@pytest.fixture(scope="module")
def _origin_server() -> Iterator[ImageOrigin]:
    server = ImageOrigin().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def origin(_origin_server: ImageOrigin) -> ImageOrigin:
    """The loopback origin with an empty request log and no files."""
    with _origin_server.state.lock:
        _origin_server.state.requests.clear()
        _origin_server.state.files.clear()
        _origin_server.state.redirects.clear()
    return _origin_server


@pytest.fixture
def open_policy() -> MediaPolicy:
    """Loopback allowed: the test origin is on 127.0.0.1."""
    return MediaPolicy(allow_private_hosts=True)


@pytest.fixture
def strict_policy() -> MediaPolicy:
    """The production default: private and loopback hosts refused."""
    return MediaPolicy()
