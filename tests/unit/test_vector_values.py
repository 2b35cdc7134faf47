"""The values of the vector sink check and canonicalise what they are given, and their
fast paths give exactly what the plain definitions give."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.recall import document_sparse
from sinks.vectors import Point, SparseVector, canonical_id
from streams.vectors import document_terms, recorded_terms


@given(st.uuids(), st.sampled_from(range(5)))
def test_canonical_id_is_the_uuid_module_s_string(value: uuid.UUID, spelling: int) -> None:
    written = [str(value), str(value).upper(), value.hex, f"{{{value}}}", value.urn][spelling]
    assert canonical_id(written) == str(uuid.UUID(written)) == str(value)


@given(st.text(max_size=40))
def test_canonical_id_refuses_what_is_not_a_uuid(text: str) -> None:
    try:
        expected: str | None = str(uuid.UUID(text))
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(ValueError):
            canonical_id(text)
    else:
        assert canonical_id(text) == expected


def test_a_point_keeps_its_id_canonical() -> None:
    value = uuid.UUID(int=7)
    assert Point(str(value).upper(), None, None, {"agent_id": "a"}).id == str(value)
    with pytest.raises(ValueError):
        Point(123, None, None, {"agent_id": "a"})  # type: ignore[arg-type]  # not a str


@pytest.mark.parametrize("indices", [[-1], [2**32], [0, 2**32 + 5], [3, -2]])
def test_sparse_indices_must_fit_in_32_bits(indices: list[int]) -> None:
    with pytest.raises(ValueError):
        SparseVector(indices, [1.0] * len(indices))


def test_sparse_vectors_at_the_edges_are_accepted() -> None:
    assert SparseVector([], []).indices == []
    assert SparseVector([0, 2**32 - 1], [1.0, 2.0]).indices == [0, 2**32 - 1]


@given(st.text(max_size=400))
def test_the_weights_a_vouched_vector_takes_pass_every_check(text: str) -> None:
    """What :meth:`SparseVector.vouched` takes unchecked (the processors' BM25 weights,
    here of any text, CJK and collisions included) passes the checked constructor
    and makes an equal vector."""
    indices, values = document_sparse(text)
    assert SparseVector.vouched(indices, values) == SparseVector(indices, values)
    assert indices == sorted(set(indices))


def test_recorded_terms_pass_every_check_too() -> None:
    text = "我对花生过敏 — severely allergic to peanuts, 花生"
    indices, values = document_sparse(text)
    packed = document_terms(text)
    recorded = recorded_terms(packed.tokenizer, packed.indices, packed.values)
    assert recorded is not None
    assert SparseVector.vouched(*recorded) == SparseVector(indices, values)
