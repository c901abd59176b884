"""Tokenizer work that leaves the event loop free, and how to tell when it must.

``tokenizers``' ``Tokenizer.encode`` and ``decode`` hold the GIL for the whole call, so
moving them to a thread does not help: a 1 MB encode stalled every stream on the gateway for
about a second. The batch forms release the GIL while they work (``encode_batch_fast``,
which skips the character offsets the gateway never reads and so is the form used for every
text, and ``decode_batch``); what still
holds it is turning the result into Python objects, about 20 ms per million ids. So a long
input goes to a thread *and* through the batch form; a short one stays on the loop, where it
costs less than the thread hop.

Long inputs run on a pool of their own, one thread fewer than the CPUs (at least one): four
clients tokenizing at once on two cores once left the event loop a third of a core, and
every stream's tokens waited (``tandem/threadpools.py``).

Which inputs are long is decided before rendering, from every string the chat template may
render (:func:`more_text_than`): message text, tool-call names and arguments, reasoning,
tool definitions — not only the messages' ``content``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from tokenizers import Tokenizer

from tandem.gateway.body_shape import check_body_shape
from tandem.threadpools import BoundedPool, usable_cpus

T = TypeVar("T")

# Rendering and tokenizing cost roughly a microsecond per character: up to this many
# characters the work stays on the event loop (a thread hop costs more than the work).
INLINE_CHARS = 16_384
# Request bodies parsed on the event loop, at most (bytes).
INLINE_BODY_BYTES = 1 << 20
# Token ids decoded on the event loop, at most.
INLINE_TOKENS = 4096
# Rendering, tokenizing and serializing long inputs: one core is left to the event loop, and
# the threads run at a lower priority, so where they share a core with the loop the loop's
# token relaying goes first (as the image pool's processes do, --mm-workers-nice).
BACKGROUND_NICE = 10
TOKENIZE_POOL = BoundedPool("tandem-tokenize", lambda: usable_cpus() - 1, nice=BACKGROUND_NICE)


class TooManyTokens(ValueError):
    """The text encodes to more tokens than the caller can take (``count`` of them)."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} tokens")
        self.count = count


def encode_ids(
    tokenizer: Tokenizer,
    text: str,
    add_special_tokens: bool = False,
    at_most: int | None = None,
) -> list[int]:
    """``text``'s token ids (blocking); a long text is encoded without holding the GIL.

    ``at_most``: raise :class:`TooManyTokens` rather than build a list longer than that
    (the count is known first; turning two million ids into Python ints holds the GIL for
    about 25 ms, for a prompt that is refused anyway).
    """
    # The batch form for every length: skipping the offsets makes it cheaper than
    # ``encode`` even for one short text (measured: 20 to 30 % less CPU from 300 to 3000
    # characters), besides releasing the GIL for a long one.
    fast = getattr(tokenizer, "encode_batch_fast", None)
    if fast is not None:
        encoding = fast([text], add_special_tokens=add_special_tokens)[0]
    else:
        encoding = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if at_most is not None and len(encoding) > at_most:
        raise TooManyTokens(len(encoding))
    ids: list[int] = encoding.ids
    return ids


def decode_ids(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool) -> str:
    """The text of ``ids`` (blocking); many ids are decoded without holding the GIL."""
    if len(ids) <= INLINE_TOKENS:
        return str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))
    return str(tokenizer.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0])


async def off_loop_if(big: bool, work: Callable[[], T]) -> T:
    """``work()`` on the tokenizing pool when ``big``, else right here."""
    return await TOKENIZE_POOL.run(work) if big else work()


def more_text_than(values: Iterable[Any], limit: int = INLINE_CHARS) -> bool:
    """Whether the strings anywhere in ``values`` (dicts, lists, nested) hold more than
    ``limit`` characters.

    Each container and value counts one besides its text, so that a structure of many
    empty strings is not free either; the walk stops as soon as the limit is passed, so it
    costs at most about ``limit`` steps however large the input.
    """
    budget = limit
    stack: list[Any] = list(values)
    while stack:
        value = stack.pop()
        budget -= 1
        if isinstance(value, str):
            budget -= len(value)
        elif isinstance(value, dict | list | tuple):
            budget -= len(value)  # before copying its items: a huge one stops here
            if budget >= 0:
                stack.extend(value.items() if isinstance(value, dict) else value)
        if budget < 0:
            return True
    return False


# Items of a long list serialized by one call: a few milliseconds of holding the GIL.
_PIECE = 65_536


def json_in_pieces(answer: dict[str, Any]) -> bytes:
    """``answer`` as compact JSON (as ``http/json_bodies.py`` writes it), its long lists one
    piece at a time, so that the thread doing it gives the GIL back between pieces: one
    ``json.dumps`` of two million ids held it 0.4 s."""
    fields = []
    for key, value in answer.items():
        if isinstance(value, list) and len(value) > _PIECE:
            pieces = (_json(value[i : i + _PIECE])[1:-1] for i in range(0, len(value), _PIECE))
            text = "[" + ",".join(pieces) + "]"
        else:
            text = _json(value)
        fields.append(f"{_json(key)}:{text}")
    return ("{" + ",".join(fields) + "}").encode("utf-8")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def parse_large_off_loop(raw: bytes, parse: Callable[[bytes], T]) -> Awaitable[T]:
    """``parse(raw)``: on the event loop for a small body; for a large one on the
    tokenizing pool, after counting its objects and arrays (``gateway/body_shape.py``)."""
    if len(raw) <= INLINE_BODY_BYTES:
        return _now(parse(raw))

    def counted() -> T:
        check_body_shape(raw)
        return parse(raw)

    return TOKENIZE_POOL.run(counted)


async def _now(value: T) -> T:
    return value
