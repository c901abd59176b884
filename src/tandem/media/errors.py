"""Errors raised while acquiring media, with stable codes for the HTTP/gRPC edges.

    MediaError                 base; carries ``code`` and ``retryable``
    ├── MediaRefused           "media_url_refused": scheme, host, domain or path not allowed
    ├── MediaTooLarge          "media_too_large": byte cap or pixel (decompression-bomb) cap
    ├── MediaFetchFailed       "multimodal_processing_failed": network/origin failure;
    │                          retryable for timeouts, connection errors and origin 5xx
    └── MediaDecodeFailed      "multimodal_processing_failed": bytes are not a usable image

The gateway maps these codes to HTTP 400 (503 where ``retryable``); this package never imports
the gateway. Messages are meant for clients, so they never carry payloads: URLs go through
``describe_url`` first.
"""

from __future__ import annotations

_URL_PREVIEW_CHARS = 100


class MediaError(Exception):
    code: str = "multimodal_processing_failed"
    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            # Instance attribute shadows the class default only when the caller decides.
            self.retryable = retryable

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class MediaRefused(MediaError):
    code = "media_url_refused"


class MediaTooLarge(MediaError):
    code = "media_too_large"


class MediaFetchFailed(MediaError):
    code = "multimodal_processing_failed"


class MediaDecodeFailed(MediaError):
    code = "multimodal_processing_failed"


def describe_url(url: str) -> str:
    """A short, safe rendering of a URL for error messages and logs.

    A data URL is reduced to its header and length (its body may be megabytes of base64, and
    echoing it back would also echo the client's image into logs). Anything else is cut at
    about 100 characters.
    """
    if url[:5].lower() == "data:":
        header, _, body = url.partition(",")
        return f"{header[:_URL_PREVIEW_CHARS]},<{len(body)} chars>"
    if len(url) <= _URL_PREVIEW_CHARS:
        return url
    return f"{url[:_URL_PREVIEW_CHARS]}…<{len(url)} chars>"
