"""Avro schemas derived from the pydantic models, and the single-object encoding.

The ``.avsc`` files under ``schemas/avsc/`` are the published contracts; they are
generated from the models by :func:`write_avsc` and a unit test keeps the two in
step. Older versions stay in that folder so that readers resolve any writer
schema they meet by its fingerprint (schema evolution).
"""

from __future__ import annotations

import functools
import io
import json
import types
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from uuid import UUID

import fastavro
import fastavro.schema
from pydantic import AwareDatetime, BaseModel, PlainSerializer, WrapSerializer

from schemas.base import DerivedEvent, Event
from schemas.errors import BadEvent
from schemas.reader import compile_reader, compile_record_reader, read_doubles
from schemas.wire import (
    ArrayWriter,
    MapWriter,
    OptionalWriter,
    RecordWriter,
    write_boolean,
    write_double,
    write_doubles,
    write_long_value,
    write_string,
    write_strings,
    write_timestamp_millis,
    write_uuid,
    writer_spec,
)
from schemas.wire import epoch_millis as epoch_millis  # re-exported
from schemas.wire import write_bytes as write_bytes  # re-exported
from schemas.wire import write_long as write_long  # re-exported

try:
    import schemas._avro as _avro
except ImportError:  # installed without compiling (ENGRAM_PURE_PYTHON=1)
    _avro = None  # type: ignore[assignment]

MAGIC = b"\xc3\x01"
AVSC_DIR = Path(__file__).with_name("avsc")

AvroSchema = dict[str, Any]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _avro_type(tp: Any, seen: set[str], namespace: str) -> Any:
    """Map one Python annotation onto its Avro type (the subset our models use)."""
    origin = get_origin(tp)
    if origin is Annotated:
        return _avro_type(get_args(tp)[0], seen, namespace)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"only Optional unions map to Avro: {tp!r}")
        return ["null", _avro_type(inner[0], seen, namespace)]
    if origin is Literal:
        return "string"
    if origin is list:
        return {"type": "array", "items": _avro_type(get_args(tp)[0], seen, namespace)}
    if origin is dict:
        return {"type": "map", "values": _avro_type(get_args(tp)[1], seen, namespace)}
    if _is_model(tp):
        return _record(tp, seen, namespace)
    simple: dict[Any, Any] = {
        str: "string",
        int: "long",
        float: "double",
        bool: "boolean",
        UUID: {"type": "string", "logicalType": "uuid"},
    }
    if tp in simple:
        return simple[tp]
    if tp is AwareDatetime or (isinstance(tp, type) and issubclass(tp, datetime)):
        return {"type": "long", "logicalType": "timestamp-millis"}
    raise TypeError(f"no Avro mapping for {tp!r}")


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def _record(model: type[BaseModel], seen: set[str], namespace: str) -> Any:
    name = f"{namespace}.{model.__name__}"
    if name in seen:
        return name
    seen.add(name)
    fields: list[dict[str, Any]] = []
    for field_name, info in model.model_fields.items():
        field: dict[str, Any] = {
            "name": field_name,
            "type": _avro_type(info.annotation, seen, namespace),
        }
        if not info.is_required():
            field["default"] = _default(info.get_default(call_default_factory=True))
        fields.append(field)
    record: dict[str, Any] = {"type": "record", "name": name, "fields": fields}
    if model.__doc__ and model.__module__.startswith("schemas."):
        record["doc"] = " ".join(model.__doc__.split())
    return record


def avro_schema(event_type: type[Event]) -> AvroSchema:
    """The Avro schema of an event type, as a JSON-ready dict."""
    namespace = "engram.memory" if issubclass(event_type, DerivedEvent) else "engram.events"
    schema: AvroSchema = _record(event_type, set(), namespace)
    return schema


def fingerprint(schema: AvroSchema) -> bytes:
    """The 8-byte little-endian CRC-64-AVRO fingerprint of a schema's canonical form."""
    return _crc64_avro(fastavro.schema.to_parsing_canonical_form(fastavro.parse_schema(schema)))


