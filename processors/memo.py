"""A bounded memo for the results of pure functions of a text.

What a memo holds never changes a result, only how soon it comes: each value is
what the function gives for its key, whenever it is asked. It forgets its oldest
entries first when it holds more than ``size`` entries or more than ``chars``
characters of keys, so a worker's memory stays bounded however many texts it meets.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    """Text -> value, the oldest forgotten first past ``size`` entries or ``chars``
    characters of keys; keys longer than ``longest`` are not kept."""

    __slots__ = ("chars", "held", "longest", "order", "size", "values")

    def __init__(self, size: int, chars: int, longest: int) -> None:
        self.size = size
        self.chars = chars
        self.longest = longest
        self.held = 0
        self.values: dict[str, V] = {}
        """The entries: a plain dict, whose lookups compiled code makes natively (an
        ``OrderedDict``'s ``get`` was a method call)."""
        self.order: deque[str] = deque()
        """The keys, oldest first (a dict's oldest key is slow to find once keys
        have left it from the front)."""

    def get(self, key: str) -> V | None:
        return self.values.get(key)

    def put(self, key: str, value: V) -> None:
        """Remember ``value`` for ``key`` (unless ``key`` is too long, or known)."""
        if len(key) > self.longest or key in self.values:
            return
        values = self.values
        values[key] = value
        self.order.append(key)
        self.held += len(key)
        while len(values) > self.size or self.held > self.chars:
            old = self.order.popleft()
            del values[old]
            self.held -= len(old)

    def __len__(self) -> int:
        return len(self.values)
