"""Derived records decoded by ClickHouse itself: the rebuild's native road to
``memory_changes``.

A rebuild turns every record of the derived log into one ``memory_changes`` row. In
Python that costs about 25 µs a record (fastavro reads it, pydantic's serialiser writes
the body's JSON) on top of reading the log. Here the records' Avro bodies go to
ClickHouse as they are, gathered per schema into an Avro object container file, and
ClickHouse's own Avro reader and SQL functions build the rows:

- :func:`column_type`: the ClickHouse type in which ClickHouse's Avro input reads an
  Avro schema node (timestamps as their ``Int64`` milliseconds);
- :func:`json_sql`: a SQL expression over such a column whose value is, byte for
  byte, what ``pydantic_core.to_json`` writes for the value fastavro reads from the
  same bytes (strings escaped as serde does, doubles in its shortest form and its
  notation, timestamps as ISO-8601 with ``Z``);
- :class:`Transcoder`: for one current derived schema, the staging table's columns,
  the ``SELECT`` that turns them into ``memory_changes`` columns (in the order of
  :data:`sinks.clickhouse.CHANGE_COLUMNS`) and :meth:`Transcoder.container`, the
  container file of a batch of bodies.

Contract: for every record of a schema :func:`transcoder` accepts, the row written
through the staging table equals :func:`sinks.clickhouse.record_row` of the record,
value for value and the body byte for byte (``tests/integration/test_transcode.py``
holds it over hypothesis-drawn events of every derived type). Schema nodes this
module does not know (``float``, ``bytes``, enums, fixed, unions other than
``["null", T]`` of a nullable type) raise :class:`Unsupported`: such a type keeps
the Python road.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.avro import AvroType, write_bytes, write_long


class Unsupported(ValueError):
    """A schema node the native road does not transcode."""


# --------------------------------------------------------------------------- SQL text


def literal(text: str) -> str:
    """``text`` as a ClickHouse string literal (control characters escaped)."""
    out = ["'"]
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    out.append("'")
    return "".join(out)


def _concat(*parts: str) -> str:
    return f"concat({', '.join(parts)})"


class _Names:
    """Fresh lambda parameter names (``x1``, ``x2``, …) for one expression."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, stem: str = "x") -> str:
        self.n += 1
        return f"_{stem}{self.n}"


def _let(names: _Names, value: str, body: Callable[[str], str]) -> str:
    """``body(v)`` with ``v`` bound to ``value`` evaluated once (a one-item arrayMap)."""
    v = names("v")
    return f"arrayMap({v} -> {body(v)}, [{value}])[1]"


# serde_json's escapes: the two-character forms, else \u00xx in lower-case hex.
_SHORT = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_NEEDS_ESCAPE = literal(r'[\x00-\x1f"\\]')


def json_string(e: str, names: _Names) -> str:
    """SQL: the JSON string of the ``String`` ``e`` as serde_json writes it: ``"`` and
    ``\\`` escaped, control characters as ``\\n`` and the like or ``\\u00xx``, every
    other byte as it is. A string with nothing to escape is copied; one with something
    is escaped byte by byte (multi-byte characters pass through byte for byte)."""
    b = names("b")
    cases = ", ".join(f"{b} = {literal(raw)}, {literal(esc)}" for raw, esc in _SHORT.items())
    escape = f"multiIf({cases}, {b} < ' ', concat('\\\\u00', lower(hex({b}))), {b})"
    escaped = f"arrayStringConcat(arrayMap({b} -> {escape}, splitByRegexp('', {e})))"
    return _concat("'\"'", f"if(match({e}, {_NEEDS_ESCAPE}), {escaped}, {e})", "'\"'")


def _mantissa(digits: str) -> str:
    """SQL: ``d`` or ``d.ddd`` of a digit string without leading or trailing zeros."""
    return (
        f"if(length({digits}) = 1, {digits},"
        f" concat(substring({digits}, 1, 1), '.', substring({digits}, 2)))"
    )


