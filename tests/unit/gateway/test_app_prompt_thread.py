"""Long inputs are rendered and tokenized off the event loop, without holding the GIL.

The real app in-process over the scripted dispatcher; the model's tokenizer is wrapped
to note which thread calls it and how. Every string the chat template renders counts
towards "long", not only the messages' content: tool-call arguments, tool definitions and
reasoning once went through on the loop unchecked, stalling every stream about a second
per megabyte.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from gateway_app_fakes import client, make_gateway, wait_until
from tokenizers import Tokenizer

from tandem.gateway import tokenizing
from tandem.gateway.http.json_bodies import json_bytes
from tandem.gateway.model import ModelHandle
from tandem.gateway.prompt_tokens import PromptTokenCache
from tandem.gateway.tokenizing import INLINE_CHARS, INLINE_TOKENS, more_text_than

LONG = INLINE_CHARS + 1
SHORT = {
    "model": "tiny-qwen3-vl",
    "messages": [{"role": "user", "content": [{"type": "text", "text": "short one"}]}],
    "max_tokens": 2,
}
TOOL = {"type": "function", "function": {"name": "f", "description": "d" * LONG}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "a" * LONG}}
# Chat bodies whose long text is not in any message's content.
LONG_ELSEWHERE = {
    "tool definitions": {"tools": [TOOL]},
    "tool-call arguments": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ]
    },
    "reasoning": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "x", "reasoning_content": "r" * LONG},
            {"role": "user", "content": "again"},
        ]
    },
}


class NotingTokenizer:
    """The model's tokenizer, noting the thread and the method of each encode/decode."""

    def __init__(self, inner: Tokenizer) -> None:
        self._inner = inner
        self.calls: list[tuple[str, threading.Thread]] = []

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name.startswith(("encode", "decode")):

            def noted(*args: Any, **kwargs: Any) -> Any:
                self.calls.append((name, threading.current_thread()))
                return attribute(*args, **kwargs)

            return noted
        return attribute

    def encodes(self) -> list[tuple[str, threading.Thread]]:
        """The encodes only (the scripted worker's answer is decoded as it streams)."""
        return [call for call in self.calls if call[0].startswith("encode")]


def noting(state: Any) -> NotingTokenizer:
    tokenizer = NotingTokenizer(state.model.tokenizer)
    state.model.tokenizer = tokenizer
    # The prompt token cache encodes through the wrapper too (its load-time probes aside).
    state.model.prompt_tokens = PromptTokenCache(tokenizer)  # type: ignore[arg-type]
    tokenizer.calls.clear()
    return tokenizer


async def test_long_prompts_are_tokenized_in_a_thread_without_the_gil(
    qwen_meta_dir: Path,
) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    tokenizer = noting(state)
    loop_thread = threading.current_thread()
    async with client(state) as http:
        assert (await http.post("/v1/chat/completions", json=SHORT)).status_code == 200
        # Longer than the tiny model's context, so refused, but only after tokenizing.
        long_chat = {**SHORT, "messages": [{"role": "user", "content": "a" * LONG}]}
        long_completion = {"model": "tiny-qwen3-vl", "prompt": "b" * LONG}
        for route, body in (("chat/completions", long_chat), ("completions", long_completion)):
            answer = await http.post(f"/v1/{route}", json=body)
            assert answer.status_code == 400 and "context" in answer.json()["error"]["message"]
    (short_call, *long_calls) = tokenizer.encodes()
    assert short_call == ("encode_batch_fast", loop_thread)  # cheaper than encode, inline
    assert [name for name, _ in long_calls] == ["encode_batch_fast"] * 2
    assert all(thread is not loop_thread for _, thread in long_calls)


@pytest.mark.parametrize("case", LONG_ELSEWHERE)
async def test_every_rendered_string_counts_towards_long(qwen_meta_dir: Path, case: str) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    tokenizer = noting(state)
    async with client(state) as http:
        answer = await http.post("/v1/chat/completions", json={**SHORT, **LONG_ELSEWHERE[case]})
        if case != "reasoning":  # Qwen's template leaves earlier turns' reasoning out
            assert answer.status_code == 400 and "context" in answer.json()["error"]["message"]
        tokenized = await http.post("/tokenize", json={**SHORT, **LONG_ELSEWHERE[case]})
        assert tokenized.status_code == 200, tokenized.text
    loop_thread = threading.current_thread()
    calls = tokenizer.encodes()
    assert len(calls) == 2 and all(thread is not loop_thread for _, thread in calls)
    if case != "reasoning":  # rendered, the text itself is long: encoded without the GIL
        assert [name for name, _ in calls] == ["encode_batch_fast"] * 2


