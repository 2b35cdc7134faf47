"""Every way bytes can fail to be an event becomes a ``BadEvent`` with a precise
reason and the untouched bytes; ``decode`` never raises anything else."""

from __future__ import annotations

import json
import pickle
import re
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas
from schemas import (
    BadEvent,
    Codec,
    EpisodeClosed,
    Event,
    InteractionRecorded,
    MemoryEmbedded,
    PersonaUpdated,
    SubjectErasureRequested,
    ToolResult,
    WorkingUpdated,
)
from schemas.avro import MAGIC

CODEC = Codec()
AT = datetime(2024, 5, 4, 12, 30, 15, 250_000, tzinfo=UTC)
ID = UUID("3b8f2a1e-6c4d-4e7f-9a0b-1c2d3e4f5a6b")
SRC = UUID("11111111-2222-4333-8444-555555555555")
DERIVED = {"source_event_id": SRC, "seq": 7, "config_version": "default@0123456789"}


def interaction(
    content: str = "用户说：我喜欢绿茶 and jasmine", **body: Any
) -> InteractionRecorded:
    return InteractionRecorded(
        event_id=ID,
        agent_id="agent-1",
        session_id="s-1",
        user_id="u-1",
        occurred_at=AT,
        body={"role": "user", "content": content, "intent": "preference", **body},
    )


SAMPLES: list[Event] = [
    interaction(entities=["绿茶", "jasmine"], importance=7.5, sentiment=-0.25, confidence=1.0),
    ToolResult(
        event_id=ID,
        agent_id="agent-1",
        session_id="s-1",
        occurred_at=AT,
        body={"call_id": "c-1", "tool": "search", "content": "结果 " * 20},
    ),
    PersonaUpdated(
        event_id=ID,
        agent_id="a",
        occurred_at=AT,
        body={"name": "小助手", "preferences": {"语言": "中文"}},
    ),
    SubjectErasureRequested(
        event_id=ID, agent_id="a", occurred_at=AT, body={"subject": "u-1", "requested_at": AT}
    ),
    WorkingUpdated(
        event_id=ID,
        agent_id="a",
        occurred_at=AT,
        **DERIVED,
        body={
            "added": [
                {
                    "event_id": str(SRC),
                    "role": "user",
                    "content": "你好",
                    "occurred_at": AT,
                    "tokens": 2,
                }
            ],
            "evicted": 1,
            "size": 3,
            "tokens": 7,
            "task": "订机票",
        },
    ),
    EpisodeClosed(
        event_id=ID,
        agent_id="a",
        occurred_at=AT,
        **DERIVED,
        body={
            "episode_id": "e-1",
            "summary": "聊了茶",
            "importance": 3.0,
            "sentiment": 0.5,
            "confidence": 0.9,
            "turn_count": 4,
            "started_at": AT,
            "ended_at": AT,
            "cut": "session_ended",
            "summariser": "stub",
        },
    ),
    MemoryEmbedded(
        event_id=ID,
        agent_id="a",
        occurred_at=AT,
        **DERIVED,
        body={
            "memory_id": "m",
            "model": "bge",
            "model_version": "1",
            "dims": 3,
            "vector": [0.1, -2.5, 3e-7],
        },
    ),
]
VALID_ENCODINGS = [CODEC.encode(e) for e in SAMPLES] + [CODEC.encode_json(e) for e in SAMPLES]


def json_of(event: Event, **changes: Any) -> dict[str, Any]:
    """The JSON object of ``event`` with ``changes`` applied; ``body__x`` edits the body,
    a value of ``...`` deletes the key."""
    obj: dict[str, Any] = json.loads(CODEC.encode_json(event))
    for key, value in changes.items():
        target, name = (obj["body"], key[6:]) if key.startswith("body__") else (obj, key)
        if value is ...:
            del target[name]
        else:
            target[name] = value
    return obj


def reason_of(raw: bytes, codec: Codec = CODEC) -> BadEvent:
    with pytest.raises(BadEvent) as caught:
        codec.decode(raw)
    assert type(caught.value) is BadEvent
    assert caught.value.raw == raw, "BadEvent.raw must keep the original bytes"
    assert str(caught.value) == caught.value.reason
    return caught.value


# -- size --------------------------------------------------------------------------


def test_empty_bytes() -> None:
    assert reason_of(b"").reason == "empty message"


