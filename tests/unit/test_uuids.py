"""UUIDs that keep their text (:mod:`schemas.uuids`) are UUIDs in every respect."""

from __future__ import annotations

import copy
import pickle
import uuid

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from processors.ids import derived_id, uuid5_of
from schemas.avro import write_bytes
from schemas.reader import compile_reader
from schemas.uuids import TextUUID, of_int, with_text

INTS = st.integers(min_value=0, max_value=2**128 - 1)


class Holder(BaseModel):
    id: uuid.UUID


def _spellings(value: uuid.UUID) -> list[str]:
    """Texts ``uuid.UUID`` reads as ``value``: the canonical one and others."""
    text = str(value)
    return [text, text.upper(), "{" + text + "}", "urn:uuid:" + text, value.hex]


@given(INTS)
def test_a_uuid_made_with_its_text_is_the_same_uuid(value: int) -> None:
    plain = uuid.UUID(int=value)
    for made in (with_text(value, str(plain)), of_int(value)):
        assert isinstance(made, TextUUID)
        assert made == plain and plain == made and hash(made) == hash(plain)
        assert str(made) == str(plain) and f"{made}" == str(plain)
        assert str(made) is str(made)  # kept, not made again
        assert repr(made) == repr(plain)
        assert (made.hex, made.bytes, made.urn) == (plain.hex, plain.bytes, plain.urn)
        assert not made < plain and not made > plain
        assert Holder(id=made).model_dump_json() == Holder(id=plain).model_dump_json()
        for copied in (copy.copy(made), copy.deepcopy(made), pickle.loads(pickle.dumps(made))):
            assert type(copied) is uuid.UUID and copied == plain


@given(INTS)
def test_only_the_canonical_text_is_kept(value: int) -> None:
    """A reader may find a UUID spelt otherwise (upper case, braces, a URN): its
    text is then not kept, and ``str`` gives the canonical form as ``UUID`` does."""
    plain = uuid.UUID(int=value)
    for text in _spellings(plain):
        made = with_text(value, text)
        assert made == plain and str(made) == str(plain)
        assert isinstance(made, TextUUID) == (text == str(plain))


def test_a_text_uuid_made_by_uuids_constructor_formats_its_text_once() -> None:
    plain = uuid.uuid4()
    made = TextUUID(str(plain).upper())
    assert str(made) == str(plain) and str(made) is str(made)


@given(st.text(max_size=40), st.integers(min_value=0, max_value=50))
def test_deterministic_ids_are_uuid5s(name: str, idx: int) -> None:
    namespace = uuid.UUID("8f7d6b9e-3c1a-5e2f-9b4d-2a6c8e0f1b3d")
    expected = uuid.uuid5(namespace, name)
    made = uuid5_of(name)
    assert made == expected and str(made) == str(expected) and made.version == 5
    source = uuid.uuid4()
    assert str(derived_id(source, idx)) == str(uuid.uuid5(namespace, f"{source}:{idx}"))


@given(st.uuids(), st.sampled_from(range(5)))
def test_the_avro_reader_gives_a_uuid_spelt_canonically(value: uuid.UUID, spelling: int) -> None:
    """The compiled reader reads any spelling ``UUID`` accepts to the same UUID, whose
    text is the canonical one."""
    schema = {
        "type": "record",
        "name": "Holder",
        "fields": [{"name": "id", "type": {"type": "string", "logicalType": "uuid"}}],
    }
    body = write_bytes(_spellings(value)[spelling].encode())
    read = compile_reader(Holder, schema)
    assert read is not None
    held, end = read(body, 0)
    assert held.id == value and str(held.id) == str(value) and end == len(body)
