"""The byte-level BPE alphabet (GPT-2's): one printable character stands for each byte.

Byte-level tokenizers (GPT-2, Qwen, the built-in models) spell every token as a string of
these characters, so a token's exact bytes are its characters mapped back, even when the
token ends inside a UTF-8 character and cannot be decoded to text on its own.
"""

from __future__ import annotations

from functools import cache

BYTE_VALUES = 256


def byte_symbols() -> list[str]:
    """The printable stand-in character of each byte value, in byte order."""
    printable = (
        set(range(ord("!"), ord("~") + 1))
        | set(range(ord("¡"), ord("¬") + 1))
        | set(range(ord("®"), ord("ÿ") + 1))
    )
    symbols: list[str] = []
    shifted = 0
    for byte in range(BYTE_VALUES):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            # Control and whitespace bytes get code points past 255, as GPT-2 does.
            symbols.append(chr(BYTE_VALUES + shifted))
            shifted += 1
    return symbols


@cache
def symbol_bytes() -> dict[str, int]:
    """Stand-in character → byte value."""
    return {symbol: byte for byte, symbol in enumerate(byte_symbols())}


def token_bytes(spelling: str) -> bytes | None:
    """The bytes a byte-level token spelling stands for; None if it is not one."""
    table = symbol_bytes()
    try:
        return bytes(table[ch] for ch in spelling)
    except KeyError:
        return None