def test_over_the_size_limit_on_decode() -> None:
    small = Codec(max_bytes=600)
    data = CODEC.encode(interaction("记忆" * 400))
    assert len(data) > 600
    bad = reason_of(data, small)
    assert bad.reason == (
        f"event is {len(data)} bytes, over the limit of 600 bytes (ENGRAM_MAX_EVENT_BYTES)"
    )


def test_over_the_size_limit_on_encode() -> None:
    small = Codec(max_bytes=600)
    event = interaction("x" * 590)
    with pytest.raises(BadEvent, match=r"event is \d+ bytes, over the limit of 600 bytes"):
        small.encode(event)
    assert len(small.encode(interaction("x"))) <= 600  # the same codec still encodes small ones


def test_exactly_at_the_limit_passes() -> None:
    data = CODEC.encode(interaction())
    assert Codec(max_bytes=len(data)).decode(data) == interaction()
    reason_of(data, Codec(max_bytes=len(data) - 1))


# -- Avro ----------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [MAGIC, MAGIC + b"\x01\x02\x03", CODEC.encode(interaction())[:9]])
def test_truncated_avro_header(raw: bytes) -> None:
    bad = reason_of(raw)
    assert bad.reason == f"truncated Avro header: {len(raw)} bytes, need at least 10"


def test_unknown_fingerprint_is_shown_in_hex() -> None:
    body = CODEC.encode(interaction())[10:]
    raw = MAGIC + bytes.fromhex("0123456789abcdef") + body
    assert reason_of(raw).reason == "unknown Avro schema fingerprint 0123456789abcdef"


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda body: b"", id="header-only"),
        pytest.param(lambda body: body[: len(body) // 2], id="half-body"),
        pytest.param(lambda body: body[:-1], id="last-byte-missing"),
        pytest.param(lambda body: b"\xff" * 40, id="endless-varint"),
        pytest.param(lambda body: b"\x02" + body[1:], id="uuid-length-wrong"),
    ],
)
def test_malformed_avro_body(cut: Any) -> None:
    data = CODEC.encode(interaction())
    raw = data[:10] + cut(data[10:])
    assert reason_of(raw).reason.startswith("malformed Avro body for interaction.recorded: ")


def test_avro_body_that_decodes_but_is_invalid() -> None:
    """fastavro reads a record, the model refuses it: the reason names the field."""
    event = interaction()
    good = CODEC.encode(event)
    # the role is the first body string: rewrite 'user' (len 4) to 'boss'
    raw = good.replace(b"\x08user", b"\x08boss", 1)
    assert raw != good
    assert re.match(r"invalid interaction\.recorded: body\.role: ", reason_of(raw).reason)


def test_derived_avro_rejected_where_only_raw_types_are_accepted() -> None:
    raw_only = Codec(accept=schemas.RAW_TYPE_NAMES)
    data = CODEC.encode(SAMPLES[4])
    assert reason_of(data, raw_only).reason == "event type 'working.updated' is not accepted here"
    assert raw_only.decode(CODEC.encode(SAMPLES[0])) == SAMPLES[0]


# -- JSON ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b'{"type": ', b'{"type": "interaction.recorded",}', b"{'single': 'quotes'}", b'{"a": "\xff"}'],
)
def test_malformed_json(raw: bytes) -> None:
    assert reason_of(raw).reason.startswith("malformed JSON: ")


def test_json_nested_too_deeply() -> None:
    raw = b'{"a":' * 20_000
    assert reason_of(raw).reason == "malformed JSON: nested too deeply"


@pytest.mark.parametrize("raw", [b'[{"type": "clock.tick"}]', b'"interaction.recorded"', b"42"])
def test_json_that_is_not_an_object_on_the_wire(raw: bytes) -> None:
    assert reason_of(raw).reason == (
        "not an engram event: neither Avro single-object encoding (C3 01) nor a JSON object"
    )


@pytest.mark.parametrize(
    ("obj", "name"), [([{"type": "clock.tick"}], "list"), ("clock.tick", "str"), (None, "NoneType")]
)
def test_json_that_is_not_an_object_at_the_api(obj: Any, name: str) -> None:
    with pytest.raises(BadEvent) as caught:
        CODEC.from_json_object(obj)
    assert caught.value.reason == f"an event must be a JSON object, got {name}"


def test_missing_type() -> None:
    raw = json.dumps(json_of(interaction(), type=...)).encode()
    assert reason_of(raw).reason == "type: Field required"