async def test_tokenize_and_detokenize_of_long_inputs_leave_the_loop(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    tokenizer = noting(state)
    async with client(state) as http:
        prompt = {"model": "tiny-qwen3-vl", "prompt": "c" * LONG}
        ids = (await http.post("/tokenize", json=prompt)).json()["tokens"]
        assert len(ids) > INLINE_TOKENS
        text = (await http.post("/detokenize", json={"tokens": ids})).json()["prompt"]
        assert text == "c" * LONG
    loop_thread = threading.current_thread()
    assert [name for name, _ in tokenizer.calls] == ["encode_batch_fast", "decode_batch"]
    assert all(thread is not loop_thread for _, thread in tokenizer.calls)


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_tokenize_and_detokenize_wait_for_an_admission_slot(
    qwen_meta_dir: Path, path: str
) -> None:
    """They once took no slot: any number of 2 MiB bodies tokenized at once."""
    state, dispatcher = make_gateway(
        qwen_meta_dir, max_concurrent_requests=1, max_queued_requests=1
    )
    dispatcher.gate = asyncio.Event()
    body = {"tokens": [104, 105]} if path == "/detokenize" else {"prompt": "hi"}
    async with client(state) as http:
        first = asyncio.ensure_future(http.post("/v1/chat/completions", json=SHORT))
        await wait_until(lambda: dispatcher.arrived == 1)
        waiting = asyncio.ensure_future(http.post(path, json=body))
        await wait_until(lambda: state.admission.queued == 1)
        refused = await http.post(path, json=body)
        assert (refused.status_code, refused.json()["error"]["code"]) == (
            429,
            "too_many_requests",
        )
        assert not waiting.done()
        dispatcher.gate.set()
        answers = await asyncio.wait_for(asyncio.gather(first, waiting), 10)
    assert [a.status_code for a in answers] == [200, 200]
    assert state.admission.running == 0 and state.admission.queued == 0


def test_the_gil_free_forms_give_the_same_ids_and_text(qwen_meta_dir: Path) -> None:
    tokenizer = ModelHandle.from_dir(qwen_meta_dir, "m").tokenizer
    text = ("héllo <|im_start|> wörld ☃ " * 2000)[: INLINE_CHARS * 2]
    for special in (False, True):
        ids = tokenizer.encode(text, add_special_tokens=special).ids
        assert tokenizing.encode_ids(tokenizer, text, special) == ids
        for skip in (False, True):
            expected = tokenizer.decode(ids, skip_special_tokens=skip)
            assert tokenizing.decode_ids(tokenizer, ids, skip) == expected


def test_the_length_walk_stops_early_and_counts_structure() -> None:
    assert not more_text_than([{"a": "x" * 10}], 20)
    assert more_text_than([{"a": "x" * 30}], 20)
    assert more_text_than([[""] * 100], 20)  # many empty strings are not free
    assert more_text_than([[["x"] * 10**6]], 20)  # one huge list stops the walk at once
    assert not more_text_than([None, 3, True, ("ab",)], 20)


def test_json_in_pieces_writes_what_json_bytes_writes() -> None:
    answer = {
        "count": 3,
        "tokens": list(range(200_000)),
        "token_strs": ['q"uote', "é☃", "\\", "\n", *["Ġw"] * 100_000],
        "none": None,
        "short": [1, 2],
    }
    assert tokenizing.json_in_pieces(answer) == json_bytes(answer)


def test_a_text_over_the_limit_is_counted_not_listed(qwen_meta_dir: Path) -> None:
    tokenizer = ModelHandle.from_dir(qwen_meta_dir, "m").tokenizer
    text = "z" * (INLINE_CHARS * 2)  # one token a byte in the built-in tokenizer
    with pytest.raises(tokenizing.TooManyTokens) as over:
        tokenizing.encode_ids(tokenizer, text, at_most=len(text) - 1)
    assert over.value.count == len(text)
    assert tokenizing.encode_ids(tokenizer, text, at_most=len(text)) == [ord("z")] * len(text)


@pytest.mark.parametrize("length", [0, 1, 300, INLINE_CHARS + 1])
def test_encode_ids_equals_the_tokenizers_own_encode(qwen_meta_dir: Path, length: int) -> None:
    """The batch form gives the ids ``encode`` gives, special tokens and all."""
    state, _ = make_gateway(qwen_meta_dir)
    inner: Tokenizer = state.model.tokenizer
    text = ("héllo <|im_start|>user\n wörld ✓ " * (length // 20 + 1))[:length]
    for special in (False, True):
        expected = inner.encode(text, add_special_tokens=special).ids
        assert tokenizing.encode_ids(inner, text, add_special_tokens=special) == expected
    if length:
        with pytest.raises(tokenizing.TooManyTokens):
            tokenizing.encode_ids(inner, text, at_most=len(expected) - 1)
