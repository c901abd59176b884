"""Tool calls in model output: parsers chosen by ``--tool-call-parser`` or the chat template.

Pure text processing (no I/O, no torch), shared by the non-streaming answer
(``parse``) and the streamed one (``streamer``: events per choice). Formats:

- ``hermes`` (alias ``qwen``): ``<tool_call>{json}</tool_call>``, Qwen3-VL's format;
- ``json``: the whole output is a call object or an array of them;
- output the gateway forced with a constraint: ``parse_required`` /
  ``RequiredStreamer`` (``tool_choice="required"``) and ``parse_named`` /
  ``NamedStreamer`` (a named function).

Malformed calls degrade to content; nothing here raises on any model output.
"""

from __future__ import annotations

from tandem.gateway.tools.calls import (
    ArgumentsPiece,
    CallStart,
    ContentPiece,
    Event,
    ReasoningPiece,
    ToolCall,
    ToolParser,
    ToolStreamer,
    coalesce,
    collect,
    new_call_id,
)
from tandem.gateway.tools.hermes import HermesParser, HermesStreamer
from tandem.gateway.tools.json_format import (
    JsonParser,
    JsonStreamer,
    RequiredParser,
    RequiredStreamer,
    parse_required,
)
from tandem.gateway.tools.named import NamedParser, NamedStreamer, parse_named

TOOL_PARSERS: dict[str, type] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "json": JsonParser,
}


def tool_parser(name: str) -> ToolParser:
    """The parser registered as ``name``; ValueError naming the known ones otherwise."""
    try:
        parser_class = TOOL_PARSERS[name]
    except KeyError:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ValueError(f"unknown tool-call parser {name!r} (known: {known})") from None
    parser: ToolParser = parser_class()
    return parser


__all__ = [
    "TOOL_PARSERS",
    "ArgumentsPiece",
    "CallStart",
    "ContentPiece",
    "Event",
    "HermesParser",
    "HermesStreamer",
    "JsonParser",
    "JsonStreamer",
    "NamedParser",
    "NamedStreamer",
    "ReasoningPiece",
    "RequiredParser",
    "RequiredStreamer",
    "ToolCall",
    "ToolParser",
    "ToolStreamer",
    "coalesce",
    "collect",
    "new_call_id",
    "parse_named",
    "parse_required",
    "tool_parser",
]
