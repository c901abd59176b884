"""``/v1/models`` and ``/v1/models/{id}`` over the real app in-process."""

from __future__ import annotations

import time
from pathlib import Path

from gateway_app_fakes import MODEL, client, make_gateway


async def test_list_and_retrieve(qwen_meta_dir: Path) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    async with client(state) as http:
        listed = (await http.get("/v1/models")).json()
        one = await http.get(f"/v1/models/{MODEL}")
        missing = await http.get("/v1/models/org/other-model")
    (card,) = listed["data"]
    assert card["id"] == MODEL and card["object"] == "model"
    assert abs(card["created"] - time.time()) < 600  # when this gateway loaded it, not 0
    assert card["max_model_len"] == 4096
    assert one.status_code == 200 and one.json() == card
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert "org/other-model" in missing.json()["error"]["message"]


async def test_an_output_limit_past_the_context_is_refused_naming_its_field(
    qwen_meta_dir: Path,
) -> None:
    state, _ = make_gateway(qwen_meta_dir)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with client(state) as http:
        answers = {
            "max_tokens": await http.post(
                "/v1/chat/completions", json={**chat, "max_tokens": 10_000_000}
            ),
            "max_completion_tokens": await http.post(
                "/v1/chat/completions", json={**chat, "max_completion_tokens": 4096}
            ),
            "max_output_tokens": await http.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 5000}
            ),
            "completions": await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4096}
            ),
        }
        fits = await http.post("/v1/chat/completions", json={**chat, "max_tokens": 4000})
    for field, answer in answers.items():
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["code"] == "invalid_request", field
        assert error["param"] == (field if field != "completions" else "max_tokens")
        assert "exceed the model's context of 4096 tokens" in error["message"]
    assert fits.status_code == 200
