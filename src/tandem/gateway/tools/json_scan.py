"""Check one JSON value as its text arrives, without waiting for the end of it.

The tool-call streamers emit a call's arguments while the model is still writing
them, so they need to know at every character whether the text so far can still
be valid JSON, and where the value ends (a ``}`` inside a string does not end an
object). ``ValueScanner`` is that: a pushdown automaton over RFC 8259 JSON with
an explicit stack (no recursion, so no depth limit to trip over) that is fed the
text in any pieces. Python's ``json`` is laxer (``NaN``, ``Infinity``); this is
not, so what it accepts every JSON parser accepts.
"""

from __future__ import annotations

import re
from enum import Enum

WHITESPACE = " \t\n\r"  # JSON's whitespace, nothing else
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')  # characters a string holds as they are


class Scan(Enum):
    MORE = 0  # all of the text was consumed; the value goes on
    DONE = 1  # the value ended; the position is just after it
    ERROR = 2  # the position is at the character that cannot continue the value


# States. Numbers have their own states so that "-", "1." or "1e" never end a value.
_VALUE, _OBJ_FIRST, _OBJ_KEY, _COLON, _AFTER, _ARR_FIRST, _STRING, _ESCAPE, _HEXES, _LITERAL = (
    range(10)
)
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(10, 18)
_DONE_MARK = 99  # the outermost container just closed (seen only inside scan)
_NUMBER_ENDS = (_N_ZERO, _N_INT, _N_FRAC, _N_EXP)  # states a number may end in
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}


class ValueScanner:
    """Validates one JSON value fed in pieces; ``scan`` says where it stands."""

    __slots__ = ("_hex", "_key", "_literal", "_stack", "_state")

    def __init__(self) -> None:
        self._stack: list[str] = []  # open containers, "{" or "["
        self._state = _VALUE
        self._key = False  # the string being read is an object key
        self._literal = ""  # the rest of true/false/null still expected
        self._hex = 0  # hex digits still expected after \u

    def scan(self, text: str, i: int) -> tuple[int, Scan]:
        """Consume ``text`` from ``i``; a number ends only at the character after it."""
        n = len(text)
        while i < n:
            state = self._state
            if state == _STRING:
                match = _STRING_RUN.match(text, i)
                j = match.end() if match else i
                if j == n:
                    return n, Scan.MORE
                c = text[j]
                i = j + 1
                if c == "\\":
                    self._state = _ESCAPE
                elif c != '"':
                    return j, Scan.ERROR  # a raw control character
                elif self._key:
                    self._key = False
                    self._state = _COLON
                elif self._end_value():
                    return i, Scan.DONE
                continue
            c = text[i]
            if state >= _N_MINUS:
                ended = self._number(c)
                if ended is None:
                    return i, Scan.ERROR
                if not ended:
                    i += 1
                    continue
                if self._end_value():  # the number ended before c; c is read again
                    return i, Scan.DONE
                continue
            if state == _ESCAPE:
                if c == "u":
                    self._state, self._hex = _HEXES, 4
                elif c in '"\\/bfnrt':
                    self._state = _STRING
                else:
                    return i, Scan.ERROR
                i += 1
                continue
            if state == _HEXES:
                if c not in _HEX:
                    return i, Scan.ERROR
                self._hex -= 1
                if not self._hex:
                    self._state = _STRING
                i += 1
                continue
            if state == _LITERAL:
                if c != self._literal[0]:
                    return i, Scan.ERROR
                self._literal = self._literal[1:]
                i += 1
                if not self._literal and self._end_value():
                    return i, Scan.DONE
                continue
            if c in WHITESPACE:
                i += 1
                continue
            if not self._structural(c):
                return i, Scan.ERROR
            i += 1
            if self._state == _DONE_MARK:
                self._state = _AFTER
                return i, Scan.DONE
        return i, Scan.MORE

    def _structural(self, c: str) -> bool:
        """Outside strings, numbers and literals: take ``c`` (not whitespace) or refuse it."""
        state = self._state
        if state == _VALUE:
            if c in "{[":
                self._stack.append(c)
                self._state = _OBJ_FIRST if c == "{" else _ARR_FIRST
            elif c == '"':
                self._state = _STRING
            elif c in _LITERALS:
                self._state, self._literal = _LITERAL, _LITERALS[c]
            elif c == "-":
                self._state = _N_MINUS
            elif c in _DIGITS:
                self._state = _N_ZERO if c == "0" else _N_INT
            else:
                return False
            return True
        if state in (_OBJ_FIRST, _OBJ_KEY):
            if c == '"':
                self._state, self._key = _STRING, True
                return True
            return state == _OBJ_FIRST and c == "}" and self._close()
        if state == _COLON:
            if c == ":":
                self._state = _VALUE
                return True
            return False
        if state == _ARR_FIRST:
            if c == "]":
                return self._close()
            self._state = _VALUE
            return self._structural(c)
        # _AFTER: a value inside a container has ended (nothing is open after the whole value)
        if not self._stack:
            return False
        top = self._stack[-1]
        if c == ",":
            self._state = _OBJ_KEY if top == "{" else _VALUE
            return True
        return c == ("}" if top == "{" else "]") and self._close()

    def _close(self) -> bool:
        self._stack.pop()
        self._state = _DONE_MARK if not self._stack else _AFTER
        return True

    def _end_value(self) -> bool:
        """A scalar ended; True when it was the whole value."""
        self._state = _AFTER
        return not self._stack

    def _number(self, c: str) -> bool | None:
        """Advance a number by ``c``: False = consumed, True = ended before c, None = invalid."""
        state = self._state
        digit = c in _DIGITS
        if state == _N_MINUS:
            if not digit:
                return None
            self._state = _N_ZERO if c == "0" else _N_INT
        elif state in (_N_ZERO, _N_INT, _N_FRAC) and c in "eE":
            self._state = _N_E
        elif state in (_N_ZERO, _N_INT) and c == ".":
            self._state = _N_DOT
        elif digit and state in (_N_INT, _N_FRAC, _N_EXP):
            pass
        elif digit and state in (_N_DOT, _N_FRAC):
            self._state = _N_FRAC
        elif state == _N_E and c in "+-":
            self._state = _N_ESIGN
        elif digit and state in (_N_E, _N_ESIGN):
            self._state = _N_EXP
        elif state in _NUMBER_ENDS and not digit:
            return True
        else:
            return None
        return False
