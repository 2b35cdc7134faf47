"""``schemas.bare``: the C extension that builds an instance from its slots does what its
Python reference does: the same instance, the same errors."""

from __future__ import annotations

import abc
import copy
import os
import pickle
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, SafeUUID

import pytest
from pydantic import BaseModel

from schemas import Turn, WorkingBody
from schemas.bare import bare, reference
from schemas.uuids import TextUUID

PURE = os.environ.get("ENGRAM_PURE_PYTHON") == "1"
ROADS = [pytest.param(reference, id="python")]
if not PURE:
    from schemas._bare import bare as in_c

    ROADS.append(pytest.param(in_c, id="c"))

Bare = Callable[..., Any]
SLOTS = vars(BaseModel)
DICT, FIELDS = SLOTS["__dict__"], SLOTS["__pydantic_fields_set__"]
EXTRA, PRIVATE = SLOTS["__pydantic_extra__"], SLOTS["__pydantic_private__"]
INT, SAFE, TEXT = vars(UUID)["int"], vars(UUID)["is_safe"], vars(TextUUID)["_text"]
AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class Slotted:
    __slots__ = ("a", "b")


class Other:
    __slots__ = ("c",)


class Abstract(abc.ABC):
    __slots__ = ()

    @abc.abstractmethod
    def answer(self) -> int: ...


class Plain:
    pass


class OwnNew:
    __slots__ = ("a",)

    def __new__(cls) -> OwnNew:
        return super().__new__(cls)


def turn_values() -> dict[str, Any]:
    return {
        "event_id": "e-1",
        "role": "user",
        "content": "我对花生过敏，一定要记住！",
        "occurred_at": AT,
        "tokens": 12,
        "offloaded": False,
    }


@pytest.mark.skipif(PURE, reason="ENGRAM_PURE_PYTHON=1: the extension is not built")
def test_the_extension_is_what_bare_calls() -> None:
    assert bare is in_c
    assert type(bare).__name__ == "builtin_function_or_method"


@pytest.mark.parametrize("make", ROADS)
def test_a_model_built_bare_is_the_validated_model(make: Bare) -> None:
    values = turn_values()
    given = set(values)
    made = make(Turn, DICT, values, FIELDS, given, EXTRA, None, PRIVATE, None)
    validated = Turn.model_validate(turn_values())
    assert type(made) is Turn
    assert made == validated
    assert made.__dict__ is values
    assert made.model_fields_set == validated.model_fields_set
    assert made.__pydantic_extra__ is None and made.__pydantic_private__ is None
    assert made.model_dump_json() == validated.model_dump_json()
    assert hash(made) == hash(validated)  # frozen
    assert pickle.loads(pickle.dumps(made)) == validated
    assert copy.deepcopy(made) == validated
    assert made.model_copy(update={"tokens": 3}).tokens == 3
    with pytest.raises(ValueError, match="frozen"):
        made.tokens = 5  # type: ignore[misc]


@pytest.mark.parametrize("make", ROADS)
def test_a_nested_model_built_bare_serialises_as_the_validated_one(make: Bare) -> None:
    turn = make(Turn, DICT, turn_values(), FIELDS, set(turn_values()), EXTRA, None, PRIVATE, None)
    values = {
        "added": [turn],
        "evicted": 0,
        "prepended": [],
        "size": 1,
        "tokens": 12,
        "task": None,
        "variables": {"city": "Kyoto"},
        "scratchpad": None,
        "cleared": False,
        "expired": [],
    }
    made = make(WorkingBody, DICT, values, FIELDS, set(values), EXTRA, None, PRIVATE, None)
    validated = WorkingBody.model_validate(
        {**values, "added": [turn_values()], "variables": {"city": "Kyoto"}}
    )
    assert made == validated
    assert made.model_dump() == validated.model_dump()


@pytest.mark.parametrize("make", ROADS)
def test_a_uuid_built_bare_is_the_uuid(make: Bare) -> None:
    text = "822f2613-0ed8-505e-8d3e-025ea7325930"
    value = UUID(text).int
    made = make(TextUUID, INT, value, SAFE, SafeUUID.unknown, TEXT, text)
    assert type(made) is TextUUID
    assert made == UUID(text) and hash(made) == hash(UUID(text))
    assert str(made) == text and made.is_safe is SafeUUID.unknown
    plain = make(UUID, INT, value, SAFE, SafeUUID.unknown)
    assert type(plain) is UUID and plain == made
    assert not hasattr(make(Slotted), "a")  # nothing set: the slots stay empty


@pytest.mark.parametrize("make", ROADS)
def test_an_instance_given_no_dict_makes_its_own(make: Bare) -> None:
    made = make(Plain)
    assert type(made) is Plain and vars(made) == {}
    made.x = 1  # type: ignore[attr-defined]
    assert vars(made) == {"x": 1}
    given = make(Plain, vars(Plain)["__dict__"], {"y": 2})
    assert vars(given) == {"y": 2} and given.y == 2


@pytest.mark.parametrize("make", ROADS)
def test_later_pairs_set_in_order(make: Bare) -> None:
    slots = vars(Slotted)
    made = make(Slotted, slots["a"], 1, slots["b"], 2, slots["a"], 3)
    assert (made.a, made.b) == (3, 2)


CASES: list[tuple[str, Callable[[Bare], object], type[Exception], str]] = [
    # Python's own message for a missing argument, the extension's for its count
    ("no class", lambda make: make(), TypeError, "takes a class and pairs|required positional"),
    ("a pair cut", lambda make: make(Slotted, vars(Slotted)["a"]), TypeError, "pairs"),
    ("not a type", lambda make: make("Slotted"), TypeError, "cls must be a type, not str"),
    ("built on int", lambda make: make(bool), TypeError, "bool does not make its instances"),
    ("its own __new__", lambda make: make(OwnNew), TypeError, "OwnNew does not make"),
    ("abstract", lambda make: make(Abstract), TypeError, "Can't instantiate abstract class"),
    ("not a descriptor", lambda make: make(Slotted, "a", 1), TypeError, "argument 1 is a str"),
    ("a function", lambda make: make(Slotted, len, 1), TypeError, "not a data descriptor"),
    (
        "another class's slot",
        lambda make: make(Slotted, vars(Other)["c"], 1),
        TypeError,
        "doesn't apply to a 'Slotted' object",
    ),
    (
        "a __dict__ not a dict",
        lambda make: make(Turn, DICT, [("role", "user")]),
        TypeError,
        "__dict__ must be set to a dictionary",
    ),
]


@pytest.mark.parametrize("make", ROADS)
@pytest.mark.parametrize(("name", "call", "error", "says"), CASES, ids=[c[0] for c in CASES])
def test_what_is_refused_is_refused_alike(
    make: Bare, name: str, call: Callable[[Bare], object], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        call(make)


def test_both_roads_give_the_same_message() -> None:
    if PURE:
        pytest.skip("ENGRAM_PURE_PYTHON=1: the extension is not built")
    for name, call, _, _ in CASES[1:]:
        messages = []
        for make in (reference, in_c):
            with pytest.raises(Exception) as caught:
                call(make)
            messages.append((type(caught.value), str(caught.value)))
        assert messages[0] == messages[1], name


def test_a_failed_build_leaves_no_instance_behind() -> None:
    import gc

    gc.collect()
    before = sum(1 for o in gc.get_objects() if type(o) is Turn)
    for _ in range(100):
        with pytest.raises(TypeError):
            bare(Turn, DICT, {}, FIELDS, set(), vars(Other)["c"], None)
    gc.collect()
    assert sum(1 for o in gc.get_objects() if type(o) is Turn) == before
