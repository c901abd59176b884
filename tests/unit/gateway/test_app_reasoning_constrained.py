"""An answer held to JSON under ``--reasoning-parser`` is content, never reasoning.

The constraint holds decoding from the first token, so the model never writes
``</think>``; the real app in-process over a scripted worker that answers JSON. (A regex
that spells out ``<think>…</think>`` is still parsed: tests/integration/test_gateway_tools.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gateway_app_fakes import MODEL, ScriptedDispatcher, client, make_gateway, sse_chunks

ANSWER = '{"colour": "red"}'
ASKS = {
    "response_format": {"type": "json_object"},
    "structured_outputs": {"json": {"type": "object"}},
    "guided_json": {"type": "object"},
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("ask", ASKS)
async def test_a_constrained_answer_is_content(qwen_meta_dir: Path, ask: str, stream: bool) -> None:
    state, _ = make_gateway(qwen_meta_dir, reasoning_parser="deepseek_r1")
    state.dispatcher = ScriptedDispatcher(state.model, ANSWER)
    extra = {ask: ASKS[ask]}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}
    async with client(state) as http:
        reply = await http.post("/v1/chat/completions", json={**body, "stream": stream})
    assert reply.status_code == 200, reply.text
    if stream:
        chunks = sse_chunks(reply.text)
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("content") or "" for d in deltas) == ANSWER
        assert not any(d.get("reasoning_content") for d in deltas)
    else:
        message = reply.json()["choices"][0]["message"]
        assert message["content"] == ANSWER and message.get("reasoning_content") is None


async def test_an_unconstrained_answer_is_still_parsed(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir, reasoning_parser="deepseek_r1")
    state.dispatcher = ScriptedDispatcher(state.model, "let me see</think>red")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with client(state) as http:
        message = (await http.post("/v1/chat/completions", json=body)).json()["choices"][0]
    assert message["message"]["reasoning_content"] == "let me see"
    assert message["message"]["content"] == "red"
