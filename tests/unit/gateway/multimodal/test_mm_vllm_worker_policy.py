"""One media policy in front of workers that do not enforce it (docs/operations.md, "Media URLs
and vLLM workers"), and image anchors checked before any fetch — through the gateway's real
media stage (``prepare_media``) over a loopback origin.

The workers here are plain ``Worker`` records with the labels a registry would give them
(the stage only reads labels); the gRPC side, with real Tandem workers, is covered by
tests/integration/test_media_policy_vllm_workers.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mm_gateway_models import Model
from mm_gateway_origin import ConnectionCounter, ImageOrigin, data_url, png_bytes

from tandem.errors import TandemError
from tandem.gateway.backends.vllm import inline_refs
from tandem.gateway.backends.vllm.backend import VllmBackend
from tandem.gateway.backends.vllm.inline_refs import gateway_must_fetch
from tandem.gateway.config import GatewayConfig
from tandem.gateway.context import RequestContext
from tandem.gateway.dispatch.selection import candidates
from tandem.gateway.endpoints.chat.schema import ChatCompletionRequest
from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.media import prepare_media
from tandem.gateway.pipeline.prompt import build_prompt
from tandem.gateway.workers.worker import Worker
from tandem.media import MediaPolicy
from tandem.wire.worker_marker import TANDEM_WORKER_LABEL

PNG = png_bytes((24, 24), seed=5)
# The origin is reached as "localhost" and allowed by the domain allow-list; the refused
# listener is reached as 127.0.0.1, which the allow-list refuses: both on loopback.
POLICY = MediaPolicy(allow_private_hosts=True, allowed_domains=("localhost",))

BACKEND = VllmBackend()


@pytest.fixture
def refused() -> Iterator[ConnectionCounter]:
    counter = ConnectionCounter().start()
    try:
        yield counter
    finally:
        counter.stop()


@pytest.fixture(scope="module")
def handle(request: pytest.FixtureRequest) -> ModelHandle:
    return ModelHandle.from_dir(request.getfixturevalue("qwen_meta_dir"), "tiny-qwen3-vl")


def worker(
    name: str,
    role: str = "regular",
    *,
    tandem: bool = False,
    schemes: str = "http,https,data",
    processor: str = "inprocess",
) -> Worker:
    """A worker as registered: vLLM-like unless ``tandem`` (the marker label)."""
    labels = {"mm_processor": processor, "mm_media_ref_schemes": schemes}
    labels = {k: v for k, v in labels.items() if v}
    if tandem:
        labels[TANDEM_WORKER_LABEL] = "0.1.0"
    return Worker(url=f"{name}:1", role=role, labels=labels, model_id="tiny-qwen3-vl")  # type: ignore[arg-type]


def config(
    mode: str = "worker", *, pd: bool = False, policy: MediaPolicy = POLICY
) -> GatewayConfig:
    extra = {"pd_disaggregation": True, "prefill_urls": ["p:1"], "decode_urls": ["d:1"]}
    return GatewayConfig(mm_processing=mode, media=policy, **(extra if pd else {}))


def context(handle: ModelHandle, urls: list[str], text: str = "What is this?") -> RequestContext:
    parts: list[dict[str, object]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": text})
    body = ChatCompletionRequest.model_validate(
        {"model": "tiny-qwen3-vl", "messages": [{"role": "user", "content": parts}]}
    )
    ctx = RequestContext("chat", "req-1", body.generation(), handle)
    build_prompt(ctx)
    BACKEND.build_request(ctx)
    return ctx


async def _refused(ctx: RequestContext, cfg: GatewayConfig, workers: list[Worker]) -> TandemError:
    with pytest.raises(TandemError) as info:
        await prepare_media(ctx, cfg, workers, backend=BACKEND)
    assert info.value.status == 400
    return info.value


async def test_a_redirect_to_a_refused_address_never_reaches_a_vllm_worker(
    handle: ModelHandle, origin: ImageOrigin, refused: ConnectionCounter
) -> None:
    url = origin.redirect("/hop.png", refused.url()).replace("127.0.0.1", "localhost")
    ctx = context(handle, [url])
    err = await _refused(ctx, config(), [worker("vllm")])
    assert err.code == "media_url_refused"
    assert origin.state.paths() == ["/hop.png"]  # the gateway fetched the first hop itself
    assert refused.connections == 0


@pytest.mark.parametrize(
    ("pd", "workers"),
    [
        (False, [worker("vllm")]),
        (False, [worker("tandem", tandem=True), worker("vllm")]),
        (True, [worker("p", "prefill", tandem=True), worker("d", "decode")]),
        (True, [worker("p", "prefill"), worker("d", "decode", tandem=True)]),
    ],
    ids=["aggregated", "mixed-pool", "pd-vllm-decode", "pd-vllm-prefill"],
)
async def test_any_vllm_leg_gets_data_urls_for_every_leg(
    handle: ModelHandle, origin: ImageOrigin, pd: bool, workers: list[Worker]
) -> None:
    inline = data_url(PNG, "image/png")
    urls = [origin.serve("/a.png", PNG).replace("127.0.0.1", "localhost"), inline]
    ctx = context(handle, urls)
    await prepare_media(ctx, config(pd=pd), workers, backend=BACKEND)
    assert [item.url for item in ctx.wire.media_refs.items] == [inline, inline]
    assert origin.state.paths() == ["/a.png"]
    # The selection checks see what is forwarded: data: refs only.
    assert ctx.media_urls == ["data:image/png;base64,", inline]
    assert not ctx.refs_for_tandem_workers_only


@pytest.mark.parametrize("pd", [False, True])
async def test_tandem_workers_receive_the_url_and_fetch_it_themselves(
    handle: ModelHandle, origin: ImageOrigin, pd: bool
) -> None:
    url = origin.serve("/a.png", PNG).replace("127.0.0.1", "localhost")
    workers = [
        worker("p", "prefill" if pd else "regular", tandem=True),
        worker("d", "decode" if pd else "regular", tandem=True),
        worker("text-only", processor=""),  # takes no media_refs: never selected for them
    ]
    ctx = context(handle, [url])
    await prepare_media(ctx, config(pd=pd), workers, backend=BACKEND)
    assert [item.url for item in ctx.wire.media_refs.items] == [url]
    assert origin.state.paths() == []
    assert ctx.refs_for_tandem_workers_only


def test_selection_hands_urls_only_to_tandem_workers(handle: ModelHandle) -> None:
    class Registry:
        """Stands in for WorkerRegistry: ``candidates`` reads only ``available``."""

        def available(self, role: str, model_id: str) -> list[Worker]:
            return [worker("tandem", tandem=True), worker("vllm")]

    ctx = context(handle, ["http://localhost/a.png"])
    ctx.mm_path = "worker"
    every = candidates(Registry(), ctx, "regular", set())  # type: ignore[arg-type]
    assert [w.url for w in every] == ["tandem:1", "vllm:1"]
    ctx.refs_for_tandem_workers_only = True
    only = candidates(Registry(), ctx, "regular", set())  # type: ignore[arg-type]
    assert [w.url for w in only] == ["tandem:1"]


def test_the_decision_counts_only_workers_that_take_media_refs() -> None:
    assert not gateway_must_fetch([])
    assert not gateway_must_fetch([worker("t", tandem=True), worker("lm", processor="")])
    assert gateway_must_fetch([worker("t", tandem=True), worker("v", "decode")])


@pytest.mark.parametrize("pd", [False, True])
async def test_workers_without_data_refs_get_a_clear_400_before_any_fetch(
    handle: ModelHandle, origin: ImageOrigin, pd: bool
) -> None:
    url = origin.serve("/a.png", PNG).replace("127.0.0.1", "localhost")
    if pd:
        workers = [worker("p", "prefill", tandem=True), worker("d", "decode", schemes="http")]
    else:
        workers = [worker("v1", schemes="http,https"), worker("v2", schemes="https")]
    err = await _refused(context(handle, [url]), config(pd=pd), workers)
    assert err.code == "media_ref_scheme_not_accepted"
    assert "data: URLs" in err.message
    assert origin.state.paths() == []
    # One worker of the role that takes data: refs is enough to go ahead (selection decides).
    ctx = context(handle, [url])
    all_workers = [*workers, worker("v3", "decode" if pd else "regular")]
    await prepare_media(ctx, config(pd=pd), all_workers, backend=BACKEND)
    assert ctx.wire.media_refs.items[0].url.startswith("data:image/png;base64,")


async def test_inlined_refs_are_capped_to_one_worker_request(
    handle: ModelHandle, origin: ImageOrigin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inline_refs, "MAX_INLINE_REQUEST_BYTES", len(PNG))
    url = origin.serve("/a.png", PNG).replace("127.0.0.1", "localhost")
    err = await _refused(context(handle, [url]), config(), [worker("vllm")])
    assert err.code == "media_ref_too_large"


@pytest.mark.parametrize(
    ("mode", "workers"),
    [("router", []), ("worker", [worker("vllm")]), ("worker", [worker("t", tandem=True)])],
    ids=["router", "worker-vllm", "worker-tandem"],
)
async def test_anchor_mismatch_is_refused_before_any_fetch(
    handle: ModelHandle,
    origin: ImageOrigin,
    open_policy: MediaPolicy,
    qwen: Model,
    mode: str,
    workers: list[Worker],
) -> None:
    url = origin.serve("/a.png", PNG)
    anchor = qwen.info.family.anchor_token
    ctx = context(handle, [url], text=f"{anchor} is a second placeholder")
    err = await _refused(ctx, config(mode, policy=open_policy), workers)
    assert err.code == "multimodal_prompt_contract_mismatch"
    assert origin.state.paths() == []
