"""The error an engine raises for a request field it cannot honour as sent."""

from __future__ import annotations


class RefusedField(ValueError):
    """A request field an engine cannot honour as sent; ``code`` is its catalogued error.

    The servicer answers INVALID_ARGUMENT with the message and sends ``code`` in the
    trailing metadata (``tandem.errors.ERROR_CATALOGUE``), so the gateway can pass it on.
    """

    def __init__(self, message: str, code: str = "unsupported_parameter") -> None:
        super().__init__(message)
        self.code = code
