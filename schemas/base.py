"""Shared building blocks of every event contract: the frozen model base, the
envelope, and the field types with their wire rules (aware UTC datetimes at
millisecond precision, bounded identifiers)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, ClassVar
from uuid import UUID

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field


class Model(BaseModel):
    """Frozen, closed value: unknown fields are an error, instances never change.

    Floats must be finite: JSON has no NaN or infinity (they would serialise as null).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


def _utc_millis(value: datetime) -> datetime:
    """Normalise an aware datetime to UTC, truncated to the millisecond (the wire precision)."""
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("datetime out of range once converted to UTC") from None
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


UtcMillis = Annotated[AwareDatetime, AfterValidator(_utc_millis)]
"""An aware datetime, stored as UTC milliseconds (Avro ``timestamp-millis``)."""

Ident = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f]+$")]
"""An identifier chosen by the caller (agent, user, session): 1-256 printable characters."""

Unit = Annotated[float, Field(ge=0.0, le=1.0)]
Signed = Annotated[float, Field(ge=-1.0, le=1.0)]
Importance = Annotated[float, Field(ge=1.0, le=10.0)]

INT64_MAX = 2**63 - 1
"""Largest Avro ``long``: every int field is bounded by it, so every valid event encodes."""


class Event(Model):
    """The envelope every event carries; subclasses add ``type`` and a typed ``body``.

    ``event_id`` is the producer's idempotency key: the pipeline keeps the first
    event with a given id per agent and drops later copies.
    """

    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1

    event_id: UUID
    type: str
    agent_id: Ident
    session_id: Ident | None = None
    user_id: Ident | None = None
    occurred_at: UtcMillis
    schema_version: Annotated[int, Field(ge=1, le=INT64_MAX)] = 1


class DerivedEvent(Event):
    """A memory change on ``engram.memory``, made by a processor from a raw event.

    ``event_id`` is a ``uuid5`` of ``source_event_id`` and ``idx``, so replays make
    the same ids; ``seq`` is the per-agent sequence of the source event in log
    order and ``idx`` the position of this change among those the source made;
    ``config_version`` names the parameters that decided the change.
    """

    source_event_id: UUID
    seq: Annotated[int, Field(ge=0, le=INT64_MAX)]
    idx: Annotated[int, Field(ge=0, le=INT64_MAX)] = 0
    config_version: str
