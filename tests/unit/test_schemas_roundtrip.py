"""Every event type survives both wire formats, and the committed ``.avsc`` contracts
are exactly what the models generate.

The strategies are derived from the models themselves (``model_fields`` and the
constraints in their annotations), so a new field or a new type is covered
without touching this file.
"""

from __future__ import annotations

import json
import re
import types
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import AwareDatetime, BaseModel, ValidationError
from pydantic.fields import FieldInfo

import schemas
from schemas import Codec, Event, InteractionRecorded, WorkingSet
from schemas.avro import AVSC_DIR, MAGIC, avro_schema, avsc_name, fingerprint, write_avsc

CODEC = Codec()
ROUNDTRIP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies derived from the models ----------------------------------------

OFFSETS = [
    timedelta(0),
    timedelta(hours=5, minutes=30),
    timedelta(hours=-8),
    timedelta(hours=14),
    timedelta(hours=-12),
    timedelta(hours=9),
    timedelta(minutes=45),
    timedelta(hours=-3, minutes=-30),
]
ZONES = st.sampled_from([timezone(o) for o in OFFSETS] + [UTC])

aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=ZONES
)

CHINESE = [
    "你好，世界",
    "记忆是智能体最持久的东西",
    "用户喜欢喝绿茶，不喜欢咖啡。",
    "北京 Beijing 2024年",
    "🧠 memory / 記憶 / 기억",
]
cjk_text = st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=12)
unicode_text = st.one_of(
    st.text(max_size=20),  # any code point but surrogates
    cjk_text,
    st.sampled_from(CHINESE),
    st.text(st.characters(codec="ascii"), max_size=20),
)


def _constraints(metadata: list[Any]) -> dict[str, Any]:
    """Flatten annotated-types / pydantic metadata into one dict of bounds."""
    found: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, FieldInfo):
            found.update(_constraints(item.metadata))
        for name in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            value = getattr(item, name, None)
            if value is not None:
                found[name] = value
    return found


