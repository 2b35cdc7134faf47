"""Deterministic ids: the same source event yields the same derived ids on every replay."""

from __future__ import annotations

from collections.abc import Callable
from hashlib import sha1
from typing import Any
from uuid import UUID

from schemas.uuids import canonical, of_int

_digest: Callable[[bytes], Any]
try:  # CPython's own SHA-1: the same digest, with less overhead than OpenSSL's for short names
    from _sha1 import sha1 as _digest  # type: ignore[import-not-found,no-redef]  # no stubs
except ImportError:  # pragma: no cover - another interpreter
    _digest = sha1

ENGRAM_NAMESPACE = UUID("8f7d6b9e-3c1a-5e2f-9b4d-2a6c8e0f1b3d")

_NAMESPACE = ENGRAM_NAMESPACE.bytes
_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_SET = (0x8000 << 48) | (5 << 76)


def uuid5_of(name: str) -> UUID:
    """``uuid.uuid5(ENGRAM_NAMESPACE, name)``, without the generic constructor's checks."""
    value = int.from_bytes(_digest(_NAMESPACE + name.encode()).digest()) >> 32
    return of_int(value & _CLEAR | _SET)


def uuid5_str(name: str) -> str:
    """``str(uuid.uuid5(ENGRAM_NAMESPACE, name))``."""
    value = int.from_bytes(_digest(_NAMESPACE + name.encode()).digest()) >> 32
    return canonical(value & _CLEAR | _SET)


def derived_id(source_event_id: UUID, idx: int) -> UUID:
    """Id of the ``idx``-th change made by ``source_event_id``."""
    return uuid5_of(f"{source_event_id}:{idx}")