def json_double(e: str, names: _Names) -> str:
    """SQL: the JSON of the ``Float64`` ``e`` as pydantic-core writes it: the shortest
    digits that read back to the same double (ClickHouse's ``toString`` finds the same
    ones), in decimal notation with at least one fractional digit for 1e-5 <= |e| <
    1e16, else as ``d.ddde±n``; ``NaN``, ``Infinity``, ``-Infinity``; ``-0.0``."""

    def shaped(s: str) -> str:
        sign = f"if({e} < 0, '-', '')"
        return _let(
            names,
            f"if({e} < 0, substring({s}, 2), {s})",
            lambda t: (
                "multiIf("
                f"isNaN({e}), 'NaN', "
                f"isInfinite({e}), if({e} > 0, 'Infinity', '-Infinity'), "
                f"{e} = 0, if({s} = '-0', '-0.0', '0.0'), "
                f"abs({e}) >= 1e-5 AND abs({e}) < 1e16, "
                f"if(position({s}, '.') = 0 AND position({s}, 'e') = 0, concat({s}, '.0'), {s}), "
                f"position({t}, 'e') > 0, "
                + _let(
                    names,
                    f"splitByChar('e', {t})",
                    lambda p: _concat(
                        sign,
                        f"{p}[1]",
                        "'e'",
                        f"if(startsWith({p}[2], '-'), {p}[2], concat('+', {p}[2]))",
                    ),
                )
                + ", "
                f"abs({e}) >= 1e16, "
                + _let(
                    names,
                    f"trimRight({t}, '0')",
                    lambda d: _concat(sign, _mantissa(d), "'e+'", f"toString(length({t}) - 1)"),
                )
                + ", "
                + _let(
                    names,
                    f"substring({t}, 3)",
                    lambda f: _let(
                        names,
                        f"trimLeft({f}, '0')",
                        lambda d: _concat(
                            sign,
                            _mantissa(d),
                            "'e-'",
                            f"toString(length({f}) - length({d}) + 1)",
                        ),
                    ),
                )
                + ")"
            ),
        )

    return _let(names, f"toString({e})", shaped)


def _pad(e: str, width: int) -> str:
    return f"leftPad(toString({e}), {width}, '0')"


_DAY_MS = 86_400_000
_CYCLE_MS = 146_097 * _DAY_MS
"""Milliseconds in 400 Gregorian years: the calendar repeats itself after them."""
_BASE_MS = -2_208_988_800_000
"""1900-01-01T00:00:00Z: from it, one cycle stays within ``DateTime64``'s range
(1900-01-01 to 2299-12-31)."""


def json_timestamp(e: str, names: _Names) -> str:
    """SQL: the JSON of the ``Int64`` milliseconds ``e`` since the epoch as pydantic-core
    writes the UTC datetime fastavro reads for them: ``"YYYY-MM-DDTHH:MM:SS[.ffffff]Z"``,
    the fraction only when not zero. Any year a datetime holds (1 to 9999) is exact,
    not only those of ``DateTime64``: the moment is moved by whole 400-year cycles
    (``k``) into 1900–2299, where ClickHouse's calendar formats it, and the year is
    moved back. No lambdas: ClickHouse plans this in a few milliseconds, where the
    day-number arithmetic bound through nested ``arrayMap`` took ~10 ms a timestamp in
    every insert's plan."""
    del names  # no bound names
    k = f"intDiv({e} - ({_BASE_MS}) - if({e} < {_BASE_MS}, {_CYCLE_MS - 1}, 0), {_CYCLE_MS})"
    moved = f"fromUnixTimestamp64Milli({e} - {k} * {_CYCLE_MS}, 'UTC')"
    return _concat(
        "'\"'",
        _pad(f"toYear({moved}) + 400 * {k}", 4),
        f"formatDateTime({moved}, '-%m-%dT%H:%i:%S')",
        f"if({e} % 1000 = 0, '', concat('.', {_pad(f'positiveModulo({e}, 1000)', 3)}, '000'))",
        "'Z\"'",
    )


# --------------------------------------------------------------------------- schema walk


_PRIMITIVES = {"string": "String", "long": "Int64", "double": "Float64", "boolean": "Bool"}


