"""The vLLM engines of one model for the compatibility tests, started in stages.

At most two vLLM engines run at a time: each engine's model worker busy-waits (it spins
with ``sched_yield`` for a second after every step), so four engines on a 2-core machine
starved one another — health checks timed out and NIXL handshakes missed vLLM's fixed
5 s window. The tests ask for the engines they need (``need``); the others are stopped,
together with the gateways in front of them.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import openai
from tests.integration.processes import Proc, start, wait_ready
from tests.integration.wire_helpers import image_data_url

from tandem.engine.builtin import resolve_model

from .vllm_procs import VllmWorker, start_gateway, start_vllm, stop_all, wait_all

ENGINES: dict[str, dict[str, Any]] = {
    "agg": {"media_refs": True},
    "prefill": {"pd": True, "media_refs": True},
    "decode": {"pd": True, "media_refs": True},
    "lmo": {"pd": True, "language_model_only": True},
}
# gateway name -> (roles of the engines behind it, --mm-processing)
GATEWAYS: dict[str, tuple[dict[str, str], str]] = {
    "agg": ({"both": "agg"}, "router"),
    "agg-worker": ({"both": "agg"}, "worker"),
    "agg-shm": ({"both": "agg"}, "router"),
    "pd-router": ({"prefill": "prefill", "decode": "decode"}, "router"),
    "pd-worker": ({"prefill": "prefill", "decode": "decode"}, "worker"),
    "lmo": ({"prefill": "prefill", "decode": "lmo"}, "router"),
}

# More flags of some gateways: pixels through /dev/shm (a threshold the small test images pass).
GATEWAY_FLAGS: dict[str, tuple[str, ...]] = {
    "agg-shm": ("--multimodal-tensor-transport", "shm", "--multimodal-shm-min-bytes", "1024"),
}


def messages(text: str, image: str | None) -> list[dict]:
    if image is None:
        return [{"role": "user", "content": text}]
    parts = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


class Engines:
    """vLLM engines, Tandem's embedded worker and Tandem gateways for one model."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.dir = resolve_model(model)
        self.running: dict[str, VllmWorker] = {}
        self.gateways: dict[str, Proc] = {}
        self.embedded: Proc | None = None

    def __getitem__(self, name: str) -> VllmWorker:
        return self.running[name]

    def need(self, *names: str) -> None:
        """Run exactly these vLLM engines (starting the missing ones together)."""
        for name in [n for n in self.running if n not in names]:
            for gateway in [g for g, (roles, _) in GATEWAYS.items() if name in roles.values()]:
                if gateway in self.gateways:
                    self.gateways.pop(gateway).stop()
            self.running.pop(name).stop()
        missing = [n for n in names if n not in self.running]
        for attempt in range(2):
            # One more try on fresh ports: an engine can lose a port it was given to another
            # process binding an internal port at the same moment ("Address already in use").
            fresh = [start_vllm(n, self.dir, self.model, **ENGINES[n]) for n in missing]
            try:
                wait_all(*fresh)  # stops all of them when one fails
            except RuntimeError as failure:
                if attempt:
                    raise
                print(f"vLLM start failed, trying once more: {str(failure)[:300]}")
                continue
            self.running.update({w.name: w for w in fresh})
            return

    def embedded_worker(self) -> Proc:
        if self.embedded is None:
            args = ["worker", "--role", "both", "--model", self.model, "--host", "127.0.0.1"]
            # vLLM's JSON grammars take any whitespace (the lane starts vLLM with its default);
            # Tandem's are compact unless told, and the answers are compared token for token.
            args += ["--json-whitespace", "any"]
            proc, ready = start([*args, "--port", "0", "--log-level", "warning"])
            self.embedded = wait_ready(proc, ready)
        return self.embedded

    def client(self, name: str) -> openai.OpenAI:
        """An openai client for gateway ``name`` (started, with its engines, on first use)."""
        if name == "embedded":
            if name not in self.gateways:
                url = f"grpc://{self.embedded_worker().address}"
                args = ["gateway", "--host", "127.0.0.1", "--port", "0", "--worker-urls", url]
                proc, ready = start(args)
                self.gateways[name] = wait_ready(proc, ready)
        else:
            roles, mode = GATEWAYS[name]
            self.need(*{*roles.values(), *self._engines_kept_for(name)})
            if name not in self.gateways:
                workers = {role: self.running[engine] for role, engine in roles.items()}
                flags = GATEWAY_FLAGS.get(name, ())
                self.gateways[name] = start_gateway(workers, "--mm-processing", mode, *flags)
                if "prefill" in roles:
                    self._first_handshake(name)
        return _client(self.gateways[name].address)

    def _engines_kept_for(self, name: str) -> set[str]:
        # A PD stage keeps its prefill engine; nothing else is kept across stages.
        roles, _ = GATEWAYS[name]
        return {"prefill"} if "prefill" in roles and "prefill" in self.running else set()

    def _first_handshake(self, name: str, patience_s: float = 240.0) -> None:
        """Let a new vLLM prefill/decode pair complete its first NIXL handshake.

        vLLM's decode engine waits 5 s (a fixed ZMQ receive timeout) for the prefill
        engine's side channel on first contact; when that reply is late, vLLM fails that
        one request (finish_reason "error", logged as ``handshake_failed``) and handshakes
        again on the next. One text request, retried, settles it before outputs are compared.

        The first image a vLLM decode engine meets costs its gRPC process a one-time set-up
        that blocked it for up to 75 s on two busy cores, long enough for its own HTTP/2
        keepalive to drop the connection ("ping_timeout" GOAWAY, a 503 for that request).
        Where the pair serves router-side images, an image request, retried, pays for that too.
        """
        roles, mode = GATEWAYS[name]
        warm_ups = [messages("warm up", None)]
        if mode == "router" and roles.get("decode") == "decode":
            warm_ups.append(messages("warm up", image_data_url(99, (32, 32))))
        client = _client(self.gateways[name].address)
        for warm_up in warm_ups:
            # Patient: a stalled engine may also have been taken out of the gateway's pool
            # by its health checks for a while (a 503 until the next good check).
            deadline, last = time.monotonic() + patience_s, ""
            while True:
                try:
                    reply = client.chat.completions.create(
                        model=self.model,
                        messages=warm_up,
                        max_tokens=2,
                        temperature=0,
                        extra_body={"ignore_eos": True},  # "length" means it ran to the end
                    )
                except openai.APIError as err:  # a vLLM-side failure: the next try may pass
                    last = str(err)
                else:
                    if reply.choices[0].finish_reason == "length":
                        break
                    last = f"finish_reason {reply.choices[0].finish_reason}"
                if time.monotonic() > deadline:
                    raise AssertionError(f"{name}: the vLLM pair never completed a request: {last}")
                time.sleep(3)

    def metric(self, gateway: str, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"{self.gateways[gateway].address}/metrics") as reply:
            text = reply.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        for proc in self.gateways.values():
            proc.stop()
        if self.embedded is not None:
            self.embedded.stop()
        stop_all(*self.running.values())


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