@pytest.mark.parametrize(("value", "name"), [(3, "int"), (["clock.tick"], "list"), (True, "bool")])
def test_non_string_type(value: Any, name: str) -> None:
    raw = json.dumps(json_of(interaction(), type=value)).encode()
    assert reason_of(raw).reason == f"type: expected a string, got {name}"


def test_unknown_type_lists_the_known_ones() -> None:
    raw = json.dumps(json_of(interaction(), type="memory.dreamt")).encode()
    reason = reason_of(raw).reason
    assert reason.startswith("unknown event type 'memory.dreamt' (known: ")
    listed = reason.split("(known: ", 1)[1].rstrip(")").split(", ")
    assert listed == sorted(schemas.TYPES_BY_NAME)


def test_derived_json_rejected_where_only_raw_types_are_accepted() -> None:
    raw_only = Codec(accept=schemas.RAW_TYPE_NAMES)
    bad = reason_of(CODEC.encode_json(SAMPLES[4]), raw_only)
    assert bad.reason.startswith("unknown event type 'working.updated' (known: ")
    assert "memory.created" not in bad.reason
    assert "interaction.recorded" in bad.reason


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"body__content": ...}, "body.content: Field required"),
        ({"event_id": ...}, "event_id: Field required"),
        ({"body": ...}, "body: Field required"),
        ({"body__importance": "high"}, "body.importance: Input should be a valid number"),
        ({"occurred_at": "yesterday"}, "occurred_at: Input should be a valid datetime"),
        ({"occurred_at": "2024-01-01T00:00:00"}, "occurred_at: Input should have timezone info"),
        ({"occurred_at": 1.5e300}, "occurred_at: "),
        ({"occurred_at": "0001-01-01T00:00:00+05:00"}, "occurred_at: Value error, datetime out"),
        ({"event_id": "not-a-uuid"}, "event_id: Input should be a valid UUID"),
        ({"agent_id": ""}, "agent_id: String should have at least 1 character"),
        ({"agent_id": "a\nb"}, "agent_id: String should match pattern"),
        ({"body__role": "robot"}, "body.role: Input should be 'user', 'assistant', 'system' or"),
        ({"body__entities": "绿茶"}, "body.entities: Input should be a valid list"),
        ({"body__sentiment": 2.0}, "body.sentiment: Input should be less than or equal to 1"),
        ({"body__importance": 0}, "body.importance: Input should be greater than or equal to 1"),
        ({"body__confidence": -0.1}, "body.confidence: Input should be greater than or equal to 0"),
        ({"schema_version": 0}, "schema_version: Input should be greater than or equal to 1"),
        ({"schema_version": 2**63}, "schema_version: Input should be less than or equal to"),
        ({"body__mood": "happy"}, "body.mood: Extra inputs are not permitted"),
        ({"priority": 1}, "priority: Extra inputs are not permitted"),
    ],
)
def test_invalid_fields_are_named(changes: dict[str, Any], expected: str) -> None:
    raw = json.dumps(json_of(interaction(), **changes)).encode()
    reason = reason_of(raw).reason
    assert reason.startswith("invalid interaction.recorded: ")
    assert expected in reason


def test_every_problem_is_listed() -> None:
    obj = json_of(interaction(), agent_id=..., body__sentiment=9, body__mood=1)
    reason = reason_of(json.dumps(obj).encode()).reason
    parts = reason.removeprefix("invalid interaction.recorded: ").split("; ")
    assert sorted(p.split(":")[0] for p in parts) == ["agent_id", "body.mood", "body.sentiment"]


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_numbers_are_rejected(value: str) -> None:
    raw = json.dumps(json_of(interaction(), body__sentiment=float(value))).encode()
    assert f'"sentiment": {value}'.encode() in raw  # Python's json writes and reads these
    assert "body.sentiment: Input should be a finite number" in reason_of(raw).reason


def test_type_mismatch_between_literal_and_body() -> None:
    obj = json_of(interaction(), type="tool.called")
    reason = reason_of(json.dumps(obj).encode()).reason
    assert reason.startswith("invalid tool.called: ")
    assert "body.call_id: Field required" in reason


# -- neither -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", [b"hello", b"\x00\x01\x02", b"\xc3", b"\x01\xc3" + b"0" * 20, b"   "]
)
def test_neither_avro_nor_json(raw: bytes) -> None:
    assert reason_of(raw).reason.startswith("not an engram event: neither Avro")


def test_leading_whitespace_before_json_is_fine() -> None:
    assert CODEC.decode(b" \n\t" + CODEC.encode_json(SAMPLES[0])) == SAMPLES[0]


