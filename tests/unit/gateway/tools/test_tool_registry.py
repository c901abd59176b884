"""The parser registry, family defaults, call ids, event helpers, and the torch-free import."""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import time

import pytest
from tools_testing import run

from tandem.gateway.reasoning import reasoning_parser
from tandem.gateway.tools import (
    TOOL_PARSERS,
    ArgumentsPiece,
    CallStart,
    ContentPiece,
    HermesParser,
    JsonParser,
    NamedStreamer,
    RequiredStreamer,
    ToolCall,
    coalesce,
    collect,
    new_call_id,
    tool_parser,
)
from tandem.models.chat import ChatTemplate
from tandem.models.family import FAMILIES
from tandem.models.templates import LLAVA_CHAT_TEMPLATE, QWEN3_VL_CHAT_TEMPLATE


def test_parsers_by_name() -> None:
    assert isinstance(tool_parser("hermes"), HermesParser)
    assert isinstance(tool_parser("qwen"), HermesParser)
    assert isinstance(tool_parser("json"), JsonParser)
    assert set(TOOL_PARSERS) == {"hermes", "qwen", "json"}
    with pytest.raises(ValueError, match=r"'mistral' \(known: hermes, json, qwen\)"):
        tool_parser("mistral")


def test_the_default_parser_follows_the_chat_template() -> None:
    # Without --tool-call-parser the gateway reads calls in the format the template shows.
    assert set(FAMILIES) == {"qwen3_vl", "llava"}  # a new family's template should show one
    for source in (QWEN3_VL_CHAT_TEMPLATE, LLAVA_CHAT_TEMPLATE):
        template = ChatTemplate(source)
        assert template.tool_call_format == "hermes" and template.renders_tools
        assert template.tool_call_format in TOOL_PARSERS
    assert ChatTemplate("{{ messages }}").tool_call_format is None


def test_call_ids_are_fresh_and_openai_shaped() -> None:
    ids = {new_call_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids)


def test_coalesce_and_collect() -> None:
    events = [
        ContentPiece("a"),
        ContentPiece("b"),
        CallStart(0, "call_x", "f"),
        ArgumentsPiece(0, '{"a"'),
        ArgumentsPiece(0, ""),
        ArgumentsPiece(0, ": 1}"),
        CallStart(1, "call_y", "g"),
        ContentPiece(""),
    ]
    assert coalesce(events) == [
        ContentPiece("ab"),
        CallStart(0, "call_x", "f"),
        ArgumentsPiece(0, '{"a": 1}'),
        CallStart(1, "call_y", "g"),
    ]
    assert collect(events) == (
        "ab",
        [ToolCall("call_x", "f", '{"a": 1}'), ToolCall("call_y", "g", "")],
    )


def test_importing_the_parsers_loads_no_torch() -> None:
    code = (
        "import sys, tandem.gateway.tools, tandem.gateway.reasoning; "
        "bad = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.fuzz
def test_long_whitespace_runs_stream_in_linear_time() -> None:
    """Held whitespace (it may only separate calls) must not be rescanned on every push."""
    streamers = [
        tool_parser("hermes").streamer(),
        tool_parser("json").streamer(),
        RequiredStreamer(),
        NamedStreamer("f"),
        reasoning_parser("qwen3").streamer(),
        reasoning_parser("deepseek_r1").streamer(),
    ]
    pieces = ['<tool_call>{"name": "f"}', *["\n"] * 40_000, "x", *[" "] * 40_000]
    # This thread's CPU time with the cyclic collector paused: late in a full run the test
    # process holds a large heap, and its full collections (or a loaded machine) stretched
    # a linear run past 10 s of wall time. The parsers' own work is what is measured.
    gc.disable()
    try:
        started = time.thread_time()
        for streamer in streamers:
            run(streamer, pieces)
        spent = time.thread_time() - started
    finally:
        gc.enable()
    assert spent < 10  # about 0.5 s; quadratic was minutes
