"""BM25 weights recorded beside a memory's vector (``memory.embedded`` v2 ``terms``):
the embedding records what the tokenizer gives, and a vector rebuild takes them for
the creation they name instead of tokenising its text again, on either road (plain
Avro, typed), only when they are this tokenizer's and well formed; otherwise (older
bytes, another tokenizer, weights of another creation) it computes them, so the
points are those of the live projection either way."""

from __future__ import annotations

import json
import math
import struct
from base64 import b64encode
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID, uuid4

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streams.vectors as vectors
from ops.rebuild import VectorProjection, decode_derived
from processors.recall import TOKENIZER, document_sparse
from schemas import Codec, MemoryCreated, MemoryEmbedded
from schemas.avro import AVSC_DIR, MAGIC, fingerprint, write_single_object
from sinks.vectors import SparseVector
from streams.vectors import (
    PlainRecords,
    document_terms,
    embedded_event,
    operations,
    recorded_terms,
)

CODEC = Codec()
AT = datetime(2026, 11, 2, 9, 30, tzinfo=UTC)
TEXT = "我对花生过敏 — severely allergic to peanuts, and to cashews"
CREATION = UUID(int=1)


def packed(tokenizer: str, indices: list[int], values: list[float]) -> dict[str, Any]:
    """Weights as ``memory.embedded`` records them (see ``TermWeights``)."""
    return {
        "tokenizer": tokenizer,
        "indices": b64encode(struct.pack(f"<{len(indices)}I", *indices)).decode(),
        "values": b64encode(struct.pack(f"<{len(values)}d", *values)).decode(),
    }


FAKE = packed(TOKENIZER, [3, 5], [0.25, 0.5])


def created(text: str = TEXT) -> MemoryCreated:
    return MemoryCreated(
        event_id=CREATION,
        agent_id="travel-bot",
        user_id="mei",
        occurred_at=AT,
        source_event_id=UUID(int=2),
        seq=1,
        config_version="c1",
        body={
            "memory_id": str(UUID(int=3)),
            "layer": "L2",
            "kind": "turn",
            "text": text,
            "importance": 6.0,
            "sentiment": 0.0,
            "confidence": 1.0,
            "strength": 1.5,
        },
    )


def embedded(terms: Any, source: UUID = CREATION, model: str = "m") -> MemoryEmbedded:
    return MemoryEmbedded(
        event_id=UUID(int=4),
        agent_id="travel-bot",
        user_id="mei",
        occurred_at=AT,
        source_event_id=source,
        seq=1,
        config_version="c1",
        schema_version=2,
        body={
            "memory_id": str(UUID(int=3)),
            "model": model,
            "model_version": "1",
            "dims": 2,
            "terms": terms,
            "vector": [0.6, 0.8],
        },
    )


def true_terms(text: str = TEXT) -> dict[str, Any]:
    return document_terms(text).model_dump()


class TwoDims:
    """Enough of an embedder for :func:`embedded_event` (which never calls it)."""

    name, version, dims = "m", "1", 2


def rebuilt(*events: Any, typed: bool = False) -> list[Any]:
    """The rebuild's operations of ``events`` as plain Avro, or as JSON (typed road)."""
    encode = (lambda e: e.model_dump_json().encode()) if typed else CODEC.encode
    projection = VectorProjection(cast(Any, None), "m")  # read() never touches the index
    try:
        return projection.read([encode(e) for e in events], CODEC)
    finally:
        projection.pool.shutdown()


def sparse_of(ops: list[Any]) -> SparseVector:
    (upsert,) = [op for op in ops if op.kind == "upsert"]
    sparse: SparseVector = upsert.item.sparse
    return sparse


def test_an_embedding_records_the_weights_the_tokenizer_gives() -> None:
    event = embedded_event(created(), cast(Any, TwoDims()), [0.6, 0.8])
    assert event.schema_version == 2 == MemoryEmbedded.SCHEMA_VERSION
    assert event.body.terms is not None and event.body.terms.tokenizer == TOKENIZER
    terms = event.body.terms
    assert recorded_terms(terms.tokenizer, terms.indices, terms.values) == document_sparse(TEXT)
    assert CODEC.decode(CODEC.encode(event)) == event


@pytest.mark.parametrize("typed", [False, True], ids=["plain", "typed"])
def test_with_its_true_weights_recorded_the_rebuild_makes_the_live_point(typed: bool) -> None:
    events = [created(), embedded(true_terms())]
    live = operations(decode_derived(CODEC, [CODEC.encode(e) for e in events]), "m")
    assert rebuilt(*events, typed=typed) == live
    assert rebuilt(events[1], events[0], typed=typed)[1] == live[0]  # vector first: same point


@pytest.mark.parametrize("typed", [False, True], ids=["plain", "typed"])
def test_the_rebuild_takes_the_recorded_weights_without_tokenising(typed: bool) -> None:
    ops = rebuilt(created(), embedded(FAKE), typed=typed)
    assert sparse_of(ops) == SparseVector([3, 5], [0.25, 0.5])
    other_model = rebuilt(created(), embedded(FAKE, model="other"), typed=typed)
    assert sparse_of(other_model) == SparseVector([3, 5], [0.25, 0.5])  # text weights


