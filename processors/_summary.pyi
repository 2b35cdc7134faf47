from collections.abc import Callable

from processors.state import ScoringParams

def pick(
    pieces: list[tuple[str, frozenset[str], bool, bool]],
    max_chars: int,
    params: ScoringParams,
    importance: Callable[[str, ScoringParams], float],
    /,
) -> tuple[str, bool]: ...
