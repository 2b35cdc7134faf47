"""The bounded memo of pure functions' results: it forgets, oldest first, within bounds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processors.memo import Memo


def test_the_oldest_entries_go_first_past_the_size() -> None:
    memo: Memo[int] = Memo(size=2, chars=100, longest=10)
    for key, value in (("a", 1), ("b", 2), ("c", 3)):
        memo.put(key, value)
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == (None, 2, 3)


def test_the_characters_of_the_keys_are_bounded_and_long_keys_not_kept() -> None:
    memo: Memo[int] = Memo(size=100, chars=5, longest=4)
    memo.put("abcde", 1)  # longer than ``longest``
    memo.put("abc", 2)
    memo.put("de", 3)
    assert memo.get("abcde") is None and len(memo) == 2
    memo.put("f", 4)  # six characters: the oldest goes
    assert (memo.get("abc"), memo.get("de"), memo.get("f")) == (None, 3, 4)


@given(st.lists(st.tuples(st.text(max_size=6), st.integers()), max_size=60))
def test_what_a_memo_holds_is_what_was_put_and_stays_within_bounds(
    puts: list[tuple[str, int]],
) -> None:
    memo: Memo[int] = Memo(size=7, chars=20, longest=5)
    first: dict[str, int] = {}
    for key, value in puts:
        if memo.get(key) is None:
            memo.put(key, value)
            first.setdefault(key, value)
        assert len(memo) <= 7 and sum(map(len, memo.values)) <= 20
        assert list(memo.order) == list(memo.values)  # the keys, oldest first
    for key in first:
        assert memo.get(key) in (None, *[v for k, v in puts if k == key])