@functools.lru_cache(maxsize=1024)
def _crc64_avro(canonical: str) -> bytes:
    """The fingerprint of a canonical form, remembered: fastavro computes it in Python
    (about 0.5 ms a schema), and every :class:`~schemas.codec.Codec` fingerprints each
    writer schema it knows (61 today: 30 of its 33 ms)."""
    return bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))


def avsc_name(event_type: type[Event]) -> str:
    return f"{event_type.TYPE}.v{event_type.SCHEMA_VERSION}.avsc"


def write_avsc(event_types: tuple[type[Event], ...], folder: Path = AVSC_DIR) -> list[Path]:
    """(Re)write the current ``.avsc`` file of each type; older versions are kept."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for event_type in event_types:
        path = folder / avsc_name(event_type)
        path.write_text(json.dumps(avro_schema(event_type), indent=2, ensure_ascii=False) + "\n")
        written.append(path)
    return written


class AvroType:
    """One event type's current schema, parsed once: encode and resolve."""

    def __init__(self, event_type: type[Event]) -> None:
        self.event_type = event_type
        self.schema = avro_schema(event_type)
        self.parsed = fastavro.parse_schema(self.schema)
        self.header = MAGIC + fingerprint(self.schema)
        self.write = compile_writer(event_type, self.schema)
        self.native = native_writer(self.write)
        """The same writer in C (``schemas/_avro.c``), where it is built."""

    def encode(self, event: Event) -> bytes:
        """Single-object encoding: ``C3 01``, fingerprint, binary body. The compiled
        writer's (:func:`compile_writer`, in C where it is built), or fastavro's for a
        type it does not cover or a value it does not expect, which fastavro then
        writes or refuses as before (a lone surrogate: UnicodeEncodeError)."""
        if self.write is None:
            return self.encode_fastavro(event)
        try:
            return self.encode_compiled(event)
        except Exception:  # not what validation gives: fastavro's road says what it is
            return self.encode_fastavro(event)

    def encode_compiled(self, event: Event) -> bytes:
        """The compiled writer's bytes of ``event``, with no fallback (for tests):
        raises what it raises, and Unsupported for a type it does not cover. In C
        (:attr:`native`) where it is built, else :meth:`encode_tree`."""
        if self.native is not None:
            return self.native.encode(event, self.header)  # type: ignore[no-any-return]
        return self.encode_tree(event)

    def encode_tree(self, event: Event) -> bytes:
        """The writer tree's bytes of ``event`` (:func:`compile_writer`, the reference
        of the writer in C), with no fallback."""
        if self.write is None:
            raise Unsupported(f"no compiled writer for {self.event_type.TYPE}")
        out = [self.header]
        self.write(event, out)
        return b"".join(out)

    def encode_fastavro(self, event: Event) -> bytes:
        """The same bytes by fastavro, from ``event.model_dump()``."""
        buffer = io.BytesIO()
        buffer.write(self.header)
        fastavro.schemaless_writer(buffer, self.parsed, event.model_dump())
        return buffer.getvalue()


class WriterSchema:
    """A schema some writer used (current or older), resolved to the current reader."""

    def __init__(self, schema: AvroSchema, reader: AvroType, *, same: bool = False) -> None:
        self.parsed = reader.parsed if same else fastavro.parse_schema(schema)
        self.reader = reader
        self.tail = DoublesTail.of(schema) if same else None
        self.trusted = compile_reader(reader.event_type, schema) if same else None
        """The current schema's reader of bytes engram wrote (:mod:`schemas.reader`)."""
        self.records = compile_record_reader(reader.event_type, schema) if same else None
        """The current schema's reader of records as fastavro reads them, where it
        reads them (:func:`schemas.reader.compile_record_reader`)."""

    def read(self, body: bytes) -> dict[str, Any]:
        """The record fastavro reads from the whole of ``body`` (resolved to the
        current schema), or what fastavro raises. Under the current schema the
        compiled record reader reads it (~4–6 µs for the ingest bench's
        ``interaction.recorded``, fastavro ~11 µs); fastavro reads what that one
        does not read whole."""
        if self.records is not None:
            try:
                record, end = self.records(body, 0)
            except Exception:  # fastavro's answer, or its error, stands
                pass
            else:
                if end == len(body):
                    return record  # type: ignore[no-any-return]
        if self.tail is not None:
            return self.tail.read(body)
        reader = None if self.parsed is self.reader.parsed else self.reader.parsed
        return _read_whole(body, self.parsed, reader)


