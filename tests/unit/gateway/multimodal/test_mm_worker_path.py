"""Worker path (``media_refs``): verbatim refs, and the gateway refusing before forwarding
every URL the router path would refuse (docs/pd-contract.md §5) — without fetching anything."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from mm_gateway_models import Model
from mm_gateway_origin import ImageOrigin, data_url, png_bytes

from tandem.errors import TandemError
from tandem.gateway.backends.vllm.media_refs import build_media_refs
from tandem.gateway.multimodal import plan_images, process_images
from tandem.media import MediaPolicy
from tandem.wire.proto import Modality

PNG = png_bytes((24, 24), seed=3)


async def _refs_error(
    model: Model, urls: list[str], policy: MediaPolicy, resolver: object = None
) -> TandemError:
    with pytest.raises(TandemError) as info:
        await build_media_refs(
            plan_images(urls),
            model.prompt_ids(urls),
            model.info,
            policy,
            resolver=resolver,  # type: ignore[arg-type]
        )
    assert info.value.status == 400
    return info.value


async def test_refs_are_verbatim_in_order_and_nothing_is_fetched(
    qwen: Model, origin: ImageOrigin, open_policy: MediaPolicy
) -> None:
    urls = [origin.serve("/b.png", PNG), data_url(PNG), origin.url("/A.png?x=1#frag")]
    refs = await build_media_refs(plan_images(urls), qwen.prompt_ids(urls), qwen.info, open_policy)
    assert [(item.modality, item.url) for item in refs.items] == [(Modality.IMAGE, u) for u in urls]
    assert origin.state.paths() == []


async def test_loopback_is_refused_before_forwarding(
    qwen: Model, origin: ImageOrigin, strict_policy: MediaPolicy
) -> None:
    for host in ("127.0.0.1", "localhost"):
        url = origin.serve("/a.png", PNG).replace("127.0.0.1", host)
        err = await _refs_error(qwen, [data_url(PNG), url], strict_policy)
        assert err.code == "media_url_refused", host
    assert origin.state.paths() == []


async def test_a_name_resolving_to_loopback_is_refused(qwen: Model) -> None:
    async def resolver(host: str, port: int) -> Sequence[str]:
        return ["127.0.0.1"]

    err = await _refs_error(qwen, ["https://media.test/a.png"], MediaPolicy(), resolver)
    assert err.code == "media_url_refused"
    # The same name is accepted where the policy allows private hosts.
    refs = await build_media_refs(
        plan_images(["https://media.test/a.png"]),
        qwen.prompt_ids(["x"]),
        qwen.info,
        MediaPolicy(allow_private_hosts=True),
        resolver=resolver,
    )
    assert len(refs.items) == 1


async def test_data_url_over_the_cap_is_media_ref_too_large(qwen: Model) -> None:
    url = data_url(PNG)
    err = await _refs_error(qwen, [url], MediaPolicy(max_bytes=len(PNG) - 16))
    assert err.code == "media_ref_too_large"
    assert url.partition(",")[2][:16] not in err.message  # the payload is never echoed back
    await build_media_refs(
        plan_images([url]), qwen.prompt_ids([url]), qwen.info, MediaPolicy(max_bytes=len(PNG))
    )


async def test_anchor_mismatch_is_checked_before_any_url(qwen: Model) -> None:
    async def resolver(host: str, port: int) -> Sequence[str]:
        raise AssertionError("no URL may be vetted for a prompt that does not match")

    with pytest.raises(TandemError) as info:
        await build_media_refs(
            plan_images(["https://media.test/a.png"]),
            qwen.prompt_ids(["x", "y"]),
            qwen.info,
            MediaPolicy(),
            resolver=resolver,
        )
    assert info.value.code == "multimodal_prompt_contract_mismatch"


async def test_file_urls_follow_the_allowed_directory(qwen: Model, tmp_path: Path) -> None:
    inside, outside = tmp_path / "media", tmp_path / "other"
    inside.mkdir()
    outside.mkdir()
    (inside / "a.png").write_bytes(PNG)
    (outside / "b.png").write_bytes(PNG)
    policy = MediaPolicy(allowed_local_path=inside)
    good = (inside / "a.png").as_uri()
    refs = await build_media_refs(plan_images([good]), qwen.prompt_ids([good]), qwen.info, policy)
    assert refs.items[0].url == good
    for url in ((outside / "b.png").as_uri(), (inside / ".." / "other" / "b.png").as_uri()):
        assert (await _refs_error(qwen, [url], policy)).code == "media_url_refused"
    assert (await _refs_error(qwen, [good], MediaPolicy())).code == "media_url_refused"


# URLs that the router path refuses, each with the policy it is refused under. The worker
# path must refuse every one of them too, with the same code (the size cap aside, which has
# its own worker-path code).
def _bad_urls(origin: ImageOrigin, tmp_path: Path) -> list[tuple[str, MediaPolicy]]:
    strict = MediaPolicy()
    open_ = MediaPolicy(allow_private_hosts=True)
    served = origin.serve("/a.png", PNG)
    return [
        (served, strict),
        (served.replace("127.0.0.1", "localhost"), strict),
        (served, MediaPolicy(allow_private_hosts=True, allowed_domains=("media.test",))),
        ("ftp://media.test/a.png", open_),
        ("gopher://media.test/a.png", open_),
        ((tmp_path / "a.png").as_uri(), open_),
        ("data:image/png,%89PNG", open_),  # not base64
        ("data:image/png;base64", open_),  # no payload separator
        ("http://user:secret@media.test/a.png", open_),
        ("not a url", open_),
    ]


async def test_worker_path_refuses_what_the_router_path_refuses(
    qwen: Model, origin: ImageOrigin, tmp_path: Path
) -> None:
    (tmp_path / "a.png").write_bytes(PNG)
    for url, policy in _bad_urls(origin, tmp_path):
        with pytest.raises(TandemError) as routed:
            await process_images(plan_images([url]), qwen.info, qwen.processor, policy)
        forwarded = await _refs_error(qwen, [url], policy)
        assert routed.value.status == 400, url
        assert forwarded.code == routed.value.code == "media_url_refused", url
    assert origin.state.paths() == []
