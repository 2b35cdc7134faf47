"""Sealed dead letters: the bytes a dead letter keeps are sealed under the subject
they name, open with that subject's key, and are gone once it is destroyed."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram import make_event
from schemas import Codec, Event
from schemas.avro import AVSC_DIR, MAGIC, fingerprint
from schemas.errors import BadEvent
from schemas.letters import (
    SEALED_LETTER_HEADER,
    SEALED_LETTER_SCHEMA,
    UNATTRIBUTED,
    keep_sealed,
    open_letter,
    seal_letter,
    subject_hint,
)
from schemas.sealed import SEALED_HEADER, Sealer
from sinks.keys import KeyBook

CODEC = Codec()


class Book(KeyBook):
    """A key book that makes a subject's key on first use (as the worker's does)."""

    def data_key(self, subject: str) -> tuple[str, bytes]:
        try:
            return super().data_key(subject)
        except LookupError:
            key_id = secrets.token_hex(4)
            self.keys.setdefault(subject, {})[key_id] = secrets.token_bytes(32)
            return key_id, self.keys[subject][key_id]  # type: ignore[return-value]

    def destroy(self, subject: str) -> None:
        for key_id in self.keys.get(subject, {}):
            self.keys[subject][key_id] = None


def test_the_subject_is_the_user_then_the_agent_then_the_key() -> None:
    bad_turn = {"type": "interaction.recorded", "agent_id": "bot", "user_id": "mei", "body": 3}
    assert subject_hint(json.dumps(bad_turn).encode(), b"bot") == "mei"
    del bad_turn["user_id"]
    assert subject_hint(json.dumps(bad_turn).encode(), b"bot") == "bot"
    assert subject_hint(b'{"agent_id": 7, "content": "x"}', b"bot-2") == "bot-2"
    assert subject_hint(b"not json at all \xff", b"bot-3") == "bot-3"
    assert subject_hint(b"not json at all", None) == UNATTRIBUTED
    assert subject_hint(b"[1, 2]", b"") == UNATTRIBUTED


def test_a_letter_that_is_not_utf8_still_names_its_user() -> None:
    """A producer writing Latin-1: the JSON does not decode as UTF-8, but its user is
    still who the letter belongs to (sealed under their key, erased with them)."""
    latin = '{"type": "interaction.recorded", "agent_id": "desk", "user_id": "fay",'
    latin += ' "body": {"role": "user", "content": "Mon numéro FAY-3939"}}'
    raw = latin.encode("latin-1")
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")
    assert subject_hint(raw, b"desk") == "fay"
    utf16 = latin.encode("utf-16")  # what json reads by itself stays read so
    assert subject_hint(utf16, b"desk") == "fay"


def test_ids_that_no_event_could_carry_name_nobody() -> None:
    # a unit separator would break the key topic's record keys: never a subject
    assert subject_hint(b'{"user_id": "me\\u001fi", "agent_id": "bot"}', None) == "bot"
    assert subject_hint(b'{"user_id": ""}', b"\x1f") == UNATTRIBUTED
    assert subject_hint(json.dumps({"user_id": "x" * 257}).encode(), None) == UNATTRIBUTED


def turn(user: str) -> Event:
    return make_event(
        "interaction.recorded",
        agent_id="bot",
        user_id=user,
        session_id="s",
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
        body={"role": "user", "content": "hello"},
    )


def test_clear_avro_names_its_subject_even_when_invalid() -> None:
    raw = CODEC.encode(turn("sam"))
    assert subject_hint(raw, None, CODEC) == "sam"
    assert subject_hint(raw[:30], b"bot", CODEC) == "bot"  # truncated: the key says


def test_a_sealed_letter_opens_with_its_key_and_hides_its_bytes() -> None:
    book = Book()
    raw = b'{"user_id": "mei", "body": {"content": "my passport number is X-123"}}'
    sealed = keep_sealed(book, raw, b"bot", CODEC)
    assert sealed.startswith(SEALED_LETTER_HEADER)
    assert b"passport" not in sealed and b"X-123" not in sealed
    letter = open_letter(book, sealed)
    assert (letter.state, letter.raw, letter.subject) == ("open", raw, "mei")


def test_an_erased_subject_s_letters_are_gone_and_others_stay() -> None:
    book = Book()
    mei = keep_sealed(book, b'{"user_id": "mei", "x": "secret of mei"}', None, CODEC)
    sam = keep_sealed(book, b'{"user_id": "sam", "x": "secret of sam"}', None, CODEC)
    book.destroy("mei")
    assert open_letter(book, mei) == open_letter(book, mei)  # deterministic
    gone = open_letter(book, mei)
    assert (gone.state, gone.raw, gone.subject) == ("erased", None, "mei")
    assert open_letter(book, sam).raw == b'{"user_id": "sam", "x": "secret of sam"}'
    assert open_letter(Book(), sam).state == "unknown key"
    assert open_letter(None, sam).state == "unknown key"


def test_sealed_events_and_clear_bytes_pass_as_they_are() -> None:
    book = Book()
    sealed_event = Sealer(CODEC, book).seal(turn("mei"))
    assert sealed_event.startswith(SEALED_HEADER)
    assert keep_sealed(book, sealed_event, b"bot", CODEC) == sealed_event
    letter = seal_letter(book, b"x", "mei")
    assert keep_sealed(book, letter, b"bot", CODEC) == letter
    assert open_letter(book, b"plain").state == "clear"


def test_a_tampered_letter_is_refused() -> None:
    book = Book()
    sealed = bytearray(seal_letter(book, b"some bytes", "mei"))
    sealed[-1] ^= 1
    with pytest.raises(BadEvent, match="does not authenticate"):
        open_letter(book, bytes(sealed))
    with pytest.raises(BadEvent, match="malformed"):
        open_letter(book, SEALED_LETTER_HEADER + b"\xff\xff\xff")


@given(raw=st.binary(max_size=300), key=st.none() | st.binary(max_size=40))
def test_any_bytes_are_kept_sealed_and_open_to_themselves(raw: bytes, key: bytes | None) -> None:
    book = Book()
    sealed = keep_sealed(book, raw, key, CODEC)
    if sealed == raw:  # only bytes that already are sealed pass unchanged
        assert raw.startswith((SEALED_HEADER, SEALED_LETTER_HEADER))
    else:
        assert open_letter(book, sealed).raw == raw


def test_the_committed_contract_is_the_sealed_letter_schema() -> None:
    path = AVSC_DIR / "wrappers" / "sealed_letter.v1.avsc"
    committed = json.loads(path.read_text(encoding="utf-8"))
    assert committed == SEALED_LETTER_SCHEMA
    assert MAGIC + fingerprint(committed) == SEALED_LETTER_HEADER
    assert SEALED_LETTER_HEADER not in {t.header for t in Codec().avro.values()}
    assert SEALED_LETTER_HEADER != SEALED_HEADER


def test_a_reader_without_keys_still_sees_whose_letter_it_is() -> None:
    sealed = seal_letter(Book(), b"x", "lea")
    assert open_letter(None, sealed).subject == "lea"
