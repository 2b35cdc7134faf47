"""Instances built from their slots: ``object.__new__(cls)``, then each data
descriptor's ``__set__``, without the class's ``__init__`` or ``__setattr__``.

:func:`bare` is the one call that builds each model :func:`schemas.reader.trusted`
trusts (its ``__dict__`` and three of pydantic's slots) and each UUID of
:mod:`schemas.uuids` (three slots). Calling a descriptor's ``__set__`` from Python
goes through a bound method-wrapper, an argument tuple and its unpacking: about 600
instructions a value on CPython 3.11, some 4 000 for one model, of which the fold builds
about three an event (a sixth of its instructions). The C extension ``schemas._bare``
(``setup.py`` builds it beside the mypyc extensions) does the same calls without them;
:func:`reference` is its Python, which runs where the extension is not built
(``ENGRAM_PURE_PYTHON=1``).
``tests/unit/test_bare.py`` holds the two to each other.

The contract (both): ``cls`` is a type whose instances ``object.__new__`` makes (its
``__new__`` is ``object.__new__``, inherited; any other class is refused with a
``TypeError``); ``pairs`` are a data descriptor of ``cls`` (a slot's
``member_descriptor``, the ``__dict__`` descriptor) and its value, in turn, set in
order by the descriptor's own setter, which refuses what ``descriptor.__set__``
refuses (a read-only slot, another class's descriptor, a ``__dict__`` not a dict).
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["bare", "reference"]

T = TypeVar("T")


def reference(cls: type[T], *pairs: Any) -> T:
    """:func:`bare` in Python: the same instance, the same errors."""
    if len(pairs) % 2:
        raise TypeError(
            "bare(cls, descriptor, value, ...) takes a class and pairs "
            "of a data descriptor and its value"
        )
    if not isinstance(cls, type):
        raise TypeError(f"bare(): cls must be a type, not {type(cls).__name__}")
    if cls.__new__ is not object.__new__:
        raise TypeError(f"bare(): {cls.__name__} does not make its instances with object.__new__")
    descriptors = pairs[::2]
    for at, descriptor in enumerate(descriptors):
        if not hasattr(type(descriptor), "__set__"):
            name = type(descriptor).__name__
            raise TypeError(f"bare(): argument {2 * at + 1} is a {name}, not a data descriptor")
    made: T = object.__new__(cls)
    for descriptor, value in zip(descriptors, pairs[1::2], strict=True):
        descriptor.__set__(made, value)
    return made


try:
    from schemas._bare import bare
except ImportError:  # installed without compiling (ENGRAM_PURE_PYTHON=1)
    bare = reference
