"""Deterministic ids: the same source event yields the same derived ids on every replay."""

from __future__ import annotations

from collections.abc import Callable
from hashlib import sha1
from typing import Any, Final
from uuid import UUID

from schemas.uuids import CANONICAL, canonical, of_int

_digest: Callable[[bytes], Any]
try:  # CPython's own SHA-1: the same digest, with less overhead than OpenSSL's for short names
    from _sha1 import sha1 as _digest  # type: ignore[import-not-found,no-redef]  # no stubs
except ImportError:  # pragma: no cover - another interpreter
    _digest = sha1

ENGRAM_NAMESPACE = UUID("8f7d6b9e-3c1a-5e2f-9b4d-2a6c8e0f1b3d")

_NAMESPACE: Final = ENGRAM_NAMESPACE.bytes
_CLEAR: Final = ~((0xC000 << 48) | (0xF000 << 64))
_SET: Final = (0x8000 << 48) | (5 << 76)


def uuid5_of(name: str) -> UUID:
    """``uuid.uuid5(ENGRAM_NAMESPACE, name)``, without the generic constructor's checks."""
    if _native_int is not None:
        return of_int(_native_int(_NAMESPACE, name))
    return of_int(reference_uuid5_int(name))


def uuid5_str(name: str) -> str:
    """``str(uuid.uuid5(ENGRAM_NAMESPACE, name))``."""
    if _native_text is not None:
        return _native_text(_NAMESPACE, name)
    return canonical(reference_uuid5_int(name))


def reference_uuid5_int(name: str) -> int:
    """``uuid.uuid5(ENGRAM_NAMESPACE, name).int`` in Python: what ``processors._ids``
    (``processors/_ids.c``) computes in C where it is built."""
    value = int.from_bytes(_digest(_NAMESPACE + name.encode()).digest()) >> 32
    return value & _CLEAR | _SET


def text_of(value: int) -> str:
    """``str(UUID(int=value))`` (``schemas.uuids.canonical``, in C where it is built)."""
    if _native_text_of is not None:
        return _native_text_of(value)
    return canonical(value)


def canonical_text(text: str) -> str:
    """``str(UUID(text))``: ``text`` itself when it is already in that form (the usual
    case: a turn's id as the fold wrote it), without building the UUID. Raises
    ValueError as ``UUID`` does for what is not a UUID."""
    if len(text) == 36 and CANONICAL.fullmatch(text) is not None:
        return text
    return str(UUID(text))


def derived_id(source_event_id: UUID, idx: int) -> UUID:
    """Id of the ``idx``-th change made by ``source_event_id``."""
    return uuid5_of(f"{source_event_id}:{idx}")


def _load_native() -> Any:
    """``processors._ids``, or None where it is not built (``ENGRAM_PURE_PYTHON=1``)."""
    try:
        import processors._ids as native
    except ImportError:
        return None
    return native


# final names: compiled code reads them without a lookup in the module's globals
_NATIVE: Final = _load_native()
_native_int: Final[Callable[[bytes, str], int] | None] = _NATIVE and _NATIVE.uuid5_int
_native_text: Final[Callable[[bytes, str], str] | None] = _NATIVE and _NATIVE.uuid5_text
_native_text_of: Final[Callable[[int], str] | None] = _NATIVE and _NATIVE.text_of
