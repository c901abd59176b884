"""The chaos soak's client side: mixed requests, each classified answered, coded or lost.

Classes (issue 38):
- answered: a 2xx with a whole answer; a chat stream that ended with ``[DONE]`` after a
  finish reason and no error event; a Responses stream that ended with
  ``response.completed`` (or ``response.incomplete``, an answer cut at its token limit).
- coded: an HTTP 4xx/5xx whose body is an OpenAI error with a ``code``; a chat stream's
  error event with a ``code`` followed by ``[DONE]``; a Responses ``error`` event or
  ``response.failed`` whose error has a ``code``.
- lost: anything else (client timeout, connection dropped without a code, a malformed
  or unfinished stream, an error without a code), and a coded error whose text is gRPC's
  own words (``Stream removed``, ``Socket closed``...): the client got no Tandem error.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from PIL import Image

from bench.chaos_procs import MODEL

KINDS = ("chat", "chat_stream", "chat_image", "completion", "responses", "responses_stream")


@dataclass
class Outcome:
    kind: str
    verdict: str  # answered | coded | lost
    latency_s: float
    code: str = ""
    detail: str = ""
    response_id: str = ""
    started: float = 0.0


def png_url(seed: int) -> str:
    """A small seeded noise PNG as a data URL (a fresh picture per seed)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _error_code(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("code") or "")
    return ""


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# gRPC's transport words and Python gRPC's object names: a message that holds one leaked a
# raw gRPC failure to the client (docs/errors.md: clients see Tandem codes and messages).
RAW_GRPC_WORDS = (
    "stream removed",
    "socket closed",
    "connection reset",
    "failed to connect to all addresses",
    "goaway",
    "end of tcp stream",
    "debug_error_string",
    "grpc_status",
    "statuscode.",
    "aiorpcerror",
    "_multithreadedrendezvous",
)


def raw_grpc(text: str) -> bool:
    lowered = text.lower()
    return any(words in lowered for words in RAW_GRPC_WORDS)


def coded_or_lost(code: str, text: str) -> tuple[str, str, str]:
    """A coded error, unless its text is gRPC's own (then the client was told nothing)."""
    if raw_grpc(text):
        return "lost", "", f"raw gRPC text under code {code!r}: {text[:200]!r}"
    return "coded", code, text[:160]


def _refusal(status: int, text: str) -> tuple[str, str, str]:
    code = _error_code(_json(text))
    if status >= 400 and code:
        return coded_or_lost(code, f"HTTP {status} {text}")
    return "lost", "", f"HTTP {status} without a coded error: {text[:200]!r}"


async def _plain(api: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[str, ...]:
    reply = await api.post(path, json=body)
    if reply.status_code != 200:
        return _refusal(reply.status_code, reply.text)
    data = _json(reply.text) or {}
    if path == "/v1/responses":
        status = data.get("status")
        if status in ("completed", "incomplete") and data.get("output"):
            return "answered", "", "", str(data.get("id", ""))
        code = _error_code(data)
        if status == "failed" and code:
            return coded_or_lost(code, json.dumps(data.get("error")))
        return "lost", "", f"200 Response status {status!r}: {reply.text[:200]!r}"
    choices = data.get("choices") or []
    if choices and choices[0].get("finish_reason"):
        return "answered", "", ""
    return "lost", "", f"200 without a finished choice: {reply.text[:200]!r}"


async def _chat_stream(api: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, ...]:
    finish, error, done = "", None, False
    async with api.stream("POST", "/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            return _refusal(reply.status_code, (await reply.aread()).decode(errors="replace"))
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            event = _json(line[6:])
            if not isinstance(event, dict) or done:
                return "lost", "", f"malformed stream line {line[:200]!r}"
            if "error" in event:
                error = event
            for choice in event.get("choices") or []:
                finish = choice.get("finish_reason") or finish
    if error is not None:
        code = _error_code(error)
        if code and done:
            return coded_or_lost(code, json.dumps(error))
        return "lost", "", f"error event (done={done}) {json.dumps(error)[:200]}"
    if done and finish:
        return "answered", "", ""
    return "lost", "", f"stream ended: done={done} finish={finish!r}"


async def _responses_stream(api: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, ...]:
    async with api.stream("POST", "/v1/responses", json=body) as reply:
        if reply.status_code != 200:
            return _refusal(reply.status_code, (await reply.aread()).decode(errors="replace"))
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = _json(line[6:])
            kind = event.get("type") if isinstance(event, dict) else None
            if kind in ("response.completed", "response.incomplete"):
                return "answered", "", "", str(event["response"].get("id", ""))
            if kind == "response.failed":
                code = _error_code(event.get("response"))
                if code:
                    return coded_or_lost(code, json.dumps(event["response"].get("error")))
                return "lost", "", f"response.failed without a code: {line[:200]!r}"
            if kind == "error":
                if event.get("code"):
                    return coded_or_lost(str(event["code"]), line[6:])
                return "lost", "", f"error event without a code: {line[:200]!r}"
            if kind is None:
                return "lost", "", f"malformed stream line {line[:200]!r}"
    return "lost", "", "Responses stream ended without a final event"


def build(kind: str, rng: random.Random, previous: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request of ``kind``; ``previous`` continues a Responses chain."""
    tokens = rng.randint(32, 64)
    text = f"Tell me about the number {rng.randint(0, 10**6)}."
    if kind.startswith("responses"):
        body: dict[str, Any] = {"model": MODEL, "input": text, "max_output_tokens": tokens}
        body["stream"] = kind == "responses_stream"
        if previous:
            body["previous_response_id"] = previous
        return "/v1/responses", body
    if kind == "completion":
        return "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": tokens}
    content: Any = text
    if kind == "chat_image":
        image = {"type": "image_url", "image_url": {"url": png_url(rng.randint(0, 10**9))}}
        content = [image, {"type": "text", "text": "What is in this picture?"}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    body |= {"max_tokens": tokens, "stream": kind == "chat_stream"}
    return "/v1/chat/completions", body


async def one(
    api: httpx.AsyncClient, kind: str, rng: random.Random, previous: str, timeout: float
) -> Outcome:
    path, body = build(kind, rng, previous)
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            if kind == "chat_stream":
                got = await _chat_stream(api, body)
            elif kind == "responses_stream":
                got = await _responses_stream(api, body)
            else:
                got = await _plain(api, path, body)
    except TimeoutError:
        got = ("lost", "", f"no answer within the client timeout ({timeout:.0f} s)")
    except httpx.HTTPError as error:
        got = ("lost", "", f"{type(error).__name__}: {error}")
    verdict, code, detail, *rid = got
    latency = time.monotonic() - started
    return Outcome(kind, verdict, latency, code, detail, rid[0] if rid else "", started)


async def client_loop(
    base_url: str, seed: int, stop_at: float, timeout: float, out: list[Outcome]
) -> None:
    """Requests one after another until ``stop_at``; Responses go in chains of 2-3 turns."""
    rng = random.Random(seed)
    previous, turns_left = "", 0
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as api:
        while time.monotonic() < stop_at:
            kind = rng.choice(KINDS)
            if turns_left > 0:
                kind = rng.choice(("responses", "responses_stream"))
            outcome = await one(api, kind, rng, previous, timeout)
            out.append(outcome)
            if kind.startswith("responses"):
                if outcome.verdict == "answered" and outcome.response_id and turns_left != 1:
                    previous = outcome.response_id
                    turns_left = turns_left - 1 if turns_left else rng.randint(1, 2)
                else:  # the chain ends here (done, or its turn failed)
                    previous, turns_left = "", 0
