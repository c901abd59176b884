"""PD across addresses: IPv6 workers and gateways, and a prefill's advertised KV host.

Real `tandem worker` and `tandem gateway` processes on loopback (``::1`` and 127.0.0.1);
the KV really moves over the side channel, dialled at the address the prefill's KV params
name (docs/operations.md, "Addresses").
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import openai
import pytest

from tandem.hostport import split_host_port

from .image_server import png_bytes
from .processes import Proc, start_all
from .wire_helpers import PREFILL_TAG, chat_prompt_ids, generate, request, stats

MODEL = "tiny-qwen3-vl"
WORKERS = {
    "v6-both": ["--host", "::1", "--role", "both"],
    "v6-prefill": ["--host", "::1", "--role", "prefill"],
    "v6-decode": ["--host", "[::1]", "--role", "decode"],
    # Bound to IPv4 loopback, advertised by name: decode workers must dial the name.
    "named-prefill": ["--host", "127.0.0.1", "--advertise-host", "localhost", "--role", "prefill"],
}


@pytest.fixture(scope="module")
def procs(model_cache: Path):
    specs = [["worker", "--model", MODEL, *args] for args in WORKERS.values()]
    workers = dict(zip(WORKERS, start_all(specs), strict=True))
    w = {name: proc.address for name, proc in workers.items()}
    base = ["gateway", "--host", "::1", "--port", "0"]
    pd_args = ["--pd-disaggregation", "--prefill", w["v6-prefill"], "--decode", w["v6-decode"]]
    gateway_specs = {
        "agg": [*base, "--worker-urls", f"grpc://{w['v6-both']}"],
        "pd": [*base, *pd_args],
        "pd-parallel": [*base, *pd_args, "--pd-dispatch", "parallel"],
    }
    gateways = dict(zip(gateway_specs, start_all(list(gateway_specs.values())), strict=True))
    yield workers, gateways
    for proc in [*gateways.values(), *workers.values()]:
        proc.stop()


def test_ipv6_addresses_are_bracketed(procs) -> None:
    workers, gateways = procs
    for name in ("v6-both", "v6-prefill", "v6-decode"):
        assert workers[name].address.startswith("[::1]:"), workers[name].address
    for gateway in gateways.values():
        assert gateway.address.startswith("http://[::1]:"), gateway.address


def ask(gateway: Proc, n_images: int) -> str:
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png_b64(seed)}}
        for seed in range(n_images)
    ]
    content = [*parts, {"type": "text", "text": "What do you see?"}]
    client = openai.OpenAI(base_url=f"{gateway.address}/v1", api_key="x", max_retries=0)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=6,
        temperature=0,
    )
    return answer.choices[0].message.content or ""


def png_b64(seed: int) -> str:
    return base64.b64encode(png_bytes(60 + seed)).decode()


@pytest.mark.parametrize("n_images", [0, 1])
def test_pd_pair_on_ipv6_answers_as_aggregated(procs, n_images: int) -> None:
    workers, gateways = procs
    expected = ask(gateways["agg"], n_images)
    assert expected
    before = workers["v6-prefill"].count("Generate request")
    assert ask(gateways["pd"], n_images) == expected
    assert ask(gateways["pd-parallel"], n_images) == expected
    assert workers["v6-prefill"].count("Generate request") >= before + 2  # both went PD


async def test_kv_params_name_the_advertised_host(procs, model_cache: Path) -> None:
    from tandem.engine.builtin import resolve_model

    workers, _ = procs
    prefill = workers["named-prefill"]
    assert prefill.address.startswith("localhost:"), prefill.address  # READY: advertised
    ids = chat_prompt_ids(resolve_model(MODEL), "Name a colour.", 0)
    base = request("advertised", ids, max_tokens=6)
    expected = (await generate(workers["v6-both"].address, base)).tokens
    leg = request("advertised-prefill", ids, max_tokens=1, ignore_eos=True)
    leg.kv_transfer_params_json = PREFILL_TAG
    done = (await generate(prefill.address, leg)).complete
    params = json.loads(done.kv_transfer_params_json)
    assert params["remote_host"] == "localhost", params
    assert params["remote_port"] == split_host_port(prefill.address)[1]
    assert (await stats(prefill.address))["held_kv_blocks"] > 0
    # A decode worker on ::1 dials the advertised name, pulls the KV and releases it.
    decode_leg = request("advertised-decode", ids, max_tokens=6)
    decode_leg.kv_transfer_params_json = done.kv_transfer_params_json
    assert (await generate(workers["v6-decode"].address, decode_leg)).tokens == expected
    assert (await stats(prefill.address))["held_kv_blocks"] == 0
