"""Fuzzing the decoder: random bytes and mutated valid events (Avro single-object and
JSON) never make ``decode`` raise anything but ``BadEvent``; whatever decodes
round-trips. The mutations are those of ``ops.fuzz`` (which runs millions of them);
here hypothesis drives them, plus exhaustive bit flips and truncations."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops.fuzz import MUTATIONS, check, garbage, mutant, run_random, seed_corpus, seed_events
from schemas import BadEvent, Codec, InteractionRecorded
from schemas.avro import MAGIC

CODEC = Codec(max_bytes=4096)
CORPUS = seed_corpus(CODEC)
AVRO = [c for c in CORPUS if c[:2] == MAGIC]
JSON = [c for c in CORPUS if c[:1] == b"{"]
FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def refused(raw: bytes, codec: Codec = CODEC) -> str:
    with pytest.raises(BadEvent) as caught:
        codec.decode(raw)
    assert type(caught.value) is BadEvent and caught.value.raw == raw
    return caught.value.reason


def test_the_corpus_covers_every_raw_type_and_the_derived_ones_in_both_encodings() -> None:
    types = {e.type for e in seed_events()}
    assert {"interaction.recorded", "clock.tick", "subject.erasure_requested"} <= types
    assert {"working.updated", "memory.created"} <= types
    assert len(AVRO) == len(JSON) == len(seed_events())
    assert all(check(CODEC, raw) is None for raw in CORPUS)


@FUZZ
@given(raw=st.binary(max_size=600))
def test_random_bytes(raw: bytes) -> None:
    check(CODEC, raw)


@FUZZ
@given(header=st.sampled_from([a[:10] for a in AVRO]), body=st.binary(max_size=400))
def test_random_body_behind_every_valid_header(header: bytes, body: bytes) -> None:
    check(CODEC, header + body)


@FUZZ
@given(seed=st.integers(0, 2**64 - 1))
def test_mutated_valid_events(seed: int) -> None:
    check(CODEC, mutant(random.Random(seed), CORPUS))


@FUZZ
@given(
    base=st.sampled_from(CORPUS),
    steps=st.lists(
        st.tuples(st.integers(0, len(MUTATIONS) - 1), st.integers(0, 2**32)), max_size=6
    ),
)
def test_chains_of_each_mutation(base: bytes, steps: list[tuple[int, int]]) -> None:
    data = base
    for which, seed in steps:
        data = MUTATIONS[which](data, random.Random(seed), CORPUS)
        check(CODEC, data)


@FUZZ
@given(seed=st.integers(0, 2**64 - 1))
def test_garbage(seed: int) -> None:
    check(CODEC, garbage(random.Random(seed), CORPUS))


@FUZZ
@given(first=st.sampled_from(CORPUS), second=st.sampled_from(CORPUS))
def test_two_events_in_one_message_are_refused(first: bytes, second: bytes) -> None:
    """Avro single-object encoding holds one datum: bytes after it are not ignored."""
    reason = refused(first + second)
    assert reason.startswith(("malformed Avro body", "malformed JSON"))


@pytest.mark.parametrize("raw", AVRO[:6], ids=lambda raw: CODEC.decode(raw).type)
def test_every_single_bit_flip(raw: bytes) -> None:
    for i in range(len(raw)):
        for bit in range(8):
            check(CODEC, raw[:i] + bytes([raw[i] ^ (1 << bit)]) + raw[i + 1 :])


@pytest.mark.parametrize("raw", CORPUS, ids=range(len(CORPUS)))
def test_every_truncation_is_refused(raw: bytes) -> None:
    for end in range(len(raw)):
        refused(raw[:end])


def test_a_trailing_byte_is_refused() -> None:
    for raw in AVRO:
        assert refused(raw + b"\x00").endswith("1 bytes after the end of the record')")


def test_the_random_loop_of_ops_fuzz_keeps_the_contract() -> None:
    tally = run_random(3000, seed=7, max_bytes=4096)
    assert tally.inputs == 3000 and not tally.broken
    assert tally.decoded >= len(CORPUS)  # the corpus at least, and a few lucky mutants
    assert {"malformed Avro body", "malformed JSON", "not an engram event"} <= set(tally.refused)


# -- valid events round-trip ---------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), max_size=200)
moments = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


@FUZZ
@given(
    content=texts,
    entities=st.lists(texts, max_size=4),
    importance=st.none() | st.floats(1.0, 10.0),
    sentiment=st.none() | st.floats(-1.0, 1.0),
    at=moments,
    event_id=st.uuids(),
)
def test_any_valid_interaction_round_trips(
    content: str,
    entities: list[str],
    importance: float | None,
    sentiment: float | None,
    at: datetime,
    event_id: UUID,
) -> None:
    """Far past and far future included: the decoder takes any representable instant."""
    event = InteractionRecorded(
        event_id=event_id,
        agent_id="agent-甲",
        occurred_at=at,
        body={
            "role": "user",
            "content": content,
            "entities": entities,
            "importance": importance,
            "sentiment": sentiment,
        },
    )
    assert CODEC.decode(CODEC.encode(event)) == event
    assert CODEC.decode(CODEC.encode_json(event)) == event
    assert check(CODEC, CODEC.encode(event)) is None


def test_far_future_and_far_past_events_decode_as_they_are() -> None:
    base = json.loads(JSON[1])
    for at in (datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)):
        event = CODEC.from_json_object(base | {"occurred_at": at.isoformat()})
        assert CODEC.decode(CODEC.encode(event)).occurred_at == at
    late = datetime(9999, 12, 31, 23, 59, tzinfo=UTC) + timedelta(seconds=59)
    assert refused(json.dumps(base | {"occurred_at": "10000-01-01T00:00:00Z"}).encode())
    assert CODEC.decode(json.dumps(base | {"occurred_at": late.isoformat()}).encode())


def test_oversize_is_refused_with_the_limit() -> None:
    big = json.loads(JSON[1])
    big["body"]["content"] = "记忆" * 2000
    raw = json.dumps(big, ensure_ascii=False).encode()
    assert refused(raw) == (
        f"event is {len(raw)} bytes, over the limit of 4096 bytes (ENGRAM_MAX_EVENT_BYTES)"
    )


@pytest.mark.parametrize("field", ["intent", "content"])
@pytest.mark.parametrize("spelling", [b"\\udc0f", b"\xed\xb0\x8f", b"\\ud83d"])
def test_a_lone_surrogate_in_json_is_refused(field: str, spelling: bytes) -> None:
    """JSON lets a lone surrogate through (an escape, or its UTF-8-like bytes), pydantic
    does in a plain ``str`` field, Avro cannot write it: refused at decode, not later."""
    obj = json.loads(JSON[1])
    obj["body"][field] = "PLACEHOLDER"
    raw = json.dumps(obj).encode().replace(b"PLACEHOLDER", b"a" + spelling + b"b")
    assert "not Unicode" in refused(raw) or "unicode string" in refused(raw)


def test_encoding_an_event_with_a_lone_surrogate_is_a_bad_event() -> None:
    event = CODEC.decode(JSON[1])
    body = event.body.model_copy(update={"intent": "\udc0f"})  # type: ignore[attr-defined]
    with pytest.raises(BadEvent, match=r"a string holds '\\udc0f', not Unicode"):
        CODEC.encode(event.model_copy(update={"body": body}))


def test_a_pair_of_surrogate_escapes_is_one_character() -> None:
    obj = json.loads(JSON[1])
    obj["body"]["intent"] = "😀"
    raw = json.dumps(obj).encode()
    assert b"\\ud83d\\ude00" in raw
    assert CODEC.decode(raw).body.intent == "😀"  # type: ignore[attr-defined]
