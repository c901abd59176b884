"""The workload of ``bench.epd_reuse`` (no processes): about 80 % of turns bring back an image
seen earlier in the run, every new image is a different picture, and each request carries the
whole history of its conversation; a run's figures are summed up per request."""

from __future__ import annotations

import base64
import io

from bench.epd_figures import medians, mismatches, summarize, table
from bench.epd_workload import CONVERSATIONS, SIDES, TURNS, plan
from PIL import Image


def test_about_80_percent_of_turns_reuse_an_image_seen_earlier() -> None:
    workload = plan(CONVERSATIONS, TURNS, seed=0)  # the bench's default workload
    assert len(workload.order) == CONVERSATIONS * TURNS
    assert 0.75 <= workload.reuse_rate <= 0.85
    seen: set[int] = set()
    for turn in workload.order:
        assert turn.reused == (turn.image in seen)  # reused: seen earlier; new: first time
        seen.add(turn.image)
    assert not workload.order[0].reused
    assert len(workload.images) == sum(not t.reused for t in workload.order)
    assert plan(CONVERSATIONS, TURNS, seed=0, reuse=0.0).reuse_rate == 0.0


def test_new_images_are_distinct_pictures() -> None:
    images = plan(CONVERSATIONS, TURNS, seed=0).images
    assert len({i.png for i in images}) == len(images)
    pairs = [(i.colour, i.shape) for i in images]
    assert len(set(pairs[:18])) == min(len(images), 18)  # every colour × shape once first
    for image in images:
        decoded = Image.open(io.BytesIO(image.png))
        assert decoded.size == image.size
        assert all(SIDES[0] <= side <= SIDES[1] for side in image.size)


def test_the_same_seed_gives_the_same_bytes_and_another_seed_does_not() -> None:
    first, again, other = plan(4, 3, seed=5), plan(4, 3, seed=5), plan(4, 3, seed=6)
    assert [i.png for i in first.images] == [i.png for i in again.images]
    assert first.order == again.order
    assert [i.png for i in first.images] != [i.png for i in other.images]


def test_each_turn_sends_the_history_with_its_images_and_answers() -> None:
    workload = plan(3, 4, seed=1)
    for conv in range(3):
        history = workload.history(conv)
        assert [t.turn for t in history] == [0, 1, 2, 3]
        assert len({t.image for t in history}) == 4  # never the same picture twice in a chat
        previous: list[dict] = []
        for turn in history:
            messages = workload.messages(turn)
            assert len(messages) == 2 * turn.turn + 1
            assert messages[: len(previous)] == previous  # the history, byte for byte
            urls = [
                part["image_url"]["url"]
                for m in messages
                if m["role"] == "user"
                for part in m["content"]
                if part["type"] == "image_url"
            ]
            assert len(urls) == turn.turn + 1
            assert base64.b64decode(urls[-1].split(",", 1)[1]) == workload.images[turn.image].png
            reply = f"answer {conv}.{turn.turn}"
            workload.replies[(conv, turn.turn)] = reply
            previous = [*messages, {"role": "assistant", "content": reply}]


def test_an_answer_that_differs_from_pd_is_reported() -> None:
    order = plan(1, 2, seed=0).order
    same = {"pd": {"answers": ["a", "b"]}, "epd": {"answers": ["a", "b"]}}
    assert mismatches([same, same], order) == []
    wrong = {"pd": {"answers": ["a", "b"]}, "epd": {"answers": ["a", "c"]}}
    [found] = mismatches([same, wrong], order)
    assert (found["round"], found["config"], found["turn"], found["got"]) == (2, "epd", 1, "c")


def test_a_run_is_summed_up_per_request_and_tabled() -> None:
    order = plan(1, 2, seed=0).order  # 2 requests, 3 images sent
    stats = {"prefill": {"vision_encodes": 4}, "decode": {}}
    encode = {"embedding_cache": {"hits": 1, "misses": 2}, "encoder": {"vision_encodes": 2}}
    before = {"cpu_s": {"prefill": 1.0, "decode": 1.0, "encode": 0.0, "gateway": 0.0}}
    after = {"cpu_s": {"prefill": 1.2, "decode": 1.1, "encode": 0.1, "gateway": 0.2}}
    before["stats"] = {**stats, "encode": {}}
    after["stats"] = {**stats, "encode": encode}
    answers = [{"text": "a", "ttft_s": 0.01, "latency_s": 0.02}] * 2
    measured = {"before": before, "after": after, "wall_s": 1.0, "load_average_before": 0}
    run = summarize("epd", order, answers, measured)
    assert run["images_sent"] == 3 and run["prefill_vision_encodes"] == 0
    assert abs(run["worker_cpu_s_per_request"] - 0.2) < 1e-9
    assert run["encode"]["cache_hit_rate"] == 1 / 3
    line = table([("epd", medians([run, run]))]).splitlines()[-1]
    assert line == "| epd | 100.0 | 50.0 | 200.0 | 100.0 | 10.0 / 10.0 | 1.0 | 33% | 2 | 0 |"