class _Schema:
    """Named types seen while walking one schema (a later node may name an earlier one)."""

    def __init__(self) -> None:
        self.named: dict[str, Mapping[str, Any]] = {}

    def resolve(self, node: Any) -> Any:
        if isinstance(node, str) and node not in _PRIMITIVES and node != "null":
            found = self.named.get(node)
            if found is None:
                raise Unsupported(f"unknown or unsupported type {node!r}")
            return found
        if isinstance(node, dict) and node.get("type") == "record":
            self.named[str(node["name"])] = node
            if "namespace" in node:
                self.named[f"{node['namespace']}.{node['name']}"] = node
        return node

    def column_type(self, node: Any) -> str:
        node = self.resolve(node)
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return _PRIMITIVES[node]
            raise Unsupported(f"type {node!r}")
        if isinstance(node, list):
            inner = self._nullable(node)
            inner_type = self.column_type(inner)
            if inner_type.startswith(("Array(", "Tuple(", "Map(")):
                raise Unsupported(f"a nullable {inner_type.split('(')[0]}")
            return f"Nullable({inner_type})"
        kind, logical = node.get("type"), node.get("logicalType")
        if kind == "string" and logical == "uuid":
            return "UUID"
        if kind == "long" and logical == "timestamp-millis":
            return "Int64"
        if logical is not None:
            raise Unsupported(f"logical type {logical!r}")
        if kind == "array":
            return f"Array({self.column_type(node['items'])})"
        if kind == "map":
            return f"Map(String, {self.column_type(node['values'])})"
        if kind == "record":
            fields = ", ".join(
                f"{_ident(f['name'])} {self.column_type(f['type'])}" for f in node["fields"]
            )
            return f"Tuple({fields})"
        if isinstance(kind, str | list | dict):
            return self.column_type(kind)
        raise Unsupported(f"schema node {node!r}")

    @staticmethod
    def _nullable(union: list[Any]) -> Any:
        if len(union) != 2 or union[0] != "null":
            raise Unsupported(f'union {union!r} (only ["null", T])')
        return union[1]

    def json(self, node: Any, e: str, names: _Names) -> str:
        node = self.resolve(node)
        if isinstance(node, str):
            if node == "string":
                return json_string(e, names)
            if node == "long":
                return f"toString({e})"
            if node == "double":
                return json_double(e, names)
            if node == "boolean":
                return f"if({e}, 'true', 'false')"
            raise Unsupported(f"type {node!r}")
        if isinstance(node, list):
            inner = self._nullable(node)
            return f"if(isNull({e}), 'null', {self.json(inner, f'assumeNotNull({e})', names)})"
        kind, logical = node.get("type"), node.get("logicalType")
        if kind == "string" and logical == "uuid":
            return _concat("'\"'", f"toString({e})", "'\"'")
        if kind == "long" and logical == "timestamp-millis":
            return json_timestamp(e, names)
        if kind == "array":
            x = names()
            item = self.json(node["items"], x, names)
            return _concat("'['", f"arrayStringConcat(arrayMap({x} -> {item}, {e}), ',')", "']'")
        if kind == "map":
            k, v = names("k"), names()
            value = self.json(node["values"], v, names)
            pair = _concat(json_string(k, names), "':'", value)
            pairs = f"arrayMap(({k}, {v}) -> {pair}, mapKeys({e}), mapValues({e}))"
            return _concat("'{'", f"arrayStringConcat({pairs}, ',')", "'}'")
        if kind == "record":
            parts: list[str] = []
            for i, f in enumerate(node["fields"]):
                key = json.dumps(f["name"])
                parts.append(literal(("{" if i == 0 else ",") + key + ":"))
                item = f"tupleElement({e}, {literal(f['name'])})"
                parts.append(self.json(f["type"], item, names))
            parts.append("'}'" if parts else "'{}'")
            return _concat(*parts) if len(parts) > 1 else parts[0]
        if isinstance(kind, str | list | dict):
            return self.json(kind, e, names)
        raise Unsupported(f"schema node {node!r}")


def _ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def column_type(node: Any) -> str:
    """The ClickHouse type ClickHouse's Avro input reads ``node`` into; Unsupported
    for a node the native road does not transcode."""
    return _Schema().column_type(node)


def json_sql(node: Any, e: str) -> str:
    """SQL over the column ``e`` (of :func:`column_type` ``node``): the JSON text
    ``pydantic_core.to_json`` writes for the value fastavro reads."""
    return _Schema().json(node, e, _Names())


# --------------------------------------------------------------------------- transcoders


SOURCE = "_in"
"""The alias the staging table goes by in :attr:`Transcoder.select` (``FROM … AS _in``):
qualified, its columns are not confused with the ``SELECT``'s own aliases."""


@dataclass(frozen=True)
class Transcoder:
    """One current derived schema's road from Avro bodies to ``memory_changes`` rows."""

    event_type: str
    fingerprint: bytes
    schema_json: bytes
    columns: tuple[tuple[str, str], ...]
    """The staging table's columns: the record's top-level fields and their types."""
    select: tuple[str, ...]
    """SQL over those columns (as ``_in.column``, see :data:`SOURCE`), one per column
    of ``memory_changes``, in order."""

    @property
    def structure(self) -> str:
        """The staging columns as a ClickHouse structure (``name Type, …``)."""
        return ", ".join(f"{_ident(name)} {kind}" for name, kind in self.columns)

    def container(self, bodies: Sequence[bytes]) -> bytes:
        """An Avro object container file of ``bodies`` (records' binary bodies, as
        after a single-object header), no codec, one block per record. Its own
        block, ended by a sync marker drawn for this file, is what bounds a record:
        a truncated body fails the read (ClickHouse checks each block's marker)
        instead of shifting the records after it. Bytes after a record inside its
        block are skipped."""
        sync = os.urandom(16)
        parts = [
            b"Obj\x01",
            write_long(2),
            write_bytes(b"avro.schema"),
            write_bytes(self.schema_json),
            write_bytes(b"avro.codec"),
            write_bytes(b"null"),
            write_long(0),
            sync,
        ]
        one = write_long(1)
        for body in bodies:
            parts += (one, write_long(len(body)), body, sync)
        return b"".join(parts)


