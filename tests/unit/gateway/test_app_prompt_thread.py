"""A long prompt is rendered and tokenized off the event loop; a short one on it.

The real app in-process over the scripted dispatcher; the model's tokenizer is wrapped
to note which thread calls it.
"""

from __future__ import annotations

import threading
from pathlib import Path

from gateway_app_fakes import client, make_gateway

from tandem.gateway.model import ModelHandle
from tandem.gateway.pipeline.prompt import INLINE_PROMPT_CHARS


async def test_long_prompts_are_tokenized_in_a_thread(qwen_meta_dir: Path, monkeypatch) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    encode, threads = ModelHandle.encode, []

    def noting_encode(self: ModelHandle, text: str) -> list[int]:
        threads.append(threading.current_thread())
        return encode(self, text)

    monkeypatch.setattr(ModelHandle, "encode", noting_encode)
    loop_thread = threading.current_thread()
    async with client(state) as http:
        short = {
            "model": "tiny-qwen3-vl",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "short one"}]}],
            "max_tokens": 2,
        }
        assert (await http.post("/v1/chat/completions", json=short)).status_code == 200
        # Longer than the tiny model's context, so refused, but only after tokenizing.
        long_chat = {
            **short,
            "messages": [{"role": "user", "content": "a" * (INLINE_PROMPT_CHARS + 1)}],
        }
        long_completion = {"model": "tiny-qwen3-vl", "prompt": "b" * (INLINE_PROMPT_CHARS + 1)}
        for route, body in (("chat/completions", long_chat), ("completions", long_completion)):
            answer = await http.post(f"/v1/{route}", json=body)
            assert answer.status_code == 400 and "context" in answer.json()["error"]["message"]
    assert len(threads) == 3
    assert threads[0] is loop_thread
    assert threads[1] is not loop_thread and threads[2] is not loop_thread