def test_bad_event_pickles_with_reason_and_raw() -> None:
    bad = reason_of(b"\x00garbage")
    again = pickle.loads(pickle.dumps(bad))
    assert (type(again), again.reason, again.raw) == (BadEvent, bad.reason, bad.raw)


def test_api_errors_carry_no_bytes() -> None:
    with pytest.raises(BadEvent) as caught:
        CODEC.from_json_object({"type": "clock.tick"})
    assert caught.value.raw == b""
    assert caught.value.reason.startswith("invalid clock.tick: ")


# -- decode never raises anything but BadEvent -----------------------------------------


def decodes_or_is_bad(raw: bytes) -> Event | None:
    """The contract: a valid event, or BadEvent keeping the bytes; nothing else."""
    try:
        event = CODEC.decode(raw)
    except BadEvent as bad:
        assert bad.raw == raw
        assert bad.reason
        return None
    assert isinstance(event, schemas.TYPES_BY_NAME[event.type])
    assert type(event).model_validate(event.model_dump()) == event
    assert CODEC.decode(CODEC.encode(event)) == event  # whatever decodes can be re-encoded
    assert CODEC.decode(CODEC.encode_json(event)) == event
    return event


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(raw=st.binary(max_size=300))
def test_arbitrary_bytes(raw: bytes) -> None:
    decodes_or_is_bad(raw)


@FUZZ
@given(tail=st.binary(max_size=200), header=st.sampled_from([e[:10] for e in VALID_ENCODINGS[:7]]))
def test_valid_header_arbitrary_body(header: bytes, tail: bytes) -> None:
    decodes_or_is_bad(header + tail)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.just(0)),
)


def mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    buf = bytearray(data)
    for op, where, value in ops:
        i = where % (len(buf) + 1)
        if op == "insert":
            buf.insert(i, value)
        elif buf:
            i = min(i, len(buf) - 1)
            if op == "flip":
                buf[i] ^= value
            else:
                del buf[i]
    return bytes(buf)


@FUZZ
@given(base=st.sampled_from(VALID_ENCODINGS), ops=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_valid_encodings(base: bytes, ops: list[tuple[str, int, int]]) -> None:
    decodes_or_is_bad(mutate(base, ops))


def test_mutation_helper_really_mutates() -> None:
    data = VALID_ENCODINGS[0]
    assert mutate(data, [("flip", 3, 1)]) != data
    assert len(mutate(data, [("insert", 0, 7)])) == len(data) + 1
    assert len(mutate(data, [("delete", 99_999, 0)])) == len(data) - 1


NASTY: list[Any] = [
    2**63,
    -(2**63) - 1,
    2**64,
    10**30,
    -1,
    float("nan"),
    float("inf"),
    1e308,
    "2024-01-01T00:00:00",
    "0001-01-01T00:00:00+05:00",
    "9999-12-31T23:59:59-05:00",
    "绿茶",
    "",
    None,
    [],
    {},
]
json_values = st.one_of(
    st.sampled_from(NASTY),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=6,
    ),
)


def test_every_field_replaced_by_every_nasty_value() -> None:
    """Exhaustive companion of the fuzz below: each field of each sample, each value."""
    tried = 0
    for sample in SAMPLES:
        obj = json_of(sample)
        for in_body in (False, True):
            target_keys = [*sorted(obj["body"] if in_body else obj), "extra_field"]
            for key in target_keys:
                for value in NASTY:
                    changed = json_of(sample)
                    (changed["body"] if in_body else changed)[key] = value
                    decodes_or_is_bad(json.dumps(changed).encode())
                    tried += 1
    assert tried > 1000


@FUZZ
@given(data=st.data())
def test_json_with_any_field_replaced(data: st.DataObject) -> None:
    """Structure-aware fuzzing: swap one field (envelope or body) for any JSON value."""
    sample = data.draw(st.sampled_from(SAMPLES))
    obj = json_of(sample)
    in_body = data.draw(st.booleans())
    target = obj["body"] if in_body else obj
    key = data.draw(st.sampled_from([*sorted(target), "extra_field"]))
    target[key] = data.draw(json_values)
    raw = json.dumps(obj).encode()  # NaN / Infinity included, as Python's json allows
    decodes_or_is_bad(raw)


def test_valid_samples_decode() -> None:
    decoded = [decodes_or_is_bad(raw) for raw in VALID_ENCODINGS]
    assert decoded == SAMPLES + SAMPLES
