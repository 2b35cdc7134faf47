"""UUIDs that keep their text: ``str(uuid)`` once, not once per use.

``uuid.UUID.__str__`` formats the 128-bit integer every time it is asked (~1 µs).
On the fold's road one event's id is turned into text about four times (the check
that an opened event matches its sealed envelope, the derived ids named after it, the
working-memory turn that quotes it, the derived events' Avro), and each derived
event's own id twice more (its Avro and its sealed envelope). :class:`TextUUID` is a
``UUID`` that keeps its canonical text beside its integer: the Avro reader gives it
the text it read (:mod:`schemas.reader`); the deterministic ids
(:mod:`processors.ids`) make theirs the first time it is asked for, once.

The contract: a ``TextUUID`` is a ``UUID`` in every respect (equality, hash, ordering,
``int``/``hex``/``bytes``, ``repr``, pydantic and fastavro serialisation), and its
``str`` is exactly ``UUID.__str__`` of the same integer: :func:`with_text` keeps a
text only when it is that canonical form. Copying or pickling gives a plain ``UUID``.
"""

from __future__ import annotations

import re
from typing import Any, Final
from uuid import UUID, SafeUUID

from mypy_extensions import mypyc_attr

from schemas.bare import bare

_INT: Final = vars(UUID)["int"]
_SAFE: Final = vars(UUID)["is_safe"]
_UNKNOWN: Final = SafeUUID.unknown
_BARE: Final = bare
"""``bare`` as a final name: compiled code reads it without a lookup in the globals."""
CANONICAL: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""``str(UUID(...))``'s form: lower-case hexadecimal digits, hyphens at 8, 13, 18, 23."""


@mypyc_attr(native_class=False)
class TextUUID(UUID):
    """A ``UUID`` holding its canonical text (see the module's contract)."""

    __slots__ = ("_text",)
    _text: str

    def __str__(self) -> str:
        try:
            text = self._text
        except AttributeError:  # made by UUID's own constructor
            text = ""
        if not text:  # not made yet: made once, now
            text = canonical(self.int)
            _set_text(self, text)
        return text

    def __repr__(self) -> str:
        return f"UUID({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return UUID, (str(self),)


_TEXT: Final = vars(TextUUID)["_text"]
_set_text: Final = _TEXT.__set__


def with_text(value: int, text: str) -> UUID:
    """The UUID of the 128-bit ``value`` whose text a reader found to be ``text``
    (``UUID(text).int == value``): a :class:`TextUUID` holding ``text`` when it is
    the canonical form (lowercase, hyphenated), else a plain ``UUID``."""
    if CANONICAL.fullmatch(text):
        return _BARE(TextUUID, _INT, value, _SAFE, _UNKNOWN, _TEXT, text)
    return _BARE(UUID, _INT, value, _SAFE, _UNKNOWN)


def of_int(value: int) -> TextUUID:
    """The UUID of the 128-bit ``value``; its text is made when it is first asked for
    (what :func:`processors.ids.uuid5_of` makes: the pure fold never asks, the
    worker asks for a derived event's id at least twice)."""
    return _BARE(TextUUID, _INT, value, _SAFE, _UNKNOWN, _TEXT, "")


def canonical(value: int) -> str:
    """``UUID.__str__`` of the 128-bit ``value``."""
    x = value.to_bytes(16).hex()  # f"{value:032x}", in a quarter less time
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"
