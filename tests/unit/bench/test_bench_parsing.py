"""The bench's own parsing and aggregation (no processes): byte-distinct JPEG copies, SSE
content timing and TPOT, the multi-turn chat bodies, ``vllm bench serve`` result lines,
flag detection from ``--help`` and the new report sections."""

from __future__ import annotations

import base64
import io
import itertools
import json

import numpy as np
from bench import chat_turns, fresh, stream_timing
from bench.report import mixed, multi_turn, vllm_table
from bench.scenarios import SCENARIOS, body
from bench.variants import supported
from bench.vllm_bench import parse_output
from PIL import Image


def _jpeg(seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_spliced_copies_differ_in_bytes_and_decode_to_the_same_pixels() -> None:
    jpeg = _jpeg()
    body = json.dumps({"a": fresh.tagged_b64(jpeg), "b": fresh.tagged_b64(jpeg)}).encode()
    splicer = fresh.Splicer(body, nonce=b"\x01\x02\x03\x04")
    first, second = splicer.next(), splicer.next()
    assert splicer.placeholders == 2 and len(first) == len(second) == len(body)
    images = [base64.b64decode(v) for p in (first, second) for v in json.loads(p).values()]
    assert len(set(images)) == 4  # every image of every request is byte-distinct
    for data in images:
        assert (_pixels(data) == _pixels(jpeg)).all()
    assert fresh.PLACEHOLDER not in first
    assert fresh.Splicer(b'{"text only": 1}').next() == b'{"text only": 1}'


def test_scenario_prompts_differ_per_request_at_their_length() -> None:
    """A repeated body's text would be served by the gateway's prompt token cache."""
    scenario = SCENARIOS["long_text_stream"]
    splicer = fresh.Splicer(json.dumps(body(scenario)).encode())
    texts = [json.loads(splicer.next())["messages"][0]["content"] for _ in range(3)]
    assert len(set(texts)) == 3
    assert all(len(t) == scenario.prompt_chars for t in texts)


def _event(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


def test_content_times_count_content_tokens_of_complete_events() -> None:
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    split = _event("b")
    chunks = [
        (1.0, role + _event("a")),
        (1.5, split[:10]),  # an event split across chunks counts when it is complete
        (2.0, split[10:] + _event("c") + _event("d")),  # two events in one write
        (3.0, _event(None, "length") + b"data: [DONE]\n\n"),
    ]
    assert stream_timing.content_times(chunks) == [1.0, 2.0, 2.0, 2.0]
    # one event of three tokens (characters, for the null workers' byte-level text)
    assert stream_timing.content_times([(1.0, _event("a")), (2.0, _event("xyz"))]) == [
        1.0,
        2.0,
        2.0,
        2.0,
    ]
    figures = stream_timing.stream_figures(0.5, [1.0, 2.0, 2.0, 4.0])
    assert figures == {"ttft": 0.5, "tpot": 1.0, "gaps": [1.0, 0.0, 2.0]}
    assert stream_timing.stream_figures(0.0, []) == {"ttft": None, "tpot": None, "gaps": []}


def test_summarise_gives_per_stream_tpot_and_pooled_itl() -> None:
    streams = [
        stream_timing.stream_figures(0.0, [0.010 + 0.001 * i for i in range(5)]),  # 1 ms
        stream_timing.stream_figures(0.0, [0.020, 0.023, 0.026]),  # 3 ms
        stream_timing.stream_figures(0.0, [0.030]),  # one content event: no TPOT
    ]
    out = stream_timing.summarise(streams)
    assert out["streams"] == 3
    assert round(out["tpot_p50_ms"], 6) == 3.0 and round(out["tpot_p99_ms"], 6) == 3.0
    assert round(out["tpot_mean_ms"], 6) == 2.0
    assert round(out["itl_p50_ms"], 6) == 1.0 and round(out["itl_p99_ms"], 6) == 3.0
    assert round(out["ttft_p50_ms"], 6) == 20.0


def test_chat_turns_resend_earlier_images_byte_for_byte() -> None:
    rests = [fresh.rest_b64(_jpeg(s)) for s in range(3)]
    nonce = b"abcd"
    spec = {"model": "m", "max_tokens": 4, "prompt": "p"}
    conv = chat_turns.plan(5, 3, seed=1)
    assert conv.turns == 3 and all(n in (1, 2) for n in conv.new_per_turn)
    urls_by_turn = []
    for turn in range(3):
        sent = json.loads(chat_turns.body(conv, turn, rests, nonce, spec))
        users = [m for m in sent["messages"] if m["role"] == "user"]
        assert len(users) == turn + 1
        assert [m["content"] for m in sent["messages"] if m["role"] == "assistant"] == [
            f"answer {t}" for t in range(turn)
        ]
        urls_by_turn.append(
            [p["image_url"]["url"] for m in users for p in m["content"] if "image_url" in p]
        )
        conv.replies.append(f"answer {turn}")
    # Each turn's request starts with the previous request's images, then adds its own.
    for before, after in itertools.pairwise(urls_by_turn):
        assert after[: len(before)] == before and 1 <= len(after) - len(before) <= 2
    other = chat_turns.plan(6, 3, seed=1)
    other_urls = {chat_turns.image_url(rests, nonce, 6, i) for i in range(sum(other.new_per_turn))}
    assert not other_urls & set(urls_by_turn[-1])  # distinct images per conversation
    assert chat_turns.reply_text(b'{"choices":[{"message":{"content":"hi"}}]}') == "hi"
    assert chat_turns.reply_text(b"not json") == ""


VLLM_OUTPUT = """\
TANDEM-BENCH RUN tandem/random-mm
Starting initial single prompt test run...
============ Serving Benchmark Result ============
Successful requests:                     24
Failed requests:                         0
Maximum request concurrency:             8
Benchmark duration (s):                  1.52
Request throughput (req/s):              15.79
Output token throughput (tok/s):         252.63
---------------Time to First Token----------------
Mean TTFT (ms):                          410.20
Median TPOT (ms):                        2.81
P99 TPOT (ms):                           9.50
==================================================
TANDEM-BENCH RUN smg/random-mm
Traceback (most recent call last):
TANDEM-BENCH FAILED smg/random-mm: ConnectionError('refused')
"""


def test_parse_vllm_bench_output_per_run() -> None:
    runs = parse_output(VLLM_OUTPUT)
    ok = runs["tandem/random-mm"]
    assert ok["metrics"]["request_throughput_req_s"] == 15.79
    assert ok["metrics"]["mean_ttft_ms"] == 410.2
    assert ok["metrics"]["median_tpot_ms"] == 2.81
    assert ok["metrics"]["p99_tpot_ms"] == 9.5
    assert ok["metrics"]["successful_requests"] == 24
    assert "Mean TTFT (ms):                          410.20" in ok["lines"]
    assert "error" not in ok
    assert runs["smg/random-mm"]["error"].startswith("TANDEM-BENCH FAILED smg/random-mm")
    table = vllm_table(
        {
            "vllm_bench": {
                "concurrency": 8,
                "prompts": 24,
                "runs": {"tandem": {"random-mm": ok}, "smg": {"random-mm": runs["smg/random-mm"]}},
            }
        }
    )
    assert "| random-mm | tandem | 15.79 | 252.63 | 410.20 | – | – | 2.81 | 9.50 | – |" in table
    assert "| random-mm | smg | failed: TANDEM-BENCH FAILED" in table


def test_flags_are_passed_only_when_help_lists_them() -> None:
    pairs = [("--mm-workers", "2"), ("--mm-pixel-cache-mb", "256"), ("--mm", "x")]
    help_text = "  --mm-pixel-cache-mb MM_PIXEL_CACHE_MB\n  --mm-workers-extra N\n"
    assert supported("tandem", pairs, help_text) == ("--mm-pixel-cache-mb", "256")


def _timing(p50: float, p99: float) -> dict:
    return {"stream_timing": {"tpot_p50_ms": p50, "tpot_p99_ms": p99}, "error_count": 0}


def test_report_sections_for_chat_and_mixed_load() -> None:
    chat = {
        "tandem-best": {"achieved_rate": 30.0, "p50_ms": 90, "p99_ms": 200,
                        "gw_cpu_ms_per_req": 20.0, "conversations_completed": 10},
        "smg-best": {"achieved_rate": 12.0, "p50_ms": 250, "p99_ms": 400,
                     "gw_cpu_ms_per_req": 50.0, "conversations_completed": 4},
    }  # fmt: skip
    text = multi_turn({"multi_turn": chat})
    assert "| tandem-best | 30.0 | 90.0 / 200.0 | 20.00 | 10 | 0 |" in text
    assert "| tandem-best / smg-best | 2.50× | | 0.40× | | |" in text
    runs = {
        gw: {
            "text_alone": _timing(0.5, 1.0),
            "text_with_images": _timing(a, b),
            "images": {"p50_ms": 30.0, "p99_ms": 40.0, "error_count": 0},
            "rates": {"text": 8, "image": 8},
        }
        for gw, a, b in (("tandem", 3.0, 12.0), ("smg", 0.6, 2.0))
    }
    text = mixed({"mixed": runs})
    assert "| tandem | 0.500 / 1.000 | 3.000 / 12.000 |" in text
    assert "| tandem / smg | | 5.00× / 6.00× |" in text
    assert "text streams of 64 tokens at 8/s" in text