def _read_whole(body: bytes, parsed: Any, reader: Any = None) -> dict[str, Any]:
    record, end = _read_head(body, parsed, reader)
    return _ended(record, body, end)


def _read_head(body: bytes, parsed: Any, reader: Any = None) -> tuple[dict[str, Any], int]:
    """The record fastavro reads at the start of ``body`` and the offset after it."""
    buffer = io.BytesIO(body)
    record = fastavro.schemaless_reader(buffer, parsed, reader)
    if not isinstance(record, dict):
        raise TypeError(f"Avro body decoded to {type(record).__name__}, not a record")
    return record, buffer.tell()


def _ended(record: dict[str, Any], body: bytes, end: int) -> dict[str, Any]:
    """``record`` if it ends ``body``: one datum per message, the rest is not ours."""
    if end != len(body):
        raise ValueError(f"{len(body) - end} bytes after the end of the record")
    return record


class DoublesTail:
    """Reads a record whose last field, nested through last record fields, is an
    array of doubles (a recorded vector): fastavro reads everything before it with
    the schema cut there, the array's blocks are unpacked whole. fastavro builds a
    float per item in a loop (~50 µs for 512 of them); ``struct`` takes ~5 µs. The
    result equals fastavro's read of the whole schema (a property test holds it)."""

    def __init__(self, head: Any, path: tuple[str, ...]) -> None:
        self.head = head
        self.path = path

    @classmethod
    def of(cls, schema: AvroSchema) -> DoublesTail | None:
        """The reader for ``schema``, or None when it does not end so."""
        cut = json.loads(json.dumps(schema))
        node, path = cut, []
        while isinstance(node, dict) and node.get("type") == "record" and node.get("fields"):
            last = node["fields"][-1]
            path.append(last["name"])
            kind = last["type"]
            if kind == {"type": "array", "items": "double"}:
                node["fields"] = node["fields"][:-1]
                return cls(fastavro.parse_schema(cut), tuple(path))
            node = kind
        return None

    def read(self, body: bytes) -> dict[str, Any]:
        record, start = _read_head(body, self.head)
        values, end = read_doubles(body, start)
        node = record
        for name in self.path[:-1]:
            node = node[name]
        node[self.path[-1]] = values
        return _ended(record, body, end)


# -- the compiled writer ---------------------------------------------------------------

Write = Callable[[Any, list[bytes]], None]
"""Appends the Avro binary form of one value to a list of byte strings."""


class Unsupported(TypeError):
    """A schema or model outside what :func:`compile_writer` covers."""


def compile_writer(model: type[BaseModel], schema: AvroSchema) -> Write | None:
    """The writer of ``model``'s binary Avro body under ``schema`` (the schema
    :func:`avro_schema` made of it), or None when either holds anything it does not
    cover (fastavro writes that type).

    Why: fastavro resolves the schema on every call, and ``model_dump`` first builds
    the dict it reads; for a ``working.updated`` (~389 bytes) that was ~4.8 µs of
    ``model_dump`` and ~13.6 µs of ``schemaless_writer``, about a fifth of the stream
    worker's GIL time. ``Codec.encode`` of the derived events of folding the ingest
    bench's events took ~18.3 µs an event that way, ~10.1 µs compiled (~18.2 and
    ~9.9 µs for working.updated). The compiled writer is a tree of closures, built
    once, that reads the model's attributes (its ``__dict__``) and writes byte for
    byte what ``fastavro.schemaless_writer(…, event.model_dump())`` writes (a property
    test holds them equal for every event type). A value of a type it does not expect makes it
    raise (TypeError, AttributeError, KeyError, OverflowError, UnicodeEncodeError…):
    :meth:`AvroType.encode` then takes fastavro's road, which writes or refuses it."""
    try:
        return _compile(schema, model, {})
    except Unsupported:
        return None


