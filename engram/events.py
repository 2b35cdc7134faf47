"""Building events on the client side: fresh ids and the current time are set here,
never in the processors."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from schemas import Codec, Event

_CODEC = Codec()


def make_event(
    type: str,
    *,
    agent_id: str,
    body: Mapping[str, Any] | None = None,
    session_id: str | None = None,
    user_id: str | None = None,
    occurred_at: datetime | None = None,
    event_id: uuid.UUID | None = None,
    schema_version: int = 1,
) -> Event:
    """A validated event of ``type``; ``event_id`` defaults to a new UUID and
    ``occurred_at`` to now; ``schema_version``: the version of its type's schema the
    body was made for. Raises BadEvent with the reason if it is invalid."""
    return _CODEC.from_json_object(
        {
            "event_id": str(event_id or uuid.uuid4()),
            "type": type,
            "agent_id": agent_id,
            "session_id": session_id,
            "user_id": user_id,
            "occurred_at": (occurred_at or datetime.now(UTC)).isoformat(),
            "schema_version": schema_version,
            "body": dict(body or {}),
        }
    )
