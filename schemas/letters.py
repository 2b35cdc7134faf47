"""Sealed dead letters: bad input kept for the operator, readable only with its
subject's data key.

A dead letter keeps the bytes that could not be processed, so that an operator can
see what went wrong and republish once it is fixed. Those bytes may hold personal
content (a JSON producer's malformed turn), and the dead-letter topic keeps them, so
with sealing on they are sealed like events: under the data key of the subject the
bytes name (:func:`subject_hint`: their ``user_id``, else their ``agent_id``, else
the record key's agent), and an erasure that destroys the subject's keys makes them
unreadable with the rest. Bytes that name nobody are sealed under
:data:`UNATTRIBUTED`'s key (one subject, erasable as a whole with ``engram erase
--user engram:unattributed``). Bytes that already are a sealed event stay as they
are: their subject's key seals them already.

Wire format: Avro single-object encoding of :data:`SEALED_LETTER_SCHEMA`
(``schemas/avsc/wrappers/sealed_letter.v1.avsc``): the subject and key id in clear,
the bytes under AES-256-GCM with the subject and key id as additional authenticated
data.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import fastavro
from cryptography.exceptions import InvalidTag

from schemas.avro import MAGIC, fingerprint, read_single_object, write_single_object
from schemas.codec import Codec
from schemas.errors import BadEvent
from schemas.sealed import Keyring, aead, is_sealed, new_nonce

SEALED_LETTER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "engram.SealedLetter",
    "doc": "A dead letter's bytes encrypted under the data key of the subject they name.",
    "fields": [
        {"name": "subject", "type": "string"},
        {"name": "key_id", "type": "string"},
        {"name": "nonce", "type": "bytes"},
        {"name": "ciphertext", "type": "bytes"},
    ],
}
_PARSED = fastavro.parse_schema(SEALED_LETTER_SCHEMA)
SEALED_LETTER_HEADER = MAGIC + fingerprint(SEALED_LETTER_SCHEMA)
"""The first 10 bytes of every sealed dead letter."""

UNATTRIBUTED = "engram:unattributed"
"""The subject whose key seals dead letters that name no user and no agent."""

_SCAN_LIMIT = 1 << 20
"""Bytes longer than this are not parsed for their subject (the record key names it)."""


def is_sealed_letter(raw: bytes) -> bool:
    return raw[:10] == SEALED_LETTER_HEADER


def _ident(value: Any) -> str | None:
    """``value`` if it is a valid id (as :data:`schemas.base.Ident`: 1 to 256
    characters, no control character), else None."""
    if isinstance(value, str) and 0 < len(value) <= 256 and not _CONTROL.search(value):
        return value
    return None


_CONTROL = re.compile(r"[\x00-\x1f]")


def _named(found: Any) -> str | None:
    """``user_id``, else ``agent_id``, of a decoded mapping (valid ids only)."""
    if not isinstance(found, dict):
        return None
    return _ident(found.get("user_id")) or _ident(found.get("agent_id"))


def subject_hint(raw: bytes, key: bytes | None, codec: Codec | None = None) -> str:
    """The subject bad bytes belong to, as well as they tell: the ``user_id``, else the
    ``agent_id``, of a JSON object or of clear Avro ``codec`` knows the writer schema
    of (read leniently: the bytes failed validation); else the record key's agent;
    else :data:`UNATTRIBUTED`."""
    named: str | None = None
    if len(raw) <= _SCAN_LIMIT:
        if raw[:2] == MAGIC and codec is not None:
            writer = codec.writers.get(raw[2:10])
            if writer is not None:
                try:
                    named = _named(fastavro.schemaless_reader(io.BytesIO(raw[10:]), writer.parsed))
                except Exception:  # fastavro raises many types on bad bytes
                    named = None
        else:
            named = _named_json(raw)
    if named is None and key:
        named = _ident(key.decode("utf-8", errors="replace"))
    return named or UNATTRIBUTED


def _named_json(raw: bytes) -> str | None:
    """The subject a JSON object names, read leniently: bytes that are not UTF-8 (a
    producer writing Latin-1, say) are read with their bad bytes replaced, so that a
    letter naming its user is still sealed under that user's key."""
    for text in (raw, raw.decode("utf-8", errors="replace")):
        try:
            return _named(json.loads(text))
        except (ValueError, RecursionError):
            continue
    return None


def _aad(subject: str, key_id: str) -> bytes:
    return "\x00".join(("engram.sealed-letter.v1", subject, key_id)).encode()


def seal_letter(keyring: Keyring, raw: bytes, subject: str) -> bytes:
    """``raw`` sealed under ``subject``'s current data key (made when it has none)."""
    key_id, key = keyring.data_key(subject)
    nonce = new_nonce()
    record = {
        "subject": subject,
        "key_id": key_id,
        "nonce": nonce,
        "ciphertext": aead(key).encrypt(nonce, raw, _aad(subject, key_id)),
    }
    return write_single_object(SEALED_LETTER_HEADER, _PARSED, record)


def keep_sealed(keyring: Keyring, raw: bytes, key: bytes | None, codec: Codec) -> bytes:
    """What the dead-letter topic keeps of ``raw``: sealed events and sealed letters as
    they are, any other bytes sealed under their :func:`subject_hint`."""
    if is_sealed(raw) or is_sealed_letter(raw):
        return raw
    return seal_letter(keyring, raw, subject_hint(raw, key, codec))


@dataclass(frozen=True)
class Letter:
    """A dead letter as its reader sees it: ``state`` ``clear`` (kept unsealed: sealing
    was off), ``open`` (opened with its key), ``erased`` (its subject's key was
    destroyed: the bytes are gone for good) or ``unknown key`` (not in this keyring);
    ``raw`` the bytes, for the first two; ``subject`` when sealed."""

    state: Literal["clear", "open", "erased", "unknown key"]
    raw: bytes | None
    subject: str | None


def open_letter(keyring: Keyring | None, value: bytes) -> Letter:
    """The bytes a dead letter kept (a sealed letter opened with ``keyring``, clear or
    sealed-event bytes as they are: a sealed event opens with the codec); BadEvent if
    a sealed letter is malformed or does not authenticate."""
    if not is_sealed_letter(value):
        return Letter("clear", value, None)
    record = read_single_object(value, _PARSED, "sealed dead letter")
    subject, key_id = str(record["subject"]), str(record["key_id"])
    key = keyring.find(subject, key_id) if keyring is not None else None
    if key is None:
        gone = keyring is not None and keyring.destroyed(subject, key_id)
        return Letter("erased" if gone else "unknown key", None, subject)
    try:
        raw = aead(key).decrypt(record["nonce"], record["ciphertext"], _aad(subject, key_id))
    except (InvalidTag, ValueError):
        raise BadEvent("sealed dead letter does not authenticate", value) from None
    return Letter("open", raw, subject)