def _strings(c: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = c.get("min_length", 0), c.get("max_length")
    base: st.SearchStrategy[str] = unicode_text
    if "pattern" in c:
        pattern = c["pattern"]
        base = st.one_of(
            unicode_text.filter(lambda s: re.fullmatch(pattern, s) is not None),
            st.from_regex(pattern, fullmatch=True),
        )
    return base.filter(lambda s: len(s) >= low and (high is None or len(s) <= high))


def _floats(c: dict[str, Any]) -> st.SearchStrategy[float]:
    low = c.get("ge", c.get("gt"))
    high = c.get("le", c.get("lt"))
    inner = st.floats(
        min_value=low,
        max_value=high,
        exclude_min="gt" in c,
        exclude_max="lt" in c,
        allow_nan=False,
        allow_infinity=False,
    )
    bounds = [b for b, k in ((low, "ge"), (high, "le")) if b is not None and k in c]
    return st.one_of(st.sampled_from(bounds), inner) if bounds else inner


def _ints(c: dict[str, Any]) -> st.SearchStrategy[int]:
    low = c["ge"] if "ge" in c else c["gt"] + 1 if "gt" in c else -(2**63)
    high = c["le"] if "le" in c else c["lt"] - 1 if "lt" in c else 2**63 - 1
    return st.integers(min_value=low, max_value=high)


def strategy_for(tp: Any, metadata: list[Any] | None = None) -> st.SearchStrategy[Any]:
    """A strategy of valid values for one annotation of our models."""
    metadata = metadata or []
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *extra = get_args(tp)
        return strategy_for(inner, [*metadata, *extra])
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return st.one_of(st.none(), strategy_for(inner, metadata))
    if origin is Literal:
        return st.sampled_from(get_args(tp))
    if origin is list:
        return st.lists(strategy_for(get_args(tp)[0]), max_size=3)
    if origin is dict:
        key_tp, value_tp = get_args(tp)
        return st.dictionaries(strategy_for(key_tp), strategy_for(value_tp), max_size=3)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return model_strategy(tp)
    c = _constraints(metadata)
    if tp is AwareDatetime or tp is datetime:
        return aware_datetimes
    if tp is UUID:
        return st.uuids()
    if tp is bool:
        return st.booleans()
    if tp is int:
        return _ints(c)
    if tp is float:
        return _floats(c)
    if tp is str:
        return _strings(c)
    raise TypeError(f"no strategy for {tp!r}")


_MODEL_STRATEGIES: dict[type[BaseModel], st.SearchStrategy[Any]] = {}
CHECKED_TOO: dict[type[BaseModel], set[str]] = {WorkingSet: {"session_id"}}
"""Optional fields that a model's own validator requires (``working.set`` is per session)."""


def model_strategy(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """Valid instances of ``model``: required fields always, defaulted ones sometimes."""
    if model not in _MODEL_STRATEGIES:
        required: dict[str, st.SearchStrategy[Any]] = {}
        optional: dict[str, st.SearchStrategy[Any]] = {}
        for name, info in model.model_fields.items():
            value = strategy_for(info.annotation, list(info.metadata))
            if name in CHECKED_TOO.get(model, ()):
                required[name] = value.filter(lambda v: v is not None)
                continue
            (required if info.is_required() else optional)[name] = value
        kwargs = st.fixed_dictionaries(required, optional=optional)
        _MODEL_STRATEGIES[model] = kwargs.map(lambda kw: model(**kw))
    return _MODEL_STRATEGIES[model]


def committed_fingerprint(event_type: type[Event]) -> bytes:
    with (AVSC_DIR / avsc_name(event_type)).open(encoding="utf-8") as file:
        return fingerprint(json.load(file))


TYPES = pytest.mark.parametrize("event_type", schemas.ALL_TYPES, ids=lambda t: t.TYPE)

# -- round trips -----------------------------------------------------------------


def test_type_registry_is_consistent() -> None:
    assert schemas.ALL_TYPES == schemas.RAW_TYPES + schemas.DERIVED_TYPES
    assert len(schemas.TYPES_BY_NAME) == len(schemas.ALL_TYPES), "two types share a name"
    assert {t.TYPE for t in schemas.RAW_TYPES} == schemas.RAW_TYPE_NAMES
    for event_type in schemas.ALL_TYPES:
        assert event_type.model_fields["type"].default == event_type.TYPE
        assert issubclass(event_type, schemas.DerivedEvent) == (event_type in schemas.DERIVED_TYPES)


@TYPES
@ROUNDTRIP
@given(data=st.data())
def test_avro_roundtrip(event_type: type[Event], data: st.DataObject) -> None:
    event = data.draw(model_strategy(event_type))
    encoded = CODEC.encode(event)
    assert encoded[:2] == MAGIC == b"\xc3\x01"
    assert encoded[2:10] == committed_fingerprint(event_type)
    decoded = CODEC.decode(encoded)
    assert type(decoded) is event_type
    assert decoded == event


@TYPES
@ROUNDTRIP
@given(data=st.data())
def test_json_roundtrip(event_type: type[Event], data: st.DataObject) -> None:
    event = data.draw(model_strategy(event_type))
    encoded = CODEC.encode_json(event)
    assert json.loads(encoded)["type"] == event_type.TYPE
    decoded = CODEC.decode(encoded)
    assert type(decoded) is event_type
    assert decoded == event
    assert CODEC.from_json_object(json.loads(encoded)) == event


@TYPES
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_avro_and_json_agree(event_type: type[Event], data: st.DataObject) -> None:
    event = data.draw(model_strategy(event_type))
    via_avro = CODEC.decode(CODEC.encode(event))
    via_json = CODEC.decode(CODEC.encode_json(event))
    assert via_avro.model_dump_json() == via_json.model_dump_json() == event.model_dump_json()


def _interaction(**body: Any) -> InteractionRecorded:
    return InteractionRecorded(
        event_id=uuid4(),
        agent_id="agent-边界",
        occurred_at=datetime(2024, 2, 29, 23, 59, 59, 999_999, tzinfo=UTC),
        body={"role": "user", "content": "边界值 bounds", **body},
    )


@pytest.mark.parametrize(
    "body",
    [
        {"importance": 1.0, "sentiment": -1.0, "confidence": 0.0},
        {"importance": 10.0, "sentiment": 1.0, "confidence": 1.0},
        {"importance": 5.5, "sentiment": -0.0, "confidence": 5e-324},
    ],
)
def test_float_bounds_roundtrip(body: dict[str, float]) -> None:
    event = _interaction(**body)
    for encoded in (CODEC.encode(event), CODEC.encode_json(event)):
        decoded = CODEC.decode(encoded)
        assert isinstance(decoded, InteractionRecorded)
        assert decoded == event
        assert decoded.body.model_dump(include=set(body)) == body


@pytest.mark.parametrize(
    ("field", "value"),
    [("importance", 0.999), ("importance", 10.001), ("sentiment", 1.0001), ("confidence", -1e-9)],
)
def test_float_bounds_are_enforced(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        _interaction(**{field: value})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_are_rejected(value: float) -> None:
    """JSON has no NaN or infinity; they would serialise as null and not come back."""
    with pytest.raises(ValidationError):
        schemas.TickBody(partition=0, interval_s=value)
    with pytest.raises(ValidationError):
        schemas.RecalledBody(query="q", memory_ids=["m"], scores=[value])


def test_ints_are_bounded_to_avro_long() -> None:
    """Every valid event must encode: an Avro long is 64-bit."""
    schemas.TickBody(partition=2**63 - 1, interval_s=1.0)
    with pytest.raises(ValidationError, match="partition"):
        schemas.TickBody(partition=2**63, interval_s=1.0)


# -- occurred_at -------------------------------------------------------------------


def test_naive_occurred_at_is_rejected() -> None:
    with pytest.raises(ValidationError, match="occurred_at"):
        schemas.SessionStarted(event_id=uuid4(), agent_id="a", occurred_at=datetime(2024, 1, 1))


def test_offset_occurred_at_is_normalised_to_utc_millis() -> None:
    local = datetime(
        2024, 1, 1, 8, 30, 15, 123_456, tzinfo=timezone(timedelta(hours=5, minutes=30))
    )
    event = schemas.SessionStarted(event_id=uuid4(), agent_id="a", occurred_at=local)
    assert event.occurred_at.utcoffset() == timedelta(0)
    assert event.occurred_at == datetime(2024, 1, 1, 3, 0, 15, 123_000, tzinfo=UTC)
    assert event.occurred_at.tzinfo is UTC


@settings(max_examples=200, deadline=None)
@given(moment=aware_datetimes)
def test_occurred_at_truncates_to_utc_millis(moment: datetime) -> None:
    event = schemas.SessionEnded(event_id=uuid4(), agent_id="a", occurred_at=moment)
    at = event.occurred_at
    assert at.utcoffset() == timedelta(0)
    assert at.microsecond % 1000 == 0
    assert timedelta(0) <= moment - at < timedelta(milliseconds=1)
    assert CODEC.decode(CODEC.encode(event)).occurred_at == at


def test_offset_that_leaves_the_datetime_range_is_a_validation_error() -> None:
    early = datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))
    with pytest.raises(ValidationError, match="out of range"):
        schemas.SessionEnded(event_id=uuid4(), agent_id="a", occurred_at=early)


# -- the committed contracts ---------------------------------------------------------


@TYPES
def test_committed_avsc_matches_the_model(event_type: type[Event]) -> None:
    path = AVSC_DIR / avsc_name(event_type)
    assert path.is_file(), f"missing contract {path.name}: run schemas.avro.write_avsc"
    committed = json.loads(path.read_text(encoding="utf-8"))
    assert committed == avro_schema(event_type), (
        f"{path.name} drifted from {event_type.__name__}: regenerate with write_avsc"
    )
    assert CODEC.avro[event_type.TYPE].header == MAGIC + fingerprint(committed)


def test_every_committed_avsc_belongs_to_a_known_type() -> None:
    files = sorted(AVSC_DIR.glob("*.avsc"))
    known = set(schemas.TYPES_BY_NAME)
    strays = [p.name for p in files if p.name.rsplit(".v", 1)[0] not in known]
    assert not strays, f"contracts of no known type: {strays}"
    current = {avsc_name(t) for t in schemas.ALL_TYPES}
    assert current <= {p.name for p in files}


def test_fingerprints_are_unique() -> None:
    prints = [fingerprint(json.loads(p.read_text())) for p in AVSC_DIR.glob("*.avsc")]
    assert len(prints) == len(set(prints))
    assert all(len(p) == 8 for p in prints)


def test_write_avsc_reproduces_the_committed_files(tmp_path: Path) -> None:
    written = write_avsc(schemas.ALL_TYPES, tmp_path)
    assert len(written) == len(schemas.ALL_TYPES)
    for path in written:
        assert path.read_text() == (AVSC_DIR / path.name).read_text()