@pytest.mark.parametrize("typed", [False, True], ids=["plain", "typed"])
@pytest.mark.parametrize(
    "terms, source",
    [
        (None, CREATION),  # none recorded
        ({**FAKE, "tokenizer": "engram-bm25-0/unicode-13.0.0"}, CREATION),  # another's
        (packed(TOKENIZER, [5, 3], [0.25, 0.5]), CREATION),  # not ascending
        (packed(TOKENIZER, [3, 5], [0.25]), CREATION),  # one weight short
        (packed(TOKENIZER, [3, 5], [0.25, math.nan]), CREATION),  # not a weight
        (FAKE, UUID(int=99)),  # another creation's weights
    ],
    ids=["none", "tokenizer", "order", "short", "nan", "creation"],
)
def test_weights_it_cannot_vouch_for_are_computed_again(
    typed: bool, terms: Any, source: UUID
) -> None:
    ops = rebuilt(created(), embedded(terms, source), typed=typed)
    assert sparse_of(ops) == SparseVector(*document_sparse(TEXT))


def test_a_creation_without_its_vector_in_the_batch_computes_its_weights() -> None:
    assert sparse_of(rebuilt(created())) == SparseVector(*document_sparse(TEXT))


@pytest.mark.parametrize(
    "terms, vouched",
    [
        (packed(TOKENIZER, [1, 2], [0.5, 0.5]), True),
        (packed(TOKENIZER, [0, 2**32 - 1], [0.5, 0.5]), True),
        (packed(TOKENIZER, [], []), True),
        (packed("other", [1, 2], [0.5, 0.5]), False),
        (packed(TOKENIZER, [2, 2], [0.5, 0.5]), False),
        (packed(TOKENIZER, [1, 2], [0.5]), False),
        (packed(TOKENIZER, [1, 2], [0.5, math.inf]), False),
        ({**packed(TOKENIZER, [1, 2], [0.5, 0.5]), "indices": "AQAA"}, False),  # 3 bytes
        ({**packed(TOKENIZER, [1, 2], [0.5, 0.5]), "values": "not base64!"}, False),
    ],
)
def test_recorded_terms_vouches_for_this_tokenizer_s_well_formed_weights(
    terms: dict[str, Any], vouched: bool
) -> None:
    found = recorded_terms(terms["tokenizer"], terms["indices"], terms["values"])
    assert (found is not None) is vouched


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_recorded_weights_unpack_to_what_the_tokenizer_gives(text: str) -> None:
    terms = document_terms(text)
    assert recorded_terms(terms.tokenizer, terms.indices, terms.values) == document_sparse(text)


def v1_embedded() -> bytes:
    """``memory.embedded`` as its version-1 contract wrote it (no ``terms``)."""
    v1 = json.loads((AVSC_DIR / "memory.embedded.v1.avsc").read_text(encoding="utf-8"))
    record = embedded(None).model_dump()
    del record["body"]["terms"]
    record["schema_version"] = 1
    return write_single_object(MAGIC + fingerprint(v1), fastavro.parse_schema(v1), record)


def test_version_1_vectors_read_without_weights_and_the_rebuild_computes_them() -> None:
    raw = v1_embedded()
    event = CODEC.decode(raw)
    assert isinstance(event, MemoryEmbedded) and event.schema_version == 1
    assert event.body.terms is None and event.body.vector == [0.6, 0.8]
    assert PlainRecords(CODEC).vector(raw) is None  # an older writer: the typed road
    projection = VectorProjection(cast(Any, None), "m")
    try:
        ops = projection.read([CODEC.encode(created()), raw], CODEC)
    finally:
        projection.pool.shutdown()
    assert sparse_of(ops) == SparseVector(*document_sparse(TEXT))
    assert [op.kind for op in ops] == ["upsert", "dense"]


@pytest.mark.parametrize(
    "text", ["Paris, in the spring of 2026", "用户希望把周四的评审改到周五下午。", ""]
)
def test_a_memorys_text_is_weighed_once_for_its_point_and_its_recorded_terms(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live projection weighs a new memory's text for its point and again, moments
    later, for the terms its ``memory.embedded`` records: the second time is
    remembered (:func:`streams.vectors.text_terms`), and both are what the tokenizer
    gives the text."""
    calls: list[str] = []

    def counted(text: str) -> tuple[list[int], list[float]]:
        calls.append(text)
        return document_sparse(text)

    monkeypatch.setattr(vectors, "document_sparse", counted)
    unique = f"{text} {uuid4().hex}"  # a text no earlier test weighed
    point = vectors.point_of(created(unique))
    recorded = document_terms(unique)
    assert calls == [unique]
    want = document_sparse(unique)
    assert point.sparse is not None
    assert (point.sparse.indices, point.sparse.values) == want
    assert recorded_terms(recorded.tokenizer, recorded.indices, recorded.values) == want
