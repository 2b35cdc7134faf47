"""``processors._ids``: the C extension that makes the fold's name-based UUIDs gives
what ``uuid.uuid5`` gives (and the Python reference, ``reference_uuid5_int``), at every
length around SHA-1's 64-byte blocks, and refuses what it cannot hash; and a UUID's
text from its int, as ``str(UUID(int=...))``."""

from __future__ import annotations

import os
import platform
import uuid
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors import ids
from processors.ids import (
    ENGRAM_NAMESPACE,
    canonical_text,
    reference_uuid5_int,
    text_of,
    uuid5_of,
    uuid5_str,
)
from schemas.uuids import canonical

PURE = os.environ.get("ENGRAM_PURE_PYTHON") == "1"
native = pytest.mark.skipif(PURE, reason="ENGRAM_PURE_PYTHON=1: no C extension built")

if not PURE:
    from processors._ids import portable, uuid5_int, uuid5_text
    from processors._ids import text_of as c_text_of

NAMES = st.one_of(
    st.text(max_size=300),
    st.text(alphabet="a:-0123456789", max_size=200),
    st.integers(0, 200).map(lambda n: "x" * n),
    st.integers(0, 100).map(lambda n: "好" * n),
)


def both_ways(check: Callable[[], None]) -> None:
    """``check()`` with SHA-1 in portable C, then with the CPU's SHA extensions (where
    it has them: else portable again)."""
    before = portable()
    try:
        for on in (True, False):
            portable(on)
            check()
    finally:
        portable(before)


@native
@given(NAMES, st.uuids())
@settings(max_examples=500)
def test_the_c_uuid5_is_uuid5(name: str, namespace: uuid.UUID) -> None:
    expected = uuid.uuid5(namespace, name)

    def check() -> None:
        assert uuid5_int(namespace.bytes, name) == expected.int
        assert uuid5_text(namespace.bytes, name) == str(expected)

    both_ways(check)


@native
@pytest.mark.parametrize("length", range(30, 140))
def test_every_length_around_the_blocks(length: int) -> None:
    # 16 bytes of namespace before the name: 55 and 56 bytes of message end the first
    # block with its length or push the length into a second one
    name = "n" * length
    expected = uuid.uuid5(ENGRAM_NAMESPACE, name).int
    both_ways(lambda: _equal(uuid5_int(ENGRAM_NAMESPACE.bytes, name), expected))


def _equal(got: object, expected: object) -> None:
    assert got == expected


@native
@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="no /proc/cpuinfo")
def test_the_cpu_sha_extensions_are_used_where_it_has_them() -> None:
    with open("/proc/cpuinfo") as cpuinfo:
        flags = {f for line in cpuinfo if line.startswith("flags") for f in line.split()}
    if platform.machine() == "x86_64" and {"sha_ni", "ssse3", "sse4_1"} <= flags:
        assert portable() is False
    else:
        assert portable() is True
    before = portable()
    try:
        assert portable(True) is True
    finally:
        portable(before)


@given(NAMES)
@settings(max_examples=200)
def test_the_fold_ids_are_uuid5(name: str) -> None:
    expected = uuid.uuid5(ENGRAM_NAMESPACE, name)
    assert reference_uuid5_int(name) == expected.int
    assert uuid5_of(name) == expected
    assert str(uuid5_of(name)) == str(expected)
    assert uuid5_str(name) == str(expected)


@native
def test_the_fold_runs_the_c_ids() -> None:
    assert ids._native_int is uuid5_int
    assert ids._native_text is uuid5_text
    assert ids._native_text_of is c_text_of


@native
def test_a_name_utf8_cannot_encode_is_refused_as_encode_refuses_it() -> None:
    with pytest.raises(UnicodeEncodeError):
        "\ud800".encode()
    with pytest.raises(UnicodeEncodeError):
        uuid5_int(ENGRAM_NAMESPACE.bytes, "a\ud800")
    with pytest.raises(UnicodeEncodeError):
        uuid5_text(ENGRAM_NAMESPACE.bytes, "a\ud800")


@native
@pytest.mark.parametrize(
    "args",
    [(b"short", "name"), (ENGRAM_NAMESPACE.bytes, b"name"), ("x" * 16, "name"), (b"x" * 16,)],
)
def test_what_cannot_be_hashed_is_refused(args: tuple[object, ...]) -> None:
    with pytest.raises(TypeError, match="16 bytes of a namespace, a str name"):
        uuid5_int(*args)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="16 bytes of a namespace, a str name"):
        uuid5_text(*args)  # type: ignore[arg-type]


@given(st.uuids())
def test_canonical_text_is_the_text_of_the_uuid(value: uuid.UUID) -> None:
    for text in (str(value), str(value).upper(), value.hex, f"{{{value}}}", value.urn):
        assert canonical_text(text) == str(uuid.UUID(text))


@pytest.mark.parametrize(
    "text", ["", "not a uuid", "8f7d6b9e-3c1a-5e2f-9b4d-2a6c8e0f1b3", "g" * 32]
)
def test_canonical_text_refuses_what_uuid_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        uuid.UUID(text)
    with pytest.raises(ValueError):
        canonical_text(text)


@given(st.integers(0, 2**128 - 1))
def test_the_text_of_an_int_is_the_text_of_its_uuid(value: int) -> None:
    assert text_of(value) == str(uuid.UUID(int=value))


@native
@given(st.integers(0, 2**128 - 1))
def test_the_c_text_of_is_canonical(value: int) -> None:
    assert c_text_of(value) == canonical(value) == str(uuid.UUID(int=value))


@native
@pytest.mark.parametrize("value", [-1, 2**128, 2**200, -(2**70)])
def test_what_has_no_16_bytes_is_refused_as_to_bytes_refuses_it(value: int) -> None:
    with pytest.raises(OverflowError):
        canonical(value)
    with pytest.raises(OverflowError):
        c_text_of(value)


@native
def test_only_an_int_has_a_text() -> None:
    with pytest.raises(TypeError, match="value is an int"):
        c_text_of("1")  # type: ignore[arg-type]
