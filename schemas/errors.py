"""The one error type of decoding: data errors are values with a precise reason."""

from __future__ import annotations


class BadEvent(Exception):
    """Bytes that are not a valid engram event.

    ``reason`` says exactly what is wrong (for the dead-letter topic and for API
    callers); ``raw`` keeps the offending bytes, untouched.
    """

    def __init__(self, reason: str, raw: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw

    def __reduce__(self) -> tuple[type[BadEvent], tuple[str, bytes]]:
        return (BadEvent, (self.reason, self.raw))
