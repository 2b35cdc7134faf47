"""The forgetting curves' parameters and a memory's forgetting state, as models.

Pydantic models, apart from the pure functions of :mod:`processors.forgetting` that
read and make them: mypyc compiles those functions and no pydantic model
(``setup.py``). :mod:`processors.forgetting` re-exports every name here; import them
from there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Literal, Self

from fsrs import Scheduler
from pydantic import Field, model_validator

from schemas.base import INT64_MAX, Model, UtcMillis

Curve = Literal["exponential", "fsrs"]

FSRS6_DEFAULT_WEIGHTS: tuple[float, ...] = (
    0.212,
    1.2931,
    2.3065,
    8.2956,
    6.4133,
    0.8334,
    3.0194,
    0.001,
    1.8722,
    0.1666,
    0.796,
    1.4835,
    0.0614,
    0.2629,
    1.6483,
    0.6014,
    1.8729,
    0.5425,
    0.0912,
    0.0658,
    0.1542,
)
"""The FSRS-6 default weights of ``fsrs`` 6.3, pinned here so that a library
upgrade cannot change replay without changing the config version."""

Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, lt=1)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


class ForgettingParams(Model):
    """Parameters of forgetting; part of the versioned memory config.

    With the defaults, a memory that is never recalled is forgotten (R below the
    curve's threshold at a tick) after about:

    ============  =================  =============
    importance    ``exponential``    ``fsrs``
    ============  =================  =============
    1             0.8 days           2 days
    3             2.8 days           4 days
    5             9.5 days           13 days
    7             32 days            44 days
    9             110 days (~3.6 m)  151 days (~5 m)
    10            204 days           279 days
    ============  =================  =============

    ``exponential``: ``S = base_strength_days * importance_factor ** (importance - 1)``
    (importance clamped to 1..10) and a memory is forgotten after
    ``S * ln(1 / threshold)`` days; each recall multiplies ``S`` by
    ``1 + (reinforce_factor - 1) * reinforce_damping ** n`` (``n`` = earlier
    recalls: 1.8, 1.72, 1.65, ...); each negative feedback by ``weaken_factor``.

    ``fsrs``: the card is reviewed ``Good`` at creation with the initial
    stability ``w[2] * importance_factor ** (importance - 5)`` (the library's
    own value at importance 5, clamped to 0.001..100 days) and is forgotten when
    its retrievability falls below ``fsrs_threshold``. FSRS's power curve has a
    long tail (R is still 0.5 after ~90 S), so the exponential ``threshold``
    would keep every FSRS memory for decades; hence its own threshold.
    ``fsrs_desired_retention`` only sets the card's ``due`` (when FSRS would ask
    for the next review); it does not change retention.
    """

    curve: Curve = "exponential"
    # exponential curve: forget when R < threshold
    threshold: Fraction = 0.2
    # S of an importance-1 memory; each importance point multiplies it (both curves)
    base_strength_days: Positive = 0.5
    importance_factor: Annotated[float, Field(ge=1)] = 1.85
    # S multiplier of the first recall, its excess over 1 damped per earlier recall
    reinforce_factor: Annotated[float, Field(gt=1)] = 1.8
    reinforce_damping: Annotated[float, Field(gt=0, le=1)] = 0.9
    # S multiplier of a negative feedback; S stays within [min, max]_strength_days
    weaken_factor: Fraction = 0.5
    min_strength_days: Positive = 0.01
    max_strength_days: Positive = 36_500.0
    # this many negative feedbacks invalidate a memory (both curves)
    invalidate_after: Annotated[int, Field(ge=1, le=INT64_MAX)] = 3
    # fsrs curve: forget when R < fsrs_threshold; scheduler settings
    fsrs_threshold: Fraction = 0.75
    fsrs_desired_retention: Fraction = 0.9
    fsrs_weights: tuple[float, ...] = FSRS6_DEFAULT_WEIGHTS
    fsrs_maximum_interval_days: Annotated[int, Field(ge=1, le=36_500)] = 36_500

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.min_strength_days > self.max_strength_days:
            raise ValueError("min_strength_days must not exceed max_strength_days")
        scheduler_of(self)  # fsrs validates the weights (count and bounds)
        return self

    @property
    def forget_below(self) -> float:
        """The retention under which an unprotected memory is forgotten, for this curve."""
        return self.fsrs_threshold if self.curve == "fsrs" else self.threshold


class FsrsCard(Model):
    """Everything ``fsrs.Card`` holds, so the card is rebuilt exactly."""

    card_id: int
    state: Annotated[int, Field(ge=1, le=3)]
    step: Annotated[int, Field(ge=0)] | None
    stability: Positive | None
    difficulty: Positive | None
    due: UtcMillis
    last_review: UtcMillis | None


class Trace(Model):
    """The forgetting state of one memory.

    ``strength_days`` is ``S`` (for ``fsrs``, the card's stability);
    ``last_reinforced_at`` the creation or latest reinforcement (a weakening does
    not move it); ``card`` is set only under the ``fsrs`` curve.
    """

    strength_days: Positive
    last_reinforced_at: UtcMillis
    reinforcements: Count = 0
    lapses: Count = 0
    invalidated: bool = False
    card: FsrsCard | None = None


@lru_cache(maxsize=64)
def scheduler_of(params: ForgettingParams) -> Scheduler:
    """The deterministic scheduler of ``params``, built once per parameter set (it
    validates the weights: count and bounds)."""
    return build_scheduler(params, params.fsrs_weights)


def build_scheduler(params: ForgettingParams, weights: tuple[float, ...]) -> Scheduler:
    """An ``fsrs`` scheduler with ``weights`` and the settings of ``params``: no
    fuzzing, no intra-day (re)learning steps."""
    return Scheduler(
        parameters=weights,
        desired_retention=params.fsrs_desired_retention,
        learning_steps=(),
        relearning_steps=(),
        maximum_interval=params.fsrs_maximum_interval_days,
        enable_fuzzing=False,
    )
