"""Errors of the public client."""

from __future__ import annotations

from schemas import BadEvent


class EngramError(Exception):
    """Base of every error the client raises on purpose."""


class NotRunning(EngramError):
    """No broker address is configured and no ``engram up`` is running."""


class PublishError(EngramError):
    """The log did not acknowledge the events before the deadline; nothing can be
    assumed about the ones in flight (publishing again is safe: ids deduplicate)."""


class PartlyPublished(PublishError):
    """A publish in batches failed after the first ``done`` events were acknowledged;
    the batch in flight (``pending`` events) may have reached the log in part.
    ``line``: the file line of the first event not acknowledged, when read from one."""

    def __init__(self, done: int, pending: int, cause: Exception, line: int | None = None):
        super().__init__(
            f"the first {done} events were acknowledged, then a batch of {pending} failed: {cause}"
        )
        self.done = done
        self.pending = pending
        self.cause = cause
        self.line = line


class BrokerUnavailable(PublishError):
    """Kafka could not be reached at ``bootstrap``: the client retried with backoff
    (0.1 s doubling up to 2 s) for ``deadline`` seconds (``Memory(timeout=...)``),
    ``attempts`` times; ``cause`` is the last error. Nothing of the batch was sent."""

    def __init__(
        self, bootstrap: str, deadline: float, attempts: int, cause: BaseException
    ) -> None:
        super().__init__(
            f"Kafka at {bootstrap} is unavailable: {attempts} attempts over {deadline:.1f}s"
            f" (the client's deadline) failed; last error: {cause!r}"
        )
        self.bootstrap = bootstrap
        self.deadline = deadline
        self.attempts = attempts
        self.cause = cause


class RejectedEvent(EngramError):
    """The server refused a batch; ``index`` and ``reason`` say which event and why."""

    def __init__(self, reason: str, index: int | None = None) -> None:
        where = f"event {index}: " if index is not None else ""
        super().__init__(f"{where}{reason}")
        self.reason = reason
        self.index = index


class RequestFailed(EngramError):
    """``engram up`` refused or could not answer a recall or snapshot request;
    ``status`` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, reason: str, status: int = 0) -> None:
        super().__init__(f"HTTP {status}: {reason}" if status else reason)
        self.reason = reason
        self.status = status


__all__ = [
    "BadEvent",
    "BrokerUnavailable",
    "EngramError",
    "NotRunning",
    "PublishError",
    "RejectedEvent",
    "RequestFailed",
]
