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
(:meth:`schemas.codec.Codec.decode`), which reads them with the same parts giving
fastavro's dicts (:func:`compile_record_reader`, whose contract is its own).

Why: for the ingest bench's ``interaction.recorded`` (~284 bytes) fastavro's read cost
~8.4 µs (its logical types alone ~3 µs) and pydantic's validation ~4.3 µs; the fold
opens every sealed event of the log so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar, final

from mypy_extensions import mypyc_attr
from pydantic import BaseModel

from schemas.bare import bare
from schemas.wire import (
    KIND_BOOLEAN,
    KIND_DOUBLE,
    KIND_DOUBLES,
    KIND_LONG,
    KIND_OPTIONAL,
    KIND_OTHER,
    KIND_STRING,
    KIND_TIMESTAMP,
    KIND_UUID,
    present,
    read_blocks,
    read_boolean,
    read_double,
    read_string,
    read_timestamp_millis,
    read_uuid,
)
from schemas.wire import read_doubles as read_doubles  # re-exported
from schemas.wire import read_long as read_long  # re-exported

M = TypeVar("M", bound=BaseModel)
Read = Callable[[bytes, int], tuple[Any, int]]
"""Reads one value at ``data[at:]``: the value and the offset after it."""

_slots: Final = vars(BaseModel)
_DICT: Final = _slots["__dict__"]
_FIELDS: Final = _slots["__pydantic_fields_set__"]
_EXTRA: Final = _slots["__pydantic_extra__"]
_PRIVATE: Final = _slots["__pydantic_private__"]
_BARE: Final = bare
"""``bare`` as a final name: compiled code reads it without a lookup in the globals."""


def trusted(cls: type[M], values: dict[str, Any], given: set[str]) -> M:
    """An instance of ``cls`` holding ``values`` (every field of ``cls``, in
    declaration order, with the types validation would give), with ``given`` as its
    ``model_fields_set``, not validated (see :mod:`processors.build`)."""
    return _BARE(cls, _DICT, values, _FIELDS, given, _EXTRA, None, _PRIVATE, None)


def updated(model: M, changes: dict[str, Any]) -> M:
    """``model.model_copy(update=changes)`` for changes valid by construction."""
    values = {**model.__dict__, **changes}
    given = model.__pydantic_fields_set__ | changes.keys()
    return _BARE(type(model), _DICT, values, _FIELDS, given, _EXTRA, None, _PRIVATE, None)


@mypyc_attr(native_class=False)
class Unreadable(TypeError):
    """A schema or model outside what :func:`compile_reader` covers."""


def compile_reader(model: type[BaseModel], schema: dict[str, Any]) -> Read | None:
    """The reader of ``model``'s binary Avro body under ``schema`` (the schema
    :func:`schemas.avro.avro_schema` made of it), or None when either holds anything
    it does not cover."""
    try:
        return _compile(schema, model, {}, False)
    except Unreadable:
        return None


def compile_record_reader(model: type[BaseModel], schema: dict[str, Any]) -> Read | None:
    """The same reader giving, instead of models, the record fastavro reads: records
    as dicts, with the same values and value types. For bytes nobody vouches for, to
    be validated after (:meth:`schemas.avro.WriterSchema.read`).

    The contract: when it returns ``(record, end)`` for ``data[at:]``, fastavro's
    ``schemaless_reader`` reads the same record there and stops at ``end`` (a
    property test mutates valid bodies to hold it); on bytes it does not read so,
    it raises (never returning something fastavro would refuse or read otherwise),
    and the caller asks fastavro, whose answer or error stands."""
    try:
        return _compile(schema, model, {}, True)
    except Unreadable:
        return None


def _compile(schema: Any, tp: Any, named: dict[str, Read], as_dict: bool) -> Read:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    if isinstance(schema, list):
        if schema[:1] != ["null"] or len(schema) != 2:
            raise Unreadable(f"the union {schema!r}")
        return _optional(_compile(schema[1], _inner(tp), named, as_dict))
    kind = schema.get("type") if isinstance(schema, dict) else schema
    if kind == "record":
        return _record(schema, tp, named, as_dict)
    if kind == "array":
        if schema["items"] == "double":
            return read_doubles
        return _array(_compile(schema["items"], _item(tp, 0), named, as_dict))
    if kind == "map":
        return _map(_compile(schema["values"], _item(tp, 1), named, as_dict))
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


def _record(schema: dict[str, Any], tp: Any, named: dict[str, Read], as_dict: bool) -> Read:
    model = _bare(tp)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise Unreadable(f"{schema['name']} is not read into a model ({tp!r})")
    names = [f["name"] for f in schema["fields"]]
    if names != list(model.model_fields):
        raise Unreadable(f"{schema['name']} has not the fields of {model!r}")
    given = set(names)
    readers: list[Read] = []

    def read(data: bytes, at: int) -> tuple[Any, int]:  # until the fields are compiled
        return built(data, at)

    named[schema["name"]] = read  # before its fields: they may name it
    for field in schema["fields"]:
        annotation = model.model_fields[field["name"]].annotation
        readers.append(_compile(field["type"], annotation, named, as_dict))
    built = _Fields(model, names, given, readers, as_dict)
    return built


