"""Bytes to events and back: Avro single-object encoding and the JSON wire format.

Contract of :meth:`Codec.decode`: it returns a valid, typed event or raises
:class:`BadEvent` whose ``reason`` names what is wrong — empty or oversize
bytes, a truncated header, an unknown fingerprint, a malformed body, malformed
JSON, a missing or wrongly typed field, an unknown type. It never raises
anything else.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas.avro import AVSC_DIR, MAGIC, AvroType, WriterSchema, load_writer_schemas
from schemas.base import Event
from schemas.derived import DERIVED_TYPES
from schemas.errors import BadEvent
from schemas.raw import RAW_TYPES

DEFAULT_MAX_BYTES = 256 * 1024
ALL_TYPES: tuple[type[Event], ...] = RAW_TYPES + DERIVED_TYPES
TYPES_BY_NAME: dict[str, type[Event]] = {t.TYPE: t for t in ALL_TYPES}
RAW_TYPE_NAMES = frozenset(t.TYPE for t in RAW_TYPES)


def describe(error: ValidationError) -> str:
    """One line per problem: ``body.content: Field required``."""
    parts = []
    for item in error.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "event"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def _tables(avsc_dir: Path) -> tuple[dict[str, AvroType], dict[bytes, WriterSchema]]:
    """Every type's current schema, and the writer schemas of ``avsc_dir`` by fingerprint."""
    avro = {name: AvroType(t) for name, t in TYPES_BY_NAME.items()}
    return avro, load_writer_schemas(avro, avsc_dir)


@functools.cache
def _shipped_tables() -> tuple[dict[str, AvroType], dict[bytes, WriterSchema]]:
    """:func:`_tables` of the schemas shipped with the package, made once per process
    (they do not change while it runs; a codec took ~30 ms to make them): codecs share
    them, read-only."""
    return _tables(AVSC_DIR)


