"""How many JSON objects and arrays a large request body holds, counted before parsing it.

Parsing JSON holds the GIL for the whole document (pydantic-core, like ``json.loads``), and
what it costs is mostly the number of values, not the bytes: a 15 MiB schema of small
properties held it about half a second, while a 60 MiB body that is one data URL parses in
milliseconds. No request this gateway serves needs tens of thousands of objects and arrays
(messages, content parts, tools and their schemas are each one), so a large body is counted
first. Its ``{`` and ``[`` bytes, strings included, are an upper bound found at ``memchr``
speed; only a body over the limit by that bound is scanned exactly, a scan that gives the
GIL back between matches: each string is skipped by one regular-expression match, each
``{`` or ``[`` counted, and the scan stops at the limit. A body over it is refused (413
``payload_too_large``) before any parser sees it (docs/operations.md, "Limits").
"""

from __future__ import annotations

import re

from tandem.errors import TandemError, make_error

# Objects and arrays in one request body, at most.
MAX_CONTAINERS = 50_000
# A JSON string (escapes included), or the start of an object or array. What is between
# (numbers, literals, punctuation, whitespace) the search skips without a match.
# (The string pattern is the unrolled form: runs without escapes are one tight loop.)
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{\[]', re.DOTALL)


def containers_over(raw: bytes, limit: int = MAX_CONTAINERS) -> bool:
    """Whether ``raw`` holds more than ``limit`` objects and arrays outside its strings.

    Malformed JSON is not this function's business: an unterminated string simply ends the
    count, and the parser refuses the body afterwards.
    """
    if not _bytes_over(raw, limit):
        return False
    count = 0
    for match in _TOKEN.finditer(raw):
        if match.end() - match.start() == 1 and raw[match.start()] in b"{[":
            count += 1
            if count > limit:
                return True
    return False


def _bytes_over(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` holds more than ``limit`` ``{`` and ``[`` bytes, strings included.

    That bounds the count from above, and it is found with ``bytes.find``, a ``memchr``
    per byte found: a body of images (base64 has neither byte) is cleared about 150 times
    faster than by the regular-expression scan, which took 5 ms of each 1.3 MiB chat turn
    (docs/performance.md, "Counting a large body's objects"). ``bytes.count`` is a plain
    loop over every byte, ten times slower than this on such a body.
    """
    count = 0
    for opener in (b"{", b"["):
        at = raw.find(opener)
        while at >= 0:
            count += 1
            if count > limit:
                return True
            at = raw.find(opener, at + 1)
    return False


def check_body_shape(raw: bytes) -> None:
    """413 ``payload_too_large`` for a body over :data:`MAX_CONTAINERS`."""
    if containers_over(raw):
        raise too_complex()


def too_complex() -> TandemError:
    return make_error(
        "payload_too_large",
        f"the request body holds more than {MAX_CONTAINERS} JSON objects and arrays",
    )