def transcoder(avro_type: AvroType, change_columns: Sequence[str]) -> Transcoder:
    """The :class:`Transcoder` of ``avro_type``'s current schema, whose columns
    (``change_columns``) are those of ``memory_changes``; Unsupported when a node of
    the schema has no native road, or a column has no source."""
    return _transcoder(avro_type, change_columns, ())


ARCHIVE_FIELDS = (("seq", "long", "Int64"), ("payload", "bytes", "String"))
"""What an ``events`` archive record holds before the event's own fields: the column,
its Avro type and the staging type (see :func:`archive_transcoder`)."""

_ARCHIVE_PREFIX = "_archive_"


def archive_transcoder(avro_type: AvroType, event_columns: Sequence[str]) -> Transcoder:
    """The :class:`Transcoder` of the ``events`` archive rows (``event_columns``) of
    raw events of ``avro_type``'s current schema. Its records are the event's
    sequence number (``long``) and archived payload (``bytes``: the event's Avro
    single-object bytes), then the event's own record, field for field:
    :func:`archive_record` of the payload. Unsupported as :func:`transcoder`."""
    return _transcoder(avro_type, event_columns, ARCHIVE_FIELDS)


def archive_record(seq: int, payload: bytes, clear: bytes | None = None) -> bytes:
    """The body of an :func:`archive_transcoder` record: the event's fields from
    ``clear`` (single-object bytes of the transcoder's schema; ``payload`` when None),
    with its sequence number and the archived ``payload`` (those bytes, or the
    sealed bytes they were opened from) in front."""
    return write_long(seq) + write_bytes(payload) + (payload if clear is None else clear)[10:]


def _transcoder(
    avro_type: AvroType, columns_out: Sequence[str], extra: Sequence[tuple[str, str, str]]
) -> Transcoder:
    """A transcoder whose records are ``extra`` fields (column, Avro type, staging
    type; each read into the column of its name) and then ``avro_type``'s record."""
    schema = avro_type.schema
    walk = _Schema()
    fields = {str(f["name"]): f["type"] for f in schema["fields"]}
    added = {column: _ARCHIVE_PREFIX + column for column, _, _ in extra}
    if set(added.values()) & set(fields):
        raise Unsupported(f"a field named like {sorted(added.values())}")
    columns = (
        *((added[column], staged) for column, _, staged in extra),
        *((name, walk.column_type(node)) for name, node in fields.items()),
    )
    body = walk.resolve(fields.get("body"))
    body_fields = {str(f["name"]) for f in body["fields"]} if isinstance(body, dict) else set[str]()
    select: list[str] = []
    for column in columns_out:
        if column in added:
            select.append(f"{SOURCE}.{_ident(added[column])}")
        elif column == "body":
            no_body = body is None
            select.append("'{}'" if no_body else walk.json(body, f"{SOURCE}.body", _Names()))
        elif column == "memory_id":
            select.append(
                f"tupleElement({SOURCE}.body, 'memory_id')" if "memory_id" in body_fields else "''"
            )
        elif column in fields and _is_time(fields[column]):
            select.append(f"fromUnixTimestamp64Milli({SOURCE}.{_ident(column)}, 'UTC')")
        elif column in fields:
            select.append(f"{SOURCE}.{_ident(column)}")
        else:
            raise Unsupported(f"no field for the column {column!r}")
    if extra:
        schema = {
            "type": "record",
            "name": "engram.archive.Row",
            "fields": [
                *({"name": added[column], "type": kind} for column, kind, _ in extra),
                *schema["fields"],
            ],
        }
    return Transcoder(
        event_type=avro_type.event_type.TYPE,
        fingerprint=avro_type.header[2:],
        schema_json=json.dumps(schema, separators=(",", ":")).encode(),
        columns=columns,
        select=tuple(select),
    )


def _is_time(node: Any) -> bool:
    return isinstance(node, dict) and node.get("logicalType") == "timestamp-millis"
