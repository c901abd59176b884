"""Embedded workers in separate processes: the PD handoff gives the aggregated tokens.

Every worker here is a real `tandem worker` process on 127.0.0.1 running real
forward passes; the KV really moves over the side channel between processes.
The requests are sent as a gateway would send them (media_refs on the prefill
leg, the identity or hashes-only form on the decode leg).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.wire.proto import GenerateRequest
from tandem.wire.requests import apply_media_identity, clone_without_mm, clone_without_mm_pixels

from .gateway_probe import eventually
from .processes import Proc, start_all
from .wire_helpers import PREFILL_TAG, chat_prompt_ids, generate, image_data_url, request, stats

PREFILL_LEASE_S = 3.0  # llava-prefill's lease
SHORT_LEASE = ["--kv-lease-secs", str(PREFILL_LEASE_S)]
WORKERS = {
    "qwen-both": ["--model", "tiny-qwen3-vl", "--role", "both"],
    "qwen-prefill": ["--model", "tiny-qwen3-vl", "--role", "prefill"],
    "qwen-decode": ["--model", "tiny-qwen3-vl", "--role", "decode"],
    "llava-both": ["--model", "tiny-llava-1.5", "--role", "both"],
    "llava-prefill": ["--model", "tiny-llava-1.5", "--role", "prefill", *SHORT_LEASE],
    "llava-decode": ["--model", "tiny-llava-1.5", "--role", "decode"],
    "llava-lmo": ["--model", "tiny-llava-1.5", "--role", "decode", "--language-model-only"],
}
MODELS = {"qwen": "tiny-qwen3-vl", "llava": "tiny-llava-1.5"}


@pytest.fixture(scope="module")
def workers(model_cache: Path):
    procs = start_all([["worker", *args] for args in WORKERS.values()])
    yield dict(zip(WORKERS, procs, strict=True))
    for proc in procs:
        proc.stop()


def model_dir(model_cache: Path, family: str) -> Path:
    from tandem.engine.builtin import resolve_model

    return resolve_model(MODELS[family])


async def prefill(proc: Proc, leg: GenerateRequest):
    leg = GenerateRequest.FromString(leg.SerializeToString())
    leg.sampling_params.max_tokens = 1
    leg.sampling_params.ignore_eos = True
    leg.kv_transfer_params_json = PREFILL_TAG
    out = await generate(proc.address, leg)
    assert out.complete.kv_transfer_params_json, "prefill answered no KV params"
    return out.complete


async def pd_tokens(workers, family: str, decode: str, base: GenerateRequest, form: str):
    """Run base through prefill + decode in the given decode-leg form; return decode tokens."""
    done = await prefill(workers[f"{family}-prefill"], base)
    leg = clone_without_mm_pixels(base)
    if base.HasField("media_refs"):
        assert done.HasField("media_identity")
        assert apply_media_identity(leg, done.media_identity)
    if form == "hashes":
        leg = clone_without_mm(leg)
    leg.kv_transfer_params_json = done.kv_transfer_params_json
    return (await generate(workers[decode].address, leg)).tokens


@pytest.mark.parametrize("family", ["qwen", "llava"])
@pytest.mark.parametrize("n_images", [0, 1, 2])
async def test_pd_matches_aggregated(workers, model_cache, family: str, n_images: int) -> None:
    ids = chat_prompt_ids(model_dir(model_cache, family), "What is in the picture?", n_images)
    urls = [image_data_url(seed) for seed in range(n_images)]
    base = request(f"pd-{family}-{n_images}", ids, urls, max_tokens=8)
    aggregated = (await generate(workers[f"{family}-both"].address, base)).tokens
    assert len(aggregated) >= 1
    assert await pd_tokens(workers, family, f"{family}-decode", base, "identity") == aggregated


@pytest.mark.parametrize("n_images", [0, 1, 2])
async def test_language_model_only_decode_with_hashes(workers, model_cache, n_images) -> None:
    ids = chat_prompt_ids(model_dir(model_cache, "llava"), "Describe it.", n_images)
    base = request(f"lmo-{n_images}", ids, [image_data_url(10 + s) for s in range(n_images)])
    aggregated = (await generate(workers["llava-both"].address, base)).tokens
    assert await pd_tokens(workers, "llava", "llava-lmo", base, "hashes") == aggregated


async def test_same_text_different_images_do_not_alias(workers, model_cache) -> None:
    """Hashes-only legs on one language-model-only decode worker: each answers its own image.

    The control sends the second request without its hashes (no salt): then the decode
    worker's prefix cache serves the first image's KV and the answer is the first image's.
    """
    ids = chat_prompt_ids(model_dir(model_cache, "llava"), "Is this a dog?", 1)
    dog, pug = image_data_url(101), image_data_url(202)
    answers = {}
    for name, url in (("dog", dog), ("pug", pug)):
        base = request(f"alias-{name}", ids, [url], max_tokens=6)
        answers[name] = (await generate(workers["llava-both"].address, base)).tokens
        assert await pd_tokens(workers, "llava", "llava-lmo", base, "hashes") == answers[name]
    assert answers["dog"] != answers["pug"], "the model must be input-sensitive"

    # Control: the same two requests with their hashes removed carry no salt, so the
    # second one is served the first one's KV from the decode worker's prefix cache.
    unsalted = {}
    for name, url in (("dog", dog), ("pug", pug)):
        base = request(f"alias-unsalted-{name}", ids, [url], max_tokens=6)
        done = await prefill(workers["llava-prefill"], base)
        leg = clone_without_mm_pixels(base)
        assert apply_media_identity(leg, done.media_identity)
        leg = clone_without_mm(leg)
        leg.ClearField("mm_inputs")
        leg.kv_transfer_params_json = done.kv_transfer_params_json
        unsalted[name] = await generate(workers["llava-lmo"].address, leg)
    assert unsalted["dog"].tokens == answers["dog"]
    assert unsalted["pug"].complete.cached_tokens > 0
    assert unsalted["pug"].tokens == answers["dog"], "without the salt the pug gets the dog's KV"


async def test_worker_side_media_processed_once(workers, model_cache) -> None:
    ids = chat_prompt_ids(model_dir(model_cache, "qwen"), "Two pictures.", 2)
    base = request("once", ids, [image_data_url(7), image_data_url(8)])
    before_p = (await stats(workers["qwen-prefill"].address))["media_items_processed"]
    before_d = (await stats(workers["qwen-decode"].address))["media_items_processed"]
    await pd_tokens(workers, "qwen", "qwen-decode", base, "identity")
    after_p = (await stats(workers["qwen-prefill"].address))["media_items_processed"]
    after_d = (await stats(workers["qwen-decode"].address))["media_items_processed"]
    assert (after_p - before_p, after_d - before_d) == (2, 0)
    assert workers["qwen-decode"].count("preprocessed_mm=True, media_refs=0") >= 1


async def test_handoff_releases_kv_and_leases_expire(workers, model_cache) -> None:
    prefill_worker = workers["llava-prefill"]
    ids = chat_prompt_ids(model_dir(model_cache, "llava"), "Lease test.", 1)
    base = request("lease", ids, [image_data_url(5)])
    await pd_tokens(workers, "llava", "llava-decode", base, "identity")
    assert (await stats(prefill_worker.address))["held_kv_blocks"] == 0  # pulled = released
    await prefill(prefill_worker, request("lease-orphan", ids, [image_data_url(5)]))
    assert (await stats(prefill_worker.address))["held_kv_blocks"] > 0

    async def lease_expired() -> bool:
        now = await stats(prefill_worker.address)
        return now["held_kv_blocks"] == 0 and now["kv_expired"] >= 1

    # Polled until it holds, bounded as the fixed wait was: the lease plus 1.5 s (the
    # worker sweeps expired leases once a second).
    await eventually(lease_expired, timeout=PREFILL_LEASE_S + 1.5)
    after = await stats(prefill_worker.address)
    assert after["held_kv_blocks"] == 0 and after["kv_expired"] >= 1


async def test_failed_decode_leg_releases_prefill_kv(workers, model_cache) -> None:
    ids = chat_prompt_ids(model_dir(model_cache, "llava"), "Fail early.", 0)
    base = request("early-fail", ids)
    done = await prefill(workers["llava-prefill"], base)
    assert (await stats(workers["llava-prefill"].address))["held_kv_blocks"] > 0
    leg = clone_without_mm_pixels(base)
    leg.kv_transfer_params_json = done.kv_transfer_params_json
    leg.sampling_params.top_p = 5.0  # invalid: refused before any KV is pulled
    import grpc

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(workers["llava-decode"].address, leg)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await stats(workers["llava-prefill"].address))["held_kv_blocks"] == 0
    params = json.loads(done.kv_transfer_params_json)
    assert params["do_remote_prefill"] is True and params["transfer_id"]


async def test_abort_stops_generation_and_frees_kv(workers, model_cache) -> None:
    """An Abort mid-generation ends the stream with finish_reason "abort" and frees the
    KV the request was holding for a decode worker."""
    import grpc

    from tandem.wire.proto import pb, pb_grpc

    address = workers["llava-prefill"].address
    ids = chat_prompt_ids(model_dir(model_cache, "llava"), "Talk for a long time.", 1)
    # ignore_eos: the trained model's reply would end within a few tokens, before the Abort.
    req = request("abort-me", ids, [image_data_url(6)], max_tokens=3000, ignore_eos=True)
    req.kv_transfer_params_json = PREFILL_TAG
    req.stream = True
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        call = stub.Generate(req, timeout=60)
        first = await call.read()
        assert first.HasField("chunk")
        assert (await stats(address))["held_kv_blocks"] > 0
        await stub.Abort(pb.AbortRequest(request_ids=["abort-me"]), timeout=10)
        last = None
        while (frame := await call.read()) is not grpc.aio.EOF:
            last = frame
    assert last is not None and last.complete.finish_reason == "abort"
    assert len(last.complete.output_ids) < 3000
    after = await stats(address)
    assert after["held_kv_blocks"] == 0 and after["requests_by_outcome"].get("abort", 0) >= 1
