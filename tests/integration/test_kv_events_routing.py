"""Routing from the workers' own KV events (issue 36) with real Tandem workers.

Two aggregated tiny-qwen3-vl workers (W0, W1), two ``--policy kv_events`` gateway replicas
over both, and one "seeding" gateway per worker (over that worker alone) to put a prompt's
KV on the worker a test chooses, through no routing gateway at all. Which worker served a
request is read from the workers' own counters (``prefix_cache_lookups``), what it found
cached from ``prefix_cache_hit_tokens``; what a gateway's index holds from its
``tandem_kv_event_blocks`` series.
"""

from __future__ import annotations

import asyncio
import base64
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .gateway_probe import eventually, metric
from .image_server import png_bytes
from .processes import Proc, start_all
from .wire_helpers import stats

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-vl"
ROUTER = ["--mm-processing", "router", "--health-check-interval-secs", "1"]


@pytest.fixture(scope="module")
def stack(model_cache: Path) -> Iterator[dict[str, list[Proc]]]:
    workers = start_all([["worker", "--model", MODEL] for _ in range(2)])
    urls = [w.address for w in workers]
    gateways = start_all(
        [
            *(["gateway", "--port", "0", *ROUTER, "--policy", "kv_events",
               "--worker-urls", *urls] for _ in range(2)),
            *(["gateway", "--port", "0", *ROUTER, "--worker-urls", url] for url in urls),
        ]
    )  # fmt: skip
    yield {"workers": workers, "routers": gateways[:2], "seeders": gateways[2:]}
    for proc in gateways + workers:
        proc.stop()


def image(seed: int) -> dict:
    url = "data:image/png;base64," + base64.b64encode(png_bytes(seed)).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def user(seeds: list[int], text: str) -> dict:
    return {"role": "user", "content": [*(image(s) for s in seeds), {"type": "text", "text": text}]}


async def chat(gateway: Proc, messages: list[dict]) -> str:
    body = {"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0}
    async with httpx.AsyncClient(timeout=60) as http:
        reply = await http.post(f"{gateway.address}/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"] or ""


async def served(workers: list[Proc], gateway: Proc, messages: list[dict]) -> tuple[int, int]:
    """Send one request; (index of the worker that prefilled it, tokens it found cached)."""
    before = [await stats(w.address) for w in workers]
    await chat(gateway, messages)
    after = [await stats(w.address) for w in workers]
    ran = [i for i, (b, a) in enumerate(zip(before, after, strict=True))
           if a["prefix_cache_lookups"] > b["prefix_cache_lookups"]]  # fmt: skip
    assert len(ran) == 1, ran
    i = ran[0]
    return i, after[i]["prefix_cache_hit_tokens"] - before[i]["prefix_cache_hit_tokens"]


async def index_matches_workers(gateway: Proc, workers: list[Proc]) -> bool:
    for worker in workers:
        held = (await stats(worker.address))["prefix_cache_blocks"]
        if await metric(gateway, "tandem_kv_event_blocks", worker=worker.address) != held:
            return False
    return True


async def test_replicas_index_what_the_workers_hold(stack: dict[str, list[Proc]]) -> None:
    workers, routers, seeders = stack["workers"], stack["routers"], stack["seeders"]
    await chat(seeders[0], [user([1], "seed zero")])
    await chat(seeders[1], [user([2], "seed one")])
    for router in routers:  # learned from events alone: neither router sent these
        await eventually(lambda r=router: index_matches_workers(r, workers), timeout=10)


async def test_multi_turn_chats_follow_their_prefix_across_replicas(
    stack: dict[str, list[Proc]],
) -> None:
    """Turn 1 of conversation c is put on worker c mod 2 (its seeder); turns 2 and 3 go
    through the two replicas in turn, and each must find the worker holding its prefix."""
    workers, routers, seeders = stack["workers"], stack["routers"], stack["seeders"]
    for conv in range(4):
        home = conv % 2
        history = [user([100 + conv * 10], "Turn 1: what is this?")]
        worker, _ = await served(workers, seeders[home], history)
        assert worker == home
        for turn in (1, 2):
            history.append({"role": "assistant", "content": "A shape."})
            history.append(user([100 + conv * 10 + turn], f"Turn {turn + 1}: and this?"))
            worker, cached = await served(workers, routers[(conv + turn) % 2], history)
            assert worker == home, f"conversation {conv}, turn {turn + 1} left its worker"
            assert cached > 0


async def test_red_blue_probe_through_the_event_index(stack: dict[str, list[Proc]]) -> None:
    """Two same-size images in one prompt, in both orders: W0 caches red-then-blue, W1
    blue-then-red. An index that ignored image identity would see one prompt held by both
    and split the repeats by load and turns; with identity each order goes to its own
    worker every time."""
    workers, routers, seeders = stack["workers"], stack["routers"], stack["seeders"]
    red, blue = 7001, 7002
    assert len(png_bytes(red)) and png_bytes(red) != png_bytes(blue)
    red_blue = [user([red, blue], "Which two shapes?")]
    blue_red = [user([blue, red], "Which two shapes?")]
    await chat(seeders[0], red_blue)
    await chat(seeders[1], blue_red)
    for router in routers:
        await eventually(lambda r=router: index_matches_workers(r, workers), timeout=10)
    # Each order twice in a row: a tie taking turns would alternate, and fail here.
    for router in routers:
        for prompt, home in ((red_blue, 0), (red_blue, 0), (blue_red, 1), (blue_red, 1)):
            worker, cached = await served(workers, router, prompt)
            assert worker == home
            assert cached > 16  # past the text before the first image


async def test_restarted_worker_leaves_the_index_and_comes_back(
    stack: dict[str, list[Proc]],
) -> None:
    workers, routers, seeders = stack["workers"], stack["routers"], stack["seeders"]
    gone = workers[1]
    address = gone.address
    for router in routers:
        assert await metric(router, "tandem_kv_event_blocks", worker=address) > 0
    gone.stop(signal.SIGKILL)

    async def forgotten(router: Proc) -> bool:
        # The stream broke: its entries go at once; the health check then takes it out.
        blocks = await metric(router, "tandem_kv_event_blocks", worker=address)
        healthy = await metric(router, "tandem_worker_healthy", worker=address)
        return blocks == 0 and healthy == 0

    for router in routers:
        await eventually(lambda r=router: forgotten(r), timeout=10)
    for router in routers:  # meanwhile requests go to the worker that is left
        assert (await served([workers[0]], router, [user([9000], "still there?")]))[0] == 0
    port = address.rsplit(":", 1)[1]
    (back,) = await asyncio.to_thread(start_all, [["worker", "--model", MODEL, "--port", port]])
    workers[1] = back
    await eventually(lambda: answers(seeders[1]), timeout=20)  # healthy again there
    for router in routers:  # its new life, from its snapshot and events, on every replica
        await eventually(lambda r=router: index_matches_workers(r, workers), timeout=15)
    assert (await stats(back.address))["prefix_cache_blocks"] > 0


async def answers(gateway: Proc) -> bool:
    try:
        await chat(gateway, [user([9100], "up again?")])
    except (AssertionError, httpx.HTTPError):
        return False
    return True
