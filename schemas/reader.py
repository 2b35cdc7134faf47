"""Reading back what engram wrote: Avro bodies to models, without validating again.

Everything engram seals was a validated model when it was encoded (the ingest hop
decodes and validates what producers send before it seals it; the fold builds its
derived events within their contracts). The bytes inside an authentic sealed event
are therefore the encoding of a valid event, and validating them again on the way
back in only repeats the answer. :func:`compile_reader` builds, once per current
schema, a reader that turns such a body straight into the model: each field read in
the schema's order, nested models included, every instance built as ``model_validate``
would build it from the dict fastavro reads (the same values and value types, every
field in ``model_fields_set``) but without the validation. A property test holds
``Codec.decode_trusted`` to ``Codec.decode`` for every event type.

The contract: a reader is only for bytes written with its own (current) schema by an
encoder of a valid model; on any other bytes it may raise anything or return a model
that validation would refuse. Whoever cannot vouch for the bytes validates
(:meth:`schemas.codec.Codec.decode`).

Why: for the ingest bench's ``interaction.recorded`` (~284 bytes) fastavro's read cost
~8.4 µs (its logical types alone ~3 µs) and pydantic's validation ~4.3 µs; the fold
opens every sealed event of the log so.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from pydantic import BaseModel

from schemas.uuids import with_text

M = TypeVar("M", bound=BaseModel)
Read = Callable[[bytes, int], tuple[Any, int]]
"""Reads one value at ``data[at:]``: the value and the offset after it."""

_new = object.__new__
_slots = vars(BaseModel)
_set_dict = _slots["__dict__"].__set__
_set_fields = _slots["__pydantic_fields_set__"].__set__
_set_extra = _slots["__pydantic_extra__"].__set__
_set_private = _slots["__pydantic_private__"].__set__


def trusted(cls: type[M], values: dict[str, Any], given: set[str]) -> M:
    """An instance of ``cls`` holding ``values`` (every field of ``cls``, in
    declaration order, with the types validation would give), with ``given`` as its
    ``model_fields_set``, not validated (see :mod:`processors.build`)."""
    model: M = _new(cls)
    _set_dict(model, values)
    _set_fields(model, given)
    _set_extra(model, None)
    _set_private(model, None)
    return model


def updated(model: M, changes: dict[str, Any]) -> M:
    """``model.model_copy(update=changes)`` for changes valid by construction."""
    copy: M = _new(type(model))
    _set_dict(copy, {**model.__dict__, **changes})
    _set_fields(copy, model.__pydantic_fields_set__ | changes.keys())
    _set_extra(copy, None)
    _set_private(copy, None)
    return copy


class Unreadable(TypeError):
    """A schema or model outside what :func:`compile_reader` covers."""


def compile_reader(model: type[BaseModel], schema: dict[str, Any]) -> Read | None:
    """The reader of ``model``'s binary Avro body under ``schema`` (the schema
    :func:`schemas.avro.avro_schema` made of it), or None when either holds anything
    it does not cover."""
    try:
        return _compile(schema, model, {})
    except Unreadable:
        return None


def _compile(schema: Any, tp: Any, named: dict[str, Read]) -> Read:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    if isinstance(schema, list):
        if schema[:1] != ["null"] or len(schema) != 2:
            raise Unreadable(f"the union {schema!r}")
        return _optional(_compile(schema[1], _inner(tp), named))
    kind = schema.get("type") if isinstance(schema, dict) else schema
    if kind == "record":
        return _record(schema, tp, named)
    if kind == "array":
        if schema["items"] == "double":
            return read_doubles
        return _array(_compile(schema["items"], _item(tp, 0), named))
    if kind == "map":
        return _map(_compile(schema["values"], _item(tp, 1), named))
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    leaf = _LEAVES.get((kind, logical))
    if leaf is None:
        raise Unreadable(f"{kind!r} ({logical})")
    return leaf


def _bare(tp: Any) -> Any:
    """``tp`` without ``Annotated`` (constraints are what validation checks)."""
    while getattr(tp, "__metadata__", None) is not None:
        tp = tp.__origin__
    return tp


def _inner(tp: Any) -> Any:
    args = [a for a in getattr(_bare(tp), "__args__", ()) if a is not type(None)]
    return args[0] if len(args) == 1 else None


def _item(tp: Any, index: int) -> Any:
    args = getattr(_bare(tp), "__args__", ())
    return args[index] if len(args) > index else None


def _record(schema: dict[str, Any], tp: Any, named: dict[str, Read]) -> Read:
    model = _bare(tp)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise Unreadable(f"{schema['name']} is not read into a model ({tp!r})")
    names = [f["name"] for f in schema["fields"]]
    if names != list(model.model_fields):
        raise Unreadable(f"{schema['name']} has not the fields of {model!r}")
    given = set(names)
    readers: dict[str, Read] = {}

    def read(data: bytes, at: int) -> tuple[Any, int]:  # until the fields are compiled
        return built(data, at)

    named[schema["name"]] = read  # before its fields: they may name it
    for field in schema["fields"]:
        annotation = model.model_fields[field["name"]].annotation
        readers[f"r{len(readers)}"] = _compile(field["type"], annotation, named)
    built = _unrolled(model, names, given, readers)
    return built


def _unrolled(
    model: type[BaseModel], names: list[str], given: set[str], readers: dict[str, Read]
) -> Read:
    """One function reading the fields in turn, written out (as ``dataclasses``
    writes its ``__init__``): a loop over (name, reader) pairs cost ~0.15 µs a field
    more."""
    lines = ["def read(data, at):"]
    lines += [f"    v{i}, at = r{i}(data, at)" for i in range(len(names))]
    values = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
    lines.append(f"    return trusted(model, {{{values}}}, given), at")
    scope: dict[str, Any] = {**readers, "trusted": trusted, "model": model, "given": given}
    exec("\n".join(lines), scope)  # the names are field names: identifiers
    read: Read = scope["read"]
    return read


def _optional(inner: Read) -> Read:
    def read(data: bytes, at: int) -> tuple[Any, int]:
        branch = data[at]
        if branch == 0:
            return None, at + 1
        if branch != 2:
            raise ValueError(f"union branch byte {branch}")
        return inner(data, at + 1)

    return read


def _blocks(data: bytes, at: int) -> tuple[int, int]:
    """The count of the next block of an array or map (its byte size skipped)."""
    count, at = read_long(data, at)
    if count < 0:
        count = -count
        _, at = read_long(data, at)
    return count, at


def _array(item: Read) -> Read:
    def read(data: bytes, at: int) -> tuple[Any, int]:
        values: list[Any] = []
        count, at = _blocks(data, at)
        while count:
            for _ in range(count):
                value, at = item(data, at)
                values.append(value)
            count, at = _blocks(data, at)
        return values, at

    return read


def read_doubles(data: bytes, at: int) -> tuple[Any, int]:
    """An Avro array of doubles at ``data[at:]`` (a recorded vector): its values and
    the offset after it, each block (a zigzag count, 0 ends; negative: a byte size
    follows) unpacked whole; ValueError when one runs past the end."""
    values: list[float] = []
    count, at = _blocks(data, at)
    while count:
        end = at + 8 * count
        if end > len(data):
            raise ValueError("an array of doubles out of bounds")
        values += struct.unpack_from(f"<{count}d", data, at)
        at = end
        count, at = _blocks(data, at)
    return values, at


def _map(value_of: Read) -> Read:
    def read(data: bytes, at: int) -> tuple[Any, int]:
        values: dict[str, Any] = {}
        count, at = _blocks(data, at)
        while count:
            for _ in range(count):
                key, at = _string(data, at)
                values[key], at = value_of(data, at)
            count, at = _blocks(data, at)
        return values, at

    return read


def read_long(data: bytes, at: int) -> tuple[int, int]:
    """An Avro long (a zigzag varint of at most 10 bytes) at ``data[at:]`` and the
    offset after it; ValueError past 10 bytes, IndexError at the end of ``data``."""
    byte = data[at]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), at + 1
    value, shift, end = byte & 0x7F, 7, at + 10
    at += 1
    while at < end:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (value >> 1) ^ -(value & 1), at
        shift += 7
    raise ValueError("varint over 10 bytes")


def _string(data: bytes, at: int) -> tuple[Any, int]:
    size = data[at]
    if size < 0x80:
        at += 1
        size >>= 1  # a non-negative length: zigzag is a shift
    else:
        size, at = read_long(data, at)
    end = at + size
    if size < 0 or end > len(data):
        raise ValueError("a string out of bounds")
    return data[at:end].decode(), end


def _uuid(data: bytes, at: int) -> tuple[Any, int]:
    """``UUID(text)`` as fastavro reads it; for the hyphenated form (what engram
    writes) the same value built without ``UUID.__init__``'s parsing, and holding
    ``text`` when that is its canonical text (:func:`schemas.uuids.with_text`)."""
    text, at = _string(data, at)
    if len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-":
        return with_text(int(text.replace("-", ""), 16), text), at
    return UUID(text), at


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EXACT = 2**32 * 1000
"""Below 2**32 seconds (the year 2106) half a float's ulp is under 0.24 µs, so
``fromtimestamp`` of milliseconds / 1000 rounds to the exact millisecond."""
_at = datetime.fromtimestamp


def _timestamp_millis(data: bytes, at: int) -> tuple[Any, int]:
    """As fastavro reads it (the epoch plus a timedelta: an aware UTC datetime);
    ``fromtimestamp`` (half the cost) where that is exact."""
    millis, at = read_long(data, at)
    if 0 <= millis < _EXACT:
        return _at(millis / 1000, UTC), at
    return _EPOCH + timedelta(milliseconds=millis), at


_DOUBLE = struct.Struct("<d").unpack_from


def _double(data: bytes, at: int) -> tuple[Any, int]:
    return _DOUBLE(data, at)[0], at + 8


def _boolean(data: bytes, at: int) -> tuple[Any, int]:
    byte = data[at]
    if byte > 1:
        raise ValueError(f"boolean byte {byte}")
    return byte == 1, at + 1


_LEAVES: dict[tuple[Any, Any], Read] = {
    ("string", None): _string,
    ("string", "uuid"): _uuid,
    ("long", None): read_long,
    ("long", "timestamp-millis"): _timestamp_millis,
    ("double", None): _double,
    ("boolean", None): _boolean,
}
