"""Media identity hash: BLAKE3-256, lowercase hex, of the encoded bytes as fetched.

Hashing the encoded bytes (not decoded pixels) gives the ``mm_hashes`` smg computes and makes
the hash independent of decoder versions (docs/pd-contract.md §4).
"""

from __future__ import annotations

from blake3 import blake3


def media_hash(data: bytes) -> str:
    """64 lowercase hex chars; ``data`` is the HTTP body, decoded data-URL payload or file."""
    return blake3(data).hexdigest()
