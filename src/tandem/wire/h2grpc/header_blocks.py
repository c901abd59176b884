"""HPACK decoding that remembers repeated header blocks.

A gRPC server answers every call on a connection with the same response headers and,
for a successful call, the same trailers; after the first call they are a few bytes of
references into the connection's dynamic table (``88 c0 bf``). Decoding them again costs
more than the rest of a short stream's framing, so a block is looked up first. The
result of a block depends on the dynamic table, so a block is remembered only when
decoding it left the table as it was, and everything remembered is forgotten whenever
a block changes the table.
"""

from __future__ import annotations

from typing import Any

import hpack

Fields = list[tuple[str, str]]  # (name, value), decoded as latin-1 as HTTP/2 allows
MAX_REMEMBERED = 64  # distinct blocks; more (a server varying its headers) starts over


class HeaderBlockDecoder:
    def __init__(self) -> None:
        self._decoder = hpack.Decoder()
        self._table = self._decoder.header_table
        self._known: dict[bytes, Fields] = {}

    def decode(self, block: bytes) -> Fields:
        """The fields of ``block``; the caller must not change the list it gets."""
        fields = self._known.get(block)
        if fields is not None:
            return fields
        before = self._table_state()
        raw = self._decoder.decode(block, raw=True)
        fields = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in raw]
        if self._same_table(before):
            if len(self._known) >= MAX_REMEMBERED:
                self._known.clear()
            self._known[block] = fields
        else:
            self._known.clear()
        return fields

    def _table_state(self) -> tuple[int, Any, int]:
        entries = self._table.dynamic_entries
        return len(entries), entries[0] if entries else None, self._table.maxsize

    def _same_table(self, before: tuple[int, Any, int]) -> bool:
        # An insertion puts a new tuple at the front (``is`` tells it from an equal old
        # one, which ``before`` keeps alive); evictions change the length; a size update
        # changes maxsize.
        length, first, maxsize = self._table_state()
        return length == before[0] and first is before[1] and maxsize == before[2]
