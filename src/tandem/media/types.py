"""Result type shared by the fetchers (kept apart so fetchers do not import each other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class FetchedMedia:
    # Encoded bytes exactly as fetched: the HTTP body, the base64-decoded data-URL payload,
    # or the file contents. This is what media_hash() hashes.
    data: bytes
    # As declared by the source (HTTP header or data-URL media type); informational only,
    # the decoder sniffs the real format from the bytes.
    content_type: str | None
    source_scheme: str

    def __repr__(self) -> str:
        # Never print the payload; it may be tens of megabytes.
        return (
            f"FetchedMedia({len(self.data)} bytes, content_type={self.content_type!r}, "
            f"source_scheme={self.source_scheme!r})"
        )
