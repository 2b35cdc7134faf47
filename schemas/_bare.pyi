from typing import Any, TypeVar

T = TypeVar("T")

def bare(cls: type[T], *pairs: Any) -> T: ...