def native_writer(write: Write | None) -> Any:
    """``schemas._avro.Writer`` of the tree ``write``: the same bytes written in C into
    one buffer (2.6–3.5 µs for a ``working.updated`` the tree writes in 6.5–7.2, timeit
    over 2 000 of them, AMD EPYC); None where
    the extension is not built (``ENGRAM_PURE_PYTHON=1``), or for a tree it does not
    cover (a record inside itself)."""
    if write is None or _avro is None:
        return None
    try:
        spec = writer_spec(write)
    except ValueError:
        return None
    return _avro.Writer(spec)


def native_fields_writer(spec: Any) -> Callable[..., bytes] | None:
    """``schemas._avro.Writer(spec).encode_fields``: ``(header, *fields)`` to the header
    and the Avro bytes of a record of the spec whose fields are given in order; None
    where the extension is not built (``ENGRAM_PURE_PYTHON=1``)."""
    if _avro is None:
        return None
    return _avro.Writer(spec).encode_fields


def _compile(schema: Any, tp: Any, named: dict[str, tuple[Any, Write]]) -> Write:
    """The writer of values of annotation ``tp`` under ``schema``; Unsupported unless
    the two agree as :func:`_avro_type` maps them."""
    tp = _unannotated(tp)
    if isinstance(schema, str) and schema in named:
        model, write = named[schema]
        if tp is not model:
            raise Unsupported(f"{schema} is not {tp!r}")
        return write
    if isinstance(schema, list):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if schema[:1] != ["null"] or len(schema) != 2 or len(inner) != 1:
            raise Unsupported(f"{schema!r} for {tp!r}")
        return _optional(_compile(schema[1], inner[0], named))
    kind = schema.get("type") if isinstance(schema, dict) else schema
    if kind == "record":
        return _record_writer(schema, tp, named)
    if kind == "array" and get_origin(tp) is list:
        return _array(_compile(schema["items"], get_args(tp)[0], named))
    if kind == "map" and get_origin(tp) is dict and get_args(tp)[0] is str:
        return _map(_compile(schema["values"], get_args(tp)[1], named))
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    return _leaf(kind, logical, tp)


def _unannotated(tp: Any) -> Any:
    """``tp`` without ``Annotated``; Unsupported if its metadata changes serialising."""
    while get_origin(tp) is Annotated:
        tp, *metadata = get_args(tp)
        if any(isinstance(m, PlainSerializer | WrapSerializer) for m in metadata):
            raise Unsupported(f"a serializer on {tp!r}")
    return tp


def _leaf(kind: Any, logical: Any, tp: Any) -> Write:
    if (kind, logical) == ("string", None) and (tp is str or _str_literal(tp)):
        return write_string
    if (kind, logical) == ("string", "uuid") and tp is UUID:
        return write_uuid
    if (kind, logical) == ("long", None) and tp is int:
        return write_long_value
    if (kind, logical) == ("long", "timestamp-millis") and (
        tp is AwareDatetime or (isinstance(tp, type) and issubclass(tp, datetime))
    ):
        return write_timestamp_millis
    if (kind, logical) == ("double", None) and tp is float:
        return write_double
    if (kind, logical) == ("boolean", None) and tp is bool:
        return write_boolean
    raise Unsupported(f"{kind!r} ({logical}) for {tp!r}")


def _str_literal(tp: Any) -> bool:
    return get_origin(tp) is Literal and all(type(a) is str for a in get_args(tp))


