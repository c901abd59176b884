"""The Conversations API end to end: the official openai client → gateway → a real worker.

One tiny-qwen3-vl worker behind three gateways: SQLite with two tenant keys (restarted in
the middle to show a conversation outlives its gateway), PostgreSQL (a server of the
tests' own), and ``--history-backend none``. A two-turn conversation must answer exactly
as the same exchange chained with ``previous_response_id`` (greedy), and hold the input
and output items of both turns, streamed or not, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from .processes import Proc, start_all

pytestmark = pytest.mark.slow

MODEL = "tiny-qwen3-vl"
TENANT_KEYS = {"acme": "acme-key-0123456789", "globex": "globex-key-0123456789"}


@dataclass
class Deployment:
    worker: Proc
    gateways: dict[str, Proc]
    specs: dict[str, list[str]]  # to start a gateway again (the restart test)

    def __getitem__(self, name: str) -> Proc:
        return self.gateways[name]

    def restart(self, name: str) -> Proc:
        self.gateways[name].stop()
        [self.gateways[name]] = start_all([self.specs[name]])
        return self.gateways[name]


@pytest.fixture(scope="module")
def procs(
    model_cache: Path, tmp_path_factory: pytest.TempPathFactory, postgres_server: Any
) -> Iterator[Deployment]:
    [worker] = start_all([["worker", "--model", MODEL, "--role", "both"]])
    db = tmp_path_factory.mktemp("conversations-db") / "c.sqlite3"
    tenants = [a for t, k in TENANT_KEYS.items() for a in ("--tenant-api-key", f"{t}:{k}")]
    base = ["gateway", "--port", "0", "--worker-urls", worker.address]
    sqlite = ["--history-backend", "sqlite", "--history-sqlite-path", str(db), *tenants]
    postgres = [
        "--history-backend",
        "postgres",
        "--postgres-db-url",
        postgres_server.new_database(),
    ]
    specs = {
        "sqlite": [*base, *sqlite],
        "postgres": [*base, *postgres],
        "none": [*base, "--history-backend", "none"],
    }
    gateways = dict(zip(specs, start_all(list(specs.values())), strict=True))
    deployment = Deployment(worker, gateways, specs)
    yield deployment
    for proc in deployment.gateways.values():
        proc.stop()
    worker.stop()


def client(gateway: Proc, key: str = TENANT_KEYS["acme"]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.address}/v1", api_key=key, max_retries=0)


def turn(api: openai.OpenAI, text: str, **fields: Any) -> Any:
    return api.responses.create(
        model=MODEL, input=text, max_output_tokens=10, temperature=0, **fields
    )


def item_ids(api: openai.OpenAI, conversation_id: str) -> list[str]:
    return [item.id for item in api.conversations.items.list(conversation_id, order="asc")]


def test_conversation_and_items_crud(procs) -> None:
    api = client(procs["sqlite"])
    first = [
        {"type": "message", "role": "user", "content": "Hello"},
        {"type": "message", "role": "assistant", "content": "Hi there"},
    ]
    conv = api.conversations.create(metadata={"topic": "greetings"}, items=first)
    assert conv.object == "conversation" and conv.id.startswith("conv_")
    assert api.conversations.retrieve(conv.id).metadata == {"topic": "greetings"}
    assert api.conversations.update(conv.id, metadata={"topic": "t2"}).metadata == {"topic": "t2"}
    more = [{"type": "message", "role": "user", "content": f"line {i}"} for i in range(5)]
    added = api.conversations.items.create(conv.id, items=more)
    assert [item.content[0].text for item in added.data] == [f"line {i}" for i in range(5)]
    every = item_ids(api, conv.id)
    assert len(every) == 7 and every[2:] == [item.id for item in added.data]
    # Paged two at a time, newest first: the SDK follows last_id / has_more.
    page = api.conversations.items.list(conv.id, limit=2)
    assert [item.id for item in page.data] == every[::-1][:2] and page.has_more
    assert [item.id for item in api.conversations.items.list(conv.id, limit=2)] == every[::-1]
    later = api.conversations.items.list(conv.id, limit=3, order="asc", after=every[4])
    assert [item.id for item in later.data] == every[5:] and not later.has_more
    item = api.conversations.items.retrieve(every[1], conversation_id=conv.id)
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert item.content[0].text == "Hi there"
    after_delete = api.conversations.items.delete(every[1], conversation_id=conv.id)
    assert after_delete.id == conv.id and after_delete.object == "conversation"
    assert item_ids(api, conv.id) == every[:1] + every[2:]
    with pytest.raises(openai.NotFoundError) as gone_item:
        api.conversations.items.retrieve(every[1], conversation_id=conv.id)
    assert gone_item.value.code == "conversation_not_found"
    deleted = api.conversations.delete(conv.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (conv.id, "conversation.deleted", True)
    for call in (
        lambda: api.conversations.retrieve(conv.id),
        lambda: api.conversations.items.list(conv.id),
        lambda: api.conversations.delete(conv.id),
        lambda: api.conversations.retrieve("not-an-id"),
    ):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert missing.value.code == "conversation_not_found"


@pytest.mark.parametrize(
    ("call", "code", "param"),
    [
        (lambda api: api.conversations.create(metadata={f"k{i}": "v" for i in range(17)}),
         "invalid_request", "metadata"),
        (lambda api: api.conversations.create(metadata={"k": "v" * 513}),
         "invalid_request", "metadata.k"),
        (lambda api: api.conversations.create(extra_body={"frobnicate": 1}),
         "unsupported_parameter", "frobnicate"),
        (lambda api: api.conversations.create(items=[{"type": "web_search_call", "id": "x"}]),
         "unsupported_content_part", "items.0"),
    ],
)  # fmt: skip
def test_bad_bodies_are_refused_by_name(procs, call, code: str, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        call(client(procs["sqlite"]))
    assert (refused.value.code, refused.value.param) == (code, param)


def test_include_is_honoured_or_refused_by_name(procs) -> None:
    api = client(procs["sqlite"])
    conv = api.conversations.create(items=[{"role": "user", "content": "x"}])
    kept = api.conversations.items.list(conv.id, include=["message.input_image.image_url"])
    assert len(kept.data) == 1
    with pytest.raises(openai.BadRequestError) as refused:
        api.conversations.items.list(conv.id, include=["file_search_call.results"])
    assert refused.value.param == "include"


def test_two_turns_in_a_conversation_equal_a_previous_response_id_chain(procs) -> None:
    api = client(procs["sqlite"])
    conv = api.conversations.create()
    one = turn(api, "Name a colour.", conversation=conv.id)
    two = turn(api, "And another?", conversation={"id": conv.id})
    assert one.conversation is not None and one.conversation.id == conv.id
    assert two.conversation is not None and two.conversation.id == conv.id
    chained_one = turn(api, "Name a colour.")
    chained_two = turn(api, "And another?", previous_response_id=chained_one.id)
    assert two.output_text == chained_two.output_text
    assert two.usage.input_tokens == chained_two.usage.input_tokens
    # The conversation holds both turns, input then output, in order.
    inputs = [api.responses.input_items.list(r.id).data[0].id for r in (one, two)]
    expected = [inputs[0], *[o.id for o in one.output], inputs[1], *[o.id for o in two.output]]
    assert item_ids(api, conv.id) == expected
    with pytest.raises(openai.BadRequestError) as both:
        turn(api, "x", conversation=conv.id, previous_response_id=one.id)
    assert both.value.param == "conversation" and "previous_response_id" in both.value.message
    assert item_ids(api, conv.id) == expected  # a refused turn appends nothing
    # A streamed turn appends too, once it has answered.
    events = list(
        api.responses.create(
            model=MODEL, input="One more.", conversation=conv.id, max_output_tokens=6, stream=True
        )
    )
    final = events[-1]  # cut by max_output_tokens or not: an answer either way
    assert final.type in ("response.completed", "response.incomplete")
    assert final.response.conversation.id == conv.id
    after = item_ids(api, conv.id)
    assert after[: len(expected)] == expected and len(after) == len(expected) + 2
    assert after[-1] == final.response.output[-1].id
    message = api.conversations.items.retrieve(after[-2], conversation_id=conv.id)
    assert message.content[0].text == "One more."


def test_tenants_see_only_their_own_conversations(procs) -> None:
    acme, globex = (client(procs["sqlite"], TENANT_KEYS[t]) for t in ("acme", "globex"))
    conv = acme.conversations.create(items=[{"role": "user", "content": "secret"}])
    [only] = item_ids(acme, conv.id)
    for call in (
        lambda: globex.conversations.retrieve(conv.id),
        lambda: globex.conversations.update(conv.id, metadata={}),
        lambda: globex.conversations.items.list(conv.id),
        lambda: globex.conversations.items.create(
            conv.id, items=[{"role": "user", "content": "x"}]
        ),
        lambda: globex.conversations.items.retrieve(only, conversation_id=conv.id),
        lambda: globex.conversations.items.delete(only, conversation_id=conv.id),
        lambda: globex.conversations.delete(conv.id),
        lambda: turn(globex, "x", conversation=conv.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert item_ids(acme, conv.id) == [only]  # globex changed nothing


def test_a_conversation_outlives_a_sqlite_gateway_restart(procs) -> None:
    api = client(procs["sqlite"])
    conv = api.conversations.create(metadata={"keep": "me"})
    first = turn(api, "Name a colour.", conversation=conv.id)
    before = item_ids(api, conv.id)
    api = client(procs.restart("sqlite"))
    assert api.conversations.retrieve(conv.id).metadata == {"keep": "me"}
    assert item_ids(api, conv.id) == before
    second = turn(api, "And another?", conversation=conv.id)
    assert item_ids(api, conv.id)[: len(before)] == before
    assert second.conversation.id == conv.id
    # The first turn, read back from the file, was this turn's context.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_postgres_keeps_conversations(procs) -> None:
    api = client(procs["postgres"], "x")
    conv = api.conversations.create(items=[{"role": "user", "content": "Hello"}])
    answered = turn(api, "Name a colour.", conversation=conv.id)
    ids = item_ids(api, conv.id)
    assert len(ids) == 2 + len(answered.output) and ids[-1] == answered.output[-1].id
    api.conversations.items.delete(ids[0], conversation_id=conv.id)
    assert item_ids(api, conv.id) == ids[1:]
    assert api.conversations.delete(conv.id).deleted


def test_without_history_the_routes_say_so(procs) -> None:
    api = client(procs["none"], "x")
    with pytest.raises(openai.NotFoundError) as off:
        api.conversations.create()
    assert off.value.code == "conversation_not_found" and "--history-backend none" in str(off.value)
    with pytest.raises(openai.BadRequestError) as refused:
        turn(api, "x", conversation="conv_123")
    assert refused.value.param == "conversation"