@final
class _Fields:
    """Reads a record's fields in turn. Compiled by mypyc (``setup.py``): a field
    whose type is a leaf (a string, a UUID, a long, a timestamp, a double, a boolean,
    an array of doubles, or the union of null and one of those) is read by a native
    call of :mod:`schemas.wire`'s reader, any other by calling its reader. It reads
    what calling each field's reader in turn reads (the leaves' readers are those
    functions; an optional leaf is read as :func:`_optional` reads it). It returns
    the model, or the dict of its fields (``as_dict``). The fields' calls written out
    and ``exec``-ed, which it replaces, ran as plain Python (~half of opening a sealed
    event by hand)."""

    def __init__(
        self,
        model: type[BaseModel],
        names: list[str],
        given: set[str],
        readers: list[Read],
        as_dict: bool,
    ) -> None:
        self.model = model
        self.names = names
        self.given = given
        self.readers = readers
        self.kinds = [_kind(read) for read in readers]
        self.as_dict = as_dict

    def __call__(self, data: bytes, at: int) -> tuple[Any, int]:
        values: dict[str, Any] = {}
        names = self.names
        kinds = self.kinds
        value: Any
        for i in range(len(names)):
            kind = kinds[i]
            if kind < KIND_OPTIONAL:
                value, at = _leaf(kind, data, at)
            elif kind < KIND_OTHER:
                if present(data, at):
                    value, at = _leaf(kind - KIND_OPTIONAL, data, at + 1)
                else:
                    value, at = None, at + 1
            else:
                value, at = self.readers[i](data, at)
            values[names[i]] = value
        if self.as_dict:
            return values, at
        return trusted(self.model, values, self.given), at


def _leaf(kind: int, data: bytes, at: int) -> tuple[Any, int]:
    """The value of the leaf ``kind`` at ``data[at:]`` and the offset after it."""
    if kind == KIND_STRING:
        return read_string(data, at)
    if kind == KIND_UUID:
        return read_uuid(data, at)
    if kind == KIND_LONG:
        return read_long(data, at)
    if kind == KIND_TIMESTAMP:
        return read_timestamp_millis(data, at)
    if kind == KIND_DOUBLE:
        return read_double(data, at)
    if kind == KIND_BOOLEAN:
        return read_boolean(data, at)
    return read_doubles(data, at)


def _kind(read: Read) -> int:
    """How :class:`_Fields` reads a field whose reader is ``read``."""
    if isinstance(read, _Optional):
        inner = _LEAF_KINDS.get(read.inner)
        return KIND_OTHER if inner is None else inner + KIND_OPTIONAL
    return _LEAF_KINDS.get(read, KIND_OTHER)


def _optional(inner: Read) -> Read:
    return _Optional(inner)


@final
class _Optional:
    """Reads the union of null and what ``inner`` reads."""

    def __init__(self, inner: Read) -> None:
        self.inner = inner

    def __call__(self, data: bytes, at: int) -> tuple[Any, int]:
        if present(data, at):
            return self.inner(data, at + 1)
        return None, at + 1


def _array(item: Read) -> Read:
    def read(data: bytes, at: int) -> tuple[Any, int]:
        values: list[Any] = []
        count, at = read_blocks(data, at)
        while count:
            for _ in range(count):
                value, at = item(data, at)
                values.append(value)
            count, at = read_blocks(data, at)
        return values, at

    return read


def _map(value_of: Read) -> Read:
    def read(data: bytes, at: int) -> tuple[Any, int]:
        values: dict[str, Any] = {}
        count, at = read_blocks(data, at)
        while count:
            for _ in range(count):
                key, at = read_string(data, at)
                values[key], at = value_of(data, at)
            count, at = read_blocks(data, at)
        return values, at

    return read


_LEAVES: dict[tuple[Any, Any], Read] = {
    ("string", None): read_string,
    ("string", "uuid"): read_uuid,
    ("long", None): read_long,
    ("long", "timestamp-millis"): read_timestamp_millis,
    ("double", None): read_double,
    ("boolean", None): read_boolean,
}
"""The readers of one value (compiled, :mod:`schemas.wire`)."""

_LEAF_KINDS: dict[Any, int] = {
    read_string: KIND_STRING,
    read_uuid: KIND_UUID,
    read_long: KIND_LONG,
    read_timestamp_millis: KIND_TIMESTAMP,
    read_double: KIND_DOUBLE,
    read_boolean: KIND_BOOLEAN,
    read_doubles: KIND_DOUBLES,
}
"""The kind of each leaf's reader, by :func:`_leaf`."""
