"""Deterministic ids: the same source event yields the same derived ids on every replay."""

from __future__ import annotations

from uuid import UUID, uuid5

ENGRAM_NAMESPACE = UUID("8f7d6b9e-3c1a-5e2f-9b4d-2a6c8e0f1b3d")


def derived_id(source_event_id: UUID, idx: int) -> UUID:
    """Id of the ``idx``-th change made by ``source_event_id``."""
    return uuid5(ENGRAM_NAMESPACE, f"{source_event_id}:{idx}")