def _record_writer(schema: AvroSchema, model: Any, named: dict[str, tuple[Any, Write]]) -> Write:
    """Reads each field from the model's ``__dict__`` (pydantic's ``__getattr__`` makes
    attribute reads slow, see ``processors.build``), in the schema's order."""
    if not _plain(model):
        raise Unsupported(f"{model!r} does not dump to its fields")
    names = [f["name"] for f in schema["fields"]]
    if names != list(model.model_fields):
        raise Unsupported(f"{schema['name']} has not the fields of {model!r}")
    writers: list[Write] = []

    def write(value: Any, out: list[bytes]) -> None:  # until the fields are compiled
        built(value, out)

    named[schema["name"]] = (model, write)  # before its fields: they may name it
    for field in schema["fields"]:
        info = model.model_fields[field["name"]]
        if info.exclude or any(
            isinstance(m, PlainSerializer | WrapSerializer) for m in info.metadata
        ):
            raise Unsupported(f"{model!r}.{field['name']} is not dumped as it is")
        writers.append(_compile(field["type"], info.annotation, named))
    built = RecordWriter(names, writers)  # compiled: see its docstring
    named[schema["name"]] = (model, built)  # later uses write it directly
    return built


def _plain(model: Any) -> bool:
    """Whether ``model_dump`` of a ``model`` holds its fields' values as they are."""
    if not _is_model(model):
        return False
    decorators = model.__pydantic_decorators__
    return not (
        decorators.field_serializers
        or decorators.model_serializers
        or model.model_config.get("serialize_by_alias")
    )


def _optional(inner: Write) -> Write:
    return OptionalWriter(inner)


def _array(item: Write) -> Write:
    """One block (its count, then the items) and the count 0; an empty array is 0."""
    if item is write_string:
        return write_strings
    if item is write_double:
        return write_doubles
    return ArrayWriter(item)


def _map(write_value: Write) -> Write:
    """As an array, each item a string key then its value."""
    return MapWriter(write_value)


MIN_MILLIS, MAX_MILLIS = -62_135_596_800_000, 253_402_300_799_999
"""The epoch milliseconds of a ``datetime`` (years 1 to 9999): the ``timestamp-millis``
a reader can turn into one."""


def load_writer_schemas(
    current: dict[str, AvroType], folder: Path = AVSC_DIR
) -> dict[bytes, WriterSchema]:
    """Every ``.avsc`` in ``folder`` (and every current schema) keyed by fingerprint."""
    writers: dict[bytes, WriterSchema] = {}
    for path in sorted(folder.glob("*.avsc")):
        type_name = path.name.rsplit(".v", 1)[0]
        if type_name not in current:
            continue
        schema = json.loads(path.read_text())
        writers[fingerprint(schema)] = WriterSchema(schema, current[type_name])
    for avro_type in current.values():
        writers[avro_type.header[2:]] = WriterSchema(avro_type.schema, avro_type, same=True)
    return writers


def write_single_object(header: bytes, parsed: Any, record: dict[str, Any]) -> bytes:
    """Single-object bytes of ``record``: ``header`` (magic and fingerprint of the
    schema ``parsed`` was parsed from), then the record's binary body."""
    buffer = io.BytesIO()
    buffer.write(header)
    fastavro.schemaless_writer(buffer, parsed, record)
    return buffer.getvalue()


def read_single_object(raw: bytes, parsed: Any, what: str) -> dict[str, Any]:
    """The record in single-object ``raw`` (its header already checked), read with
    ``parsed``; BadEvent ``malformed {what}: …`` for a body that does not read or that
    leaves bytes after the record."""
    buffer = io.BytesIO(raw[10:])
    try:
        record = fastavro.schemaless_reader(buffer, parsed, None)
    except Exception as error:  # fastavro raises many types on bad bytes
        raise BadEvent(f"malformed {what}: {error!r}", raw) from None
    if not isinstance(record, dict) or buffer.tell() != len(raw) - 10:
        raise BadEvent(f"malformed {what}: trailing bytes", raw)
    return record