class Codec:
    """Encodes and decodes every event type; one instance per process is enough.

    ``max_bytes`` bounds the size of one encoded event (default 256 KiB,
    ``ENGRAM_MAX_EVENT_BYTES``); ``accept`` limits the types ``decode`` lets through
    (the raw types on ``engram.events``, every type by default); ``avsc_dir`` is the
    folder of writer schemas resolved by fingerprint (``schemas/avsc/`` by default).
    """

    def __init__(
        self,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        accept: frozenset[str] | None = None,
        avsc_dir: Path | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.accept = accept if accept is not None else frozenset(TYPES_BY_NAME)
        avro, writers = _shipped_tables() if avsc_dir is None else _tables(avsc_dir)
        self.avro: dict[str, AvroType] = dict(avro)
        self.writers: dict[bytes, WriterSchema] = dict(writers)

    # -- encoding ---------------------------------------------------------
    def encode(self, event: Event) -> bytes:
        """Avro single-object bytes of ``event``; raises BadEvent if over the size limit."""
        try:
            data = self.avro[event.type].encode(event)
        except UnicodeEncodeError as error:  # a lone surrogate (a JSON escape made it)
            bad = error.object[error.start : error.end]
            raise BadEvent(f"invalid {event.type}: a string holds {bad!r}, not Unicode") from None
        self._check_size(data)
        return data

    def encode_with_clear(self, event: Event) -> tuple[bytes, bytes]:
        """``event``'s clear Avro single-object bytes and what :meth:`encode` gives
        (the same bytes here; a sealing codec seals them), encoded once for both."""
        data = self.encode(event)
        return data, data

    def encode_json(self, event: Event) -> bytes:
        """The JSON wire format: envelope at top level, typed ``body`` object."""
        return event.model_dump_json().encode()

    # -- decoding ---------------------------------------------------------
    def decode(self, raw: bytes) -> Event:
        """A typed event from Avro single-object or JSON bytes, or BadEvent."""
        try:
            self._check_size(raw)
            if raw[:2] == MAGIC:
                return self._decode_avro(raw)
            if raw.lstrip()[:1] == b"{":
                event = self.from_json_object(self._load_json(raw))
                if b"\\ud" in raw or b"\\uD" in raw or b"\xed" in raw:
                    self.encode(event)  # json lets lone surrogates through: refuse them
                return event
            raise BadEvent(
                "not an engram event: neither Avro single-object encoding (C3 01) nor a JSON object"
            )
        except BadEvent as bad:
            raise BadEvent(bad.reason, raw) from None

    def decode_trusted(self, raw: bytes) -> Event:
        """The event in clear Avro ``raw`` that engram encoded from a valid event (what
        an authentic sealed event holds), read without validating it again
        (:mod:`schemas.reader`); bytes that reader does not cover or read whole (an
        older writer schema, JSON, a type not accepted, over the size limit) go to
        :meth:`decode`, which validates them and raises what is wrong. Only for bytes
        the caller can vouch for: others may come out as events validation refuses."""
        if len(raw) <= self.max_bytes and raw[:2] == MAGIC:
            writer = self.writers.get(raw[2:10])
            if (
                writer is not None
                and writer.trusted is not None
                and writer.reader.event_type.TYPE in self.accept
            ):
                try:
                    event, end = writer.trusted(raw, 10)
                except Exception:  # decode() says what is wrong
                    return self.decode(raw)
                if end == len(raw):
                    return event  # type: ignore[no-any-return]
        return self.decode(raw)

    def read_record(self, raw: bytes) -> tuple[type[Event], dict[str, Any]] | None:
        """The record in ``raw`` as fastavro reads it, with its event type, *not
        validated*: only for plain Avro single-object bytes written with the current
        schema of an accepted type, within the size limit, that read whole; None for
        anything else (older writer schemas, sealed events, JSON, bad bytes: those are
        for :meth:`decode`). For readers that trust the writer, as a rebuild trusts the
        fold that validated what it wrote; never raises."""
        if len(raw) > self.max_bytes or raw[:2] != MAGIC:
            return None
        writer = self.writers.get(raw[2:10])
        if writer is None or writer.parsed is not writer.reader.parsed:
            return None
        event_type = writer.reader.event_type
        if event_type.TYPE not in self.accept:
            return None
        try:
            return event_type, writer.read(raw[10:])
        except Exception:  # fastavro raises many types on bad bytes: decode() says why
            return None

    def from_json_object(self, obj: Any) -> Event:
        """Validate one JSON-decoded object as an event (the HTTP API's entry point)."""
        if not isinstance(obj, dict):
            raise BadEvent(f"an event must be a JSON object, got {type(obj).__name__}")
        type_name = obj.get("type")
        if type_name is None:
            raise BadEvent("type: Field required")
        event_type = self._type(type_name)
        try:
            return event_type.model_validate(obj)
        except ValidationError as error:
            raise BadEvent(f"invalid {type_name}: {describe(error)}") from None

    def _type(self, type_name: object) -> type[Event]:
        if not isinstance(type_name, str):
            raise BadEvent(f"type: expected a string, got {type(type_name).__name__}")
        if type_name not in self.accept:
            known = ", ".join(sorted(self.accept))
            raise BadEvent(f"unknown event type {type_name!r} (known: {known})")
        return TYPES_BY_NAME[type_name]

    def _check_size(self, raw: bytes) -> None:
        if not raw:
            raise BadEvent("empty message")
        if len(raw) > self.max_bytes:
            raise BadEvent(
                f"event is {len(raw)} bytes, over the limit of {self.max_bytes} bytes "
                "(ENGRAM_MAX_EVENT_BYTES)"
            )

    @staticmethod
    def _load_json(raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise BadEvent(f"malformed JSON: {error}") from None
        except RecursionError:
            raise BadEvent("malformed JSON: nested too deeply") from None

    def _decode_avro(self, raw: bytes) -> Event:
        if len(raw) < 10:
            raise BadEvent(f"truncated Avro header: {len(raw)} bytes, need at least 10")
        writer = self.writers.get(raw[2:10])
        if writer is None:
            raise BadEvent(f"unknown Avro schema fingerprint {raw[2:10].hex()}")
        event_type = writer.reader.event_type
        if event_type.TYPE not in self.accept:
            raise BadEvent(f"event type {event_type.TYPE!r} is not accepted here")
        try:
            record = writer.read(raw[10:])
        except Exception as error:  # fastavro raises many types on bad bytes
            raise BadEvent(f"malformed Avro body for {event_type.TYPE}: {error!r}") from None
        try:
            return event_type.model_validate(record)
        except ValidationError as error:
            raise BadEvent(f"invalid {event_type.TYPE}: {describe(error)}") from None
