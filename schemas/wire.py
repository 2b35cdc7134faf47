"""Avro's binary encoding byte by byte, and the sealed envelope read and written by hand.

What every event costs on its way through the log, whatever its type: the varints,
strings, UUIDs, timestamps, doubles and booleans of :mod:`schemas.reader` (the
trusted reader) and of :mod:`schemas.avro`'s compiled writer, and the sealed
envelope of :mod:`schemas.sealed` (its fields read and written without fastavro,
its additional authenticated data). Every sealed event is opened here once by the
fold and every derived event sealed here once, a rebuild unseals each record here,
and the ingest hop seals each raw event here.

This module is compiled by mypyc (``setup.py``): pure functions of bytes and
numbers, typed, with no state but two tables of varints and a cache of
timestamps' bytes. Compiled, reading a
sealed envelope costs ~1.4 µs instead of ~7 and writing one ~1.8 µs instead of ~7
(one process, Intel Xeon). The contracts are the functions' own; each is held by
the property tests of the module that uses it against fastavro's reading or
writing of the same values (``tests/unit/test_trusted_reader.py``,
``test_compiled_writer.py``, ``test_sealing.py``), which therefore test the
compiled code. Arguments must have the declared types: compiled, a function
raises TypeError for a ``bytes`` argument that is a ``bytearray`` or ``memoryview``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final, final
from uuid import UUID

from schemas.uuids import with_text

# -- reading ---------------------------------------------------------------------------


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


def read_string(data: bytes, at: int) -> tuple[Any, int]:
    """An Avro string at ``data[at:]`` (UTF-8, strict) and the offset after it;
    ValueError for a length out of bounds or bytes that are not UTF-8."""
    size = data[at]
    if size < 0x80 and not size & 1:
        at += 1
        size >>= 1  # a non-negative length: zigzag is a shift
    else:
        size, at = read_long(data, at)
    end = at + size
    if size < 0 or end > len(data):
        raise ValueError("a string out of bounds")
    return data[at:end].decode(), end


def read_uuid(data: bytes, at: int) -> tuple[Any, int]:
    """``UUID(text)`` as fastavro reads it; for the hyphenated form (what engram
    writes) the same value built without ``UUID.__init__``'s parsing, and holding
    ``text`` when that is its canonical text (:func:`schemas.uuids.with_text`)."""
    text, at = read_string(data, at)
    if len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-":
        return with_text(int(text.replace("-", ""), 16), text), at
    return UUID(text), at


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EXACT = 2**32 * 1000
"""Below 2**32 seconds (the year 2106) half a float's ulp is under 0.24 µs, so
``fromtimestamp`` of milliseconds / 1000 rounds to the exact millisecond."""
_at = datetime.fromtimestamp


def read_timestamp_millis(data: bytes, at: int) -> tuple[Any, int]:
    """As fastavro reads it (the epoch plus a timedelta: an aware UTC datetime);
    ``fromtimestamp`` (half the cost) where that is exact."""
    millis, at = read_long(data, at)
    if 0 <= millis < _EXACT:
        return _at(millis / 1000, UTC), at
    return _EPOCH + timedelta(milliseconds=millis), at


_UNPACK_DOUBLE = struct.Struct("<d").unpack_from


def read_double(data: bytes, at: int) -> tuple[Any, int]:
    """An Avro double (8 bytes, little-endian) and the offset after it."""
    return _UNPACK_DOUBLE(data, at)[0], at + 8


def read_boolean(data: bytes, at: int) -> tuple[Any, int]:
    """An Avro boolean (one byte, 0 or 1; ValueError for another)."""
    byte = data[at]
    if byte > 1:
        raise ValueError(f"boolean byte {byte}")
    return byte == 1, at + 1


def read_blocks(data: bytes, at: int) -> tuple[int, int]:
    """The count of the next block of an array or map (its byte size skipped)."""
    count, at = read_long(data, at)
    if count < 0:
        count = -count
        _, at = read_long(data, at)
    return count, at


def read_doubles(data: bytes, at: int) -> tuple[Any, int]:
    """An Avro array of doubles at ``data[at:]`` (a recorded vector): its values and
    the offset after it, each block (a zigzag count, 0 ends; negative: a byte size
    follows) unpacked whole; ValueError when one runs past the end."""
    values: list[float] = []
    count, at = read_blocks(data, at)
    while count:
        end = at + 8 * count
        if end > len(data):
            raise ValueError("an array of doubles out of bounds")
        values += struct.unpack_from(f"<{count}d", data, at)
        at = end
        count, at = read_blocks(data, at)
    return values, at


# -- writing ---------------------------------------------------------------------------

SMALL = [bytes((z,)) for z in range(0x80)]
"""The one-byte varints: ``SMALL[z]`` for a zigzag value ``z`` under 128."""
_TWO = b"".join(bytes(((z & 0x7F) | 0x80, z >> 7)) for z in range(0x4000))


def write_long(n: int) -> bytes:
    """Avro's zigzag varint of the long ``n``; OverflowError unless -2**63 <= n < 2**63
    (as fastavro: no bytes for a number that is not a long). Seven bits a byte, low
    first, the top bit set on all but the last; one or two bytes from tables."""
    z = (n << 1) ^ (n >> 63)
    if z < 0x80:
        return SMALL[z]
    if z < 0x4000:
        return _TWO[2 * z : 2 * z + 2]
    if z >> 64:  # out of range: (n << 1) keeps its top bit above what (n >> 63) holds
        raise OverflowError(f"{n} is outside an Avro long")
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def write_bytes(b: bytes) -> bytes:
    """Avro ``bytes`` (and, of UTF-8, ``string``): the length as a long, then ``b``."""
    return write_long(len(b)) + b


def epoch_millis(at: datetime) -> int:
    """The Avro ``timestamp-millis`` of the aware ``at``, as fastavro computes it: whole
    seconds since the epoch, then the milliseconds truncated (not rounded)."""
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


NULL, SOME, END = b"\x00", b"\x02", b"\x00"
"""Union indexes 0 and 1 (``["null", T]``), and a block count 0 (an array's end)."""
_TRUE, _FALSE = b"\x01", b"\x00"
_PACK_DOUBLE = struct.Struct("<d").pack

# The writers of one value (the compiled writer's leaves, :func:`schemas.avro.compile_writer`):
# each appends the Avro binary form of ``value`` to ``out``, and raises for a value
# of a type it does not expect (the caller then takes fastavro's road).


def write_string(value: Any, out: list[bytes]) -> None:
    """UTF-8, strict: a lone surrogate raises UnicodeEncodeError, as in fastavro."""
    data = value.encode()
    size = len(data)
    out.append(SMALL[size + size] if size < 64 else write_long(size))
    out.append(data)


def write_strings(value: Any, out: list[bytes]) -> None:
    """An array of strings, its items written in its loop (lists of ids are long)."""
    if len(value):
        out.append(write_long(len(value)))
        for text in value:
            data = text.encode()
            size = len(data)
            out.append(SMALL[size + size] if size < 64 else write_long(size))
            out.append(data)
    out.append(END)


def write_uuid(value: Any, out: list[bytes]) -> None:
    """A UUID as its text (``str``), or a string as it is."""
    write_string(str(value) if isinstance(value, UUID) else value, out)


def write_long_value(value: Any, out: list[bytes]) -> None:
    """An Avro long (TypeError unless an ``int``, OverflowError outside a long)."""
    out.append(write_long(value))


def write_double(value: Any, out: list[bytes]) -> None:
    """An Avro double."""
    out.append(_PACK_DOUBLE(value))


def write_doubles(value: Any, out: list[bytes]) -> None:
    """An array of doubles (a vector) packed in one call: the bytes :func:`write_double`
    writes item by item (~0.2 µs an item: ~100 µs for 512 of them)."""
    if len(value):
        out.append(write_long(len(value)))
        out.append(struct.pack(f"<{len(value)}d", *value))
    out.append(END)


def write_boolean(value: Any, out: list[bytes]) -> None:
    """An Avro boolean: ``True`` or ``False`` only (TypeError for anything else)."""
    if value is True:
        out.append(_TRUE)
    elif value is False:
        out.append(_FALSE)
    else:
        raise TypeError(f"not a bool: {value!r}")


_MILLIS: dict[datetime, bytes] = {}
"""Only UTC datetimes: equal ones in a zone with folds may be different instants."""
_MILLIS_KEPT = 1024


def write_timestamp_millis(value: Any, out: list[bytes]) -> None:
    """As fastavro: whole seconds since the epoch, then the milliseconds truncated.
    The bytes of the last UTC datetimes are kept (~1 µs to write, ~0.1 µs to find):
    a source event's time recurs in each change it makes and in its turn."""
    data = _MILLIS.get(value) if value.tzinfo is UTC else None
    if data is None:
        if value.tzinfo is None:  # naive, or a date: fastavro's other roads
            raise TypeError(f"not an aware datetime: {value!r}")
        data = write_long(epoch_millis(value))
        if value.tzinfo is UTC:
            if len(_MILLIS) >= _MILLIS_KEPT:
                _MILLIS.clear()
            _MILLIS[value] = data
    out.append(data)


# -- the sealed envelope (:data:`schemas.sealed.SEALED_SCHEMA`) -------------------------

SealedFields = tuple[
    str, str, str, str | None, str | None, int, int | None, int | None, str, str, bytes, bytes
]
"""The fields of :data:`~schemas.sealed.SEALED_SCHEMA` in order, ``occurred_at`` in
epoch milliseconds."""


Write = Callable[[Any, list[bytes]], None]
"""Appends the Avro bytes of one value to ``out``."""

KIND_STRING: Final = 0
KIND_UUID: Final = 1
KIND_LONG: Final = 2
KIND_TIMESTAMP: Final = 3
KIND_DOUBLE: Final = 4
KIND_BOOLEAN: Final = 5
KIND_DOUBLES: Final = 6
KIND_STRINGS: Final = 7
"""The leaves a record's compiled reader (:class:`schemas.reader._Fields`: no array of
strings) and writer (:class:`RecordWriter`) handle by a native call."""
SPEC_BYTES: Final = 50
"""Avro ``bytes`` in a spec of ``schemas._avro.Writer`` (:func:`writer_spec` makes
none: no event has a bytes field; the sealed envelope has two)."""
KIND_OPTIONAL: Final = 8
"""Added to a leaf's kind: the union of null and that leaf."""
KIND_OTHER: Final = 16
"""A field read or written by calling its reader or writer as it is (a record, an
array or a map of records, an optional of those)."""


@final
class OptionalWriter:
    """Writes the union of null and what ``inner`` writes: the branch, then the value."""

    def __init__(self, inner: Write) -> None:
        self.inner = inner

    def __call__(self, value: Any, out: list[bytes]) -> None:
        if value is None:
            out.append(NULL)
        else:
            out.append(SOME)
            self.inner(value, out)


@final
class RecordWriter:
    """Writes a model's fields (read from its ``__dict__``) in turn, each as its writer
    in ``writers`` writes it: a leaf's (this module's writers of a string, a UUID, a
    long, a timestamp, a double, a boolean, an array of strings or of doubles, and
    :class:`OptionalWriter` of one of those) by a native call, any other by calling
    it. Compiled by mypyc, where the fields' calls written out and ``exec``-ed ran as
    plain Python."""

    def __init__(self, names: list[str], writers: list[Write]) -> None:
        self.names = names
        self.writers = writers
        self.kinds = [_write_kind(write) for write in writers]

    def __call__(self, value: Any, out: list[bytes]) -> None:
        fields: dict[str, Any] = value.__dict__
        names = self.names
        kinds = self.kinds
        for i in range(len(names)):
            kind = kinds[i]
            x = fields[names[i]]
            if kind < KIND_OPTIONAL:
                _write_leaf(kind, x, out)
            elif kind < KIND_OTHER:
                if x is None:
                    out.append(NULL)
                else:
                    out.append(SOME)
                    _write_leaf(kind - KIND_OPTIONAL, x, out)
            else:
                self.writers[i](x, out)


@final
class ArrayWriter:
    """Writes an array of what ``item`` writes: one block (its count, then the items)
    and the count 0; an empty array is the count 0 alone."""

    def __init__(self, item: Write) -> None:
        self.item = item

    def __call__(self, value: Any, out: list[bytes]) -> None:
        if len(value):
            out.append(write_long(len(value)))
            item = self.item
            for x in value:
                item(x, out)
        out.append(END)


@final
class MapWriter:
    """Writes a map (a ``dict``) of what ``value`` writes: as an array, each item a
    string key then its value."""

    def __init__(self, value: Write) -> None:
        self.value = value

    def __call__(self, value: Any, out: list[bytes]) -> None:
        if len(value):
            out.append(write_long(len(value)))
            write_value = self.value
            for key, x in value.items():
                write_string(key, out)
                write_value(x, out)
        out.append(END)


def writer_spec(write: Write, within: tuple[int, ...] = ()) -> Any:
    """The shape of the writer tree ``write`` (a leaf's kind, or ``("optional",
    spec)``, ``("array", spec)``, ``("map", spec)``, ``("record", names, specs)``),
    from which ``schemas._avro.Writer`` writes the same bytes in C. ValueError for a
    tree that holds a record inside itself (``within``: the records around ``write``)
    or a writer this module did not make."""
    kind = _WRITE_KINDS.get(write)
    if kind is not None:
        return kind
    if isinstance(write, OptionalWriter):
        return ("optional", writer_spec(write.inner, within))
    if isinstance(write, ArrayWriter):
        return ("array", writer_spec(write.item, within))
    if isinstance(write, MapWriter):
        return ("map", writer_spec(write.value, within))
    if isinstance(write, RecordWriter):
        if id(write) in within:
            raise ValueError("a record that holds itself")
        inside = (*within, id(write))
        specs = tuple([writer_spec(field, inside) for field in write.writers])
        return ("record", tuple(write.names), specs)
    raise ValueError(f"not a writer of this module: {write!r}")


def _write_leaf(kind: int, value: Any, out: list[bytes]) -> None:
    if kind == KIND_STRING:
        write_string(value, out)
    elif kind == KIND_UUID:
        write_uuid(value, out)
    elif kind == KIND_LONG:
        write_long_value(value, out)
    elif kind == KIND_TIMESTAMP:
        write_timestamp_millis(value, out)
    elif kind == KIND_DOUBLE:
        write_double(value, out)
    elif kind == KIND_BOOLEAN:
        write_boolean(value, out)
    elif kind == KIND_STRINGS:
        write_strings(value, out)
    else:
        write_doubles(value, out)


def _write_kind(write: Write) -> int:
    """How :class:`RecordWriter` writes a field whose writer is ``write``."""
    if isinstance(write, OptionalWriter):
        inner = _WRITE_KINDS.get(write.inner)
        return KIND_OTHER if inner is None else inner + KIND_OPTIONAL
    return _WRITE_KINDS.get(write, KIND_OTHER)


_WRITE_KINDS: Final[dict[Any, int]] = {
    write_string: KIND_STRING,
    write_uuid: KIND_UUID,
    write_long_value: KIND_LONG,
    write_timestamp_millis: KIND_TIMESTAMP,
    write_double: KIND_DOUBLE,
    write_boolean: KIND_BOOLEAN,
    write_strings: KIND_STRINGS,
    write_doubles: KIND_DOUBLES,
}
"""The kind of each leaf's writer, by :func:`_write_leaf`."""


def write_sealed_fields(
    header: bytes,
    event_id: str,
    kind: str,
    agent_id: str,
    session: str | None,
    user: str | None,
    at: datetime,
    seq: int | None,
    idx: int | None,
    subject: str,
    key_id: str,
    nonce: bytes,
    ciphertext: bytes,
) -> bytes:
    """The single-object bytes of a sealed record (``header``: magic and fingerprint of
    its schema) from values already known to be of the schema's types (strings
    ``str``, ``at`` aware): what :meth:`schemas.sealed.Sealer.seal` has from a valid
    event."""
    return b"".join(
        (
            header,
            write_bytes(event_id.encode()),
            write_bytes(kind.encode()),
            write_bytes(agent_id.encode()),
            NULL if session is None else SOME + write_bytes(session.encode()),
            NULL if user is None else SOME + write_bytes(user.encode()),
            write_long(epoch_millis(at)),
            NULL if seq is None else SOME + write_long(seq),
            NULL if idx is None else SOME + write_long(idx),
            write_bytes(subject.encode()),
            write_bytes(key_id.encode()),
            write_bytes(nonce),
            write_bytes(ciphertext),
        )
    )


def read_sealed(raw: bytes) -> tuple[int, SealedFields] | None:
    """The fields of sealed single-object ``raw`` (header already checked), read by
    hand, and the position after ``occurred_at`` (the fields before it are written
    alike in a derived event's own record); None when any is not as a writer of the
    schema writes it (a varint over 10 bytes, a union branch not 0 or 1, text not
    UTF-8, bytes beyond the end or after the record)."""
    try:
        event_id, p = read_text(raw, 10)
        kind, p = read_text(raw, p)
        agent, p = read_text(raw, p)
        session, p = _optional_text(raw, p)
        user, p = _optional_text(raw, p)
        millis, head = read_long(raw, p)
        seq, p = _optional_long(raw, head)
        idx, p = _optional_long(raw, p)
        subject, p = read_text(raw, p)
        key_id, p = read_text(raw, p)
        nonce, p = read_blob(raw, p)
        sealed, p = read_blob(raw, p)
    except (IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    if p != len(raw):
        return None
    fields = event_id, kind, agent, session, user, millis, seq, idx, subject, key_id, nonce, sealed
    return head, fields


def read_sealed_type(raw: bytes) -> str | None:
    """The ``type`` of sealed bytes without reading the rest (the record's second
    field); None when it does not read."""
    try:
        return read_text(raw, skip_blob(raw, 10))[0]
    except (IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def read_sealed_key(raw: bytes) -> tuple[str, str] | None:
    """``(subject, key_id)`` of sealed bytes, read by skipping the fields before them
    (a fraction of the cost of reading the record); None when they do not read."""
    try:
        position = skip_blob(raw, skip_blob(raw, skip_blob(raw, 10)))  # event_id, type, agent
        for _ in range(2):  # session_id, user_id: unions of null and a string
            held = present(raw, position)
            position = skip_blob(raw, position + 1) if held else position + 1
        position = read_long(raw, position)[1]  # occurred_at
        for _ in range(2):  # seq, idx: unions of null and a long
            held = present(raw, position)
            position = read_long(raw, position + 1)[1] if held else position + 1
        subject, position = read_text(raw, position)
        key_id, _ = read_text(raw, position)
    except (IndexError, ValueError):
        return None
    return subject, key_id


def skip_blob(raw: bytes, position: int) -> int:
    """The position after the string or bytes at ``position``."""
    length, position = read_long(raw, position)
    if length < 0 or position + length > len(raw):
        raise ValueError("bytes out of bounds")
    return position + length


def read_blob(raw: bytes, position: int) -> tuple[bytes, int]:
    """Bytes at ``position``: a length (a one-byte varint read in place), then as
    many bytes (ValueError for a negative length or bytes beyond the end)."""
    length = raw[position]
    if length < 0x80 and not length & 1:  # zigzag of a length under 64
        position += 1
        length >>= 1
    else:
        length, position = read_long(raw, position)
    end = position + length
    if length < 0 or end > len(raw):
        raise ValueError("bytes out of bounds")
    return raw[position:end], end


def read_text(raw: bytes, position: int) -> tuple[str, int]:
    """:func:`read_blob` read as UTF-8 (UnicodeDecodeError, a ValueError, if it is not)."""
    blob, end = read_blob(raw, position)
    return blob.decode(), end


def present(data: bytes, at: int) -> bool:
    """Whether the union of null and a value at ``data[at]`` holds the value (its
    branch byte is 2, zigzag 1) rather than null (0); ValueError for another byte."""
    branch = data[at]
    if branch == 2:
        return True
    if branch != 0:
        raise ValueError(f"union branch byte {branch}")
    return False


def _optional_text(raw: bytes, position: int) -> tuple[str | None, int]:
    """A union of null and a string, at ``position``."""
    if present(raw, position):
        return read_text(raw, position + 1)
    return None, position + 1


def _optional_long(raw: bytes, position: int) -> tuple[int | None, int]:
    """A union of null and a long, at ``position``."""
    if present(raw, position):
        return read_long(raw, position + 1)
    return None, position + 1


def sealed_aad(event_id: str, kind: str, agent_id: str, subject: str, key_id: str) -> bytes:
    """The additional authenticated data that binds a sealed event's ciphertext to its
    clear envelope."""
    return "\x00".join(("engram.sealed.v1", event_id, kind, agent_id, subject, key_id)).encode()


def inner_positions(inner: bytes, head: int) -> tuple[int, int] | None:
    """``(seq, idx)`` of clear derived bytes whose
    :data:`~schemas.sealed.DERIVED_HEAD` fields up to ``occurred_at`` end at ``head``
    (the schema version and source event id between are skipped); None when they do
    not read."""
    try:
        p = read_long(inner, head)[1]  # schema_version
        p = skip_blob(inner, p)  # source_event_id
        seq, p = read_long(inner, p)
        idx, _ = read_long(inner, p)
    except (IndexError, ValueError):
        return None
    return seq, idx
