"""Read one call object, ``{"name": "f", "arguments": {…}}``, from text that arrives in pieces.

Used by the Hermes, JSON and ``tool_choice="required"`` formats. The reader
sends its events to a ``Sink`` as soon as they are decided:

- ``CallStart`` once the ``name`` string is complete (non-empty after trimming,
  printable); never earlier, since a start cannot be taken back;
- the arguments as ``ArgumentsPiece``s: an object value is emitted exactly as
  written, piece by piece while it arrives; a string value holding JSON (some
  models quote it) is decoded and emitted whole when it ends; ``null``, or no
  arguments key at all, is ``{}``. Arguments written before the name are held
  and emitted right after the ``CallStart``.

Other keys are checked as JSON and ignored. It breaks (``Scan.ERROR``) on text
that is not JSON, a name or arguments of the wrong type, a key given twice, and
an object without a name; the caller then releases the raw text as content.
"""

from __future__ import annotations

import json

from tandem.gateway.tools.calls import ArgumentsPiece
from tandem.gateway.tools.json_scan import WHITESPACE, Scan, ValueScanner
from tandem.gateway.tools.sink import Sink

ARGUMENT_KEYS = ("arguments", "parameters")

# Where the reader is in the call object itself (values inside are the scanner's).
_OPEN, _FIRST, _NEXT, _COLON, _VALUE_START, _VALUE, _AFTER = range(7)
# What the value being scanned is.
_KEY, _NAME, _ARGS_OBJECT, _ARGS_STRING, _ARGS_NULL, _OTHER = range(6)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _json_object_text(text: str) -> str | None:
    """A quoted arguments string → the arguments text, or None when it holds no JSON object."""
    text = text.strip(WHITESPACE)
    if not text:
        return "{}"
    try:
        text.encode("utf-8")  # a lone surrogate from a \\u escape cannot be sent on
        value = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError, UnicodeError):
        return None
    return text if isinstance(value, dict) else None


class CallReader:
    __slots__ = (
        "_arg_keys",
        "_args_seen",
        "_index",
        "_key",
        "_kind",
        "_name_seen",
        "_pending",
        "_scanner",
        "_sink",
        "_state",
        "_token",
    )

    def __init__(self, sink: Sink, arg_keys: tuple[str, ...] = ARGUMENT_KEYS) -> None:
        self._sink = sink
        self._arg_keys = arg_keys
        self._state = _OPEN
        self._scanner = ValueScanner()
        self._kind = _OTHER
        self._token: list[str] = []  # raw text of the key, name or quoted arguments being read
        self._key = ""
        self._index: int | None = None  # the call's index, once its CallStart is out
        self._name_seen = False
        self._args_seen = False
        self._pending: list[str] = []  # arguments text read before the name

    def feed(self, text: str, i: int = 0) -> tuple[int, Scan]:
        """Read ``text`` from ``i``: MORE (all read), DONE (just after the closing ``}``),
        or ERROR (at the first character that breaks the call)."""
        n, mark = len(text), i  # text[mark:i] is read but not yet given to the sink
        while i < n:
            state = self._state
            if state == _VALUE:
                j, status = self._scanner.scan(text, i)
                span = text[i:j]
                if self._kind == _ARGS_OBJECT:
                    if self._index is None:
                        self._pending.append(span)
                    elif span:
                        self._sink.raw(text[mark:j])
                        mark = j
                        self._sink.event(ArgumentsPiece(self._index, span))
                elif self._kind != _OTHER:
                    self._token.append(span)
                i = j
                if status is Scan.MORE:
                    break
                self._sink.raw(text[mark:i])
                mark = i
                if status is Scan.ERROR or not self._value_done():
                    return i, Scan.ERROR
                self._state = _COLON if self._kind == _KEY else _AFTER
                continue
            c = text[i]
            if c in WHITESPACE:
                i += 1
                continue
            if state == _VALUE_START:
                kind = self._classify(c)
                if kind is None:
                    break
                self._begin(kind)
                continue
            if state in (_FIRST, _NEXT) and c == '"':
                self._begin(_KEY)
                continue
            i += 1
            if state == _OPEN and c == "{":
                self._state = _FIRST
            elif state == _COLON and c == ":":
                self._state = _VALUE_START
            elif state == _AFTER and c == ",":
                self._state = _NEXT
            elif state in (_FIRST, _AFTER) and c == "}":
                self._sink.raw(text[mark:i])
                return i, self._close()
            else:
                i -= 1
                break
        self._sink.raw(text[mark:i])
        return i, (Scan.MORE if i == n else Scan.ERROR)

    def _begin(self, kind: int) -> None:
        self._kind, self._state = kind, _VALUE
        self._scanner, self._token = ValueScanner(), []

    def _classify(self, c: str) -> int | None:
        """The kind of value that starts with ``c`` under the current key; None: a broken call."""
        if self._key == "name":
            if self._name_seen or c != '"':
                return None
            self._name_seen = True
            return _NAME
        if self._key in self._arg_keys:
            if self._args_seen:
                return None
            self._args_seen = True
            return {"{": _ARGS_OBJECT, '"': _ARGS_STRING, "n": _ARGS_NULL}.get(c)
        return _OTHER

    def _value_done(self) -> bool:
        """A value ended; emit what it decides. False: it breaks the call."""
        kind = self._kind
        if kind in (_KEY, _NAME, _ARGS_STRING):
            try:
                decoded = json.loads("".join(self._token))
            except (ValueError, RecursionError):
                return False
            if not isinstance(decoded, str):
                return False
        if kind == _KEY:
            self._key = decoded
        elif kind == _NAME:
            name = decoded.strip()
            if not name or not name.isprintable():
                return False
            self._index = self._sink.start_call(name)
            self._arguments("".join(self._pending))
            self._pending = []
        elif kind == _ARGS_STRING:
            text = _json_object_text(decoded)
            if text is None:
                return False
            self._arguments(text)
        elif kind == _ARGS_NULL:
            self._arguments("{}")
        return True

    def _arguments(self, text: str) -> None:
        if self._index is None:
            self._pending.append(text)
        elif text:
            self._sink.event(ArgumentsPiece(self._index, text))

    def _close(self) -> Scan:
        if self._index is None:
            return Scan.ERROR  # no name: not a call
        if not self._args_seen:
            self._sink.event(ArgumentsPiece(self._index, "{}"))
        return Scan.DONE
