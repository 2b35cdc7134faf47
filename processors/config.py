"""The one versioned parameter set of the memory dynamics.

A derived event names the config that made it (``config_version``): a change of
any parameter changes the version, so a reprocess with new parameters writes a
new derived log instead of editing the old one.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Annotated

from pydantic import Field

from processors.forgetting import ForgettingParams
from processors.state import (
    ConsolidationParams,
    EpisodeParams,
    PromotionParams,
    ScoringParams,
    WorkingParams,
)
from schemas import Model


class MemoryConfig(Model):
    """Parameters of every processor. ``name`` is a human label; :attr:`version`
    adds a digest of all parameters, so two configs share a version only if they
    are equal."""

    name: str = "default"
    dedupe_window: Annotated[int, Field(ge=1)] = 512
    working_turns: Annotated[int, Field(ge=1)] = 20
    working: WorkingParams = WorkingParams()
    episodes: EpisodeParams = EpisodeParams()
    scoring: ScoringParams = ScoringParams()
    forgetting: ForgettingParams = ForgettingParams()
    promotion: PromotionParams = PromotionParams()
    consolidation: ConsolidationParams = ConsolidationParams()

    @cached_property
    def version(self) -> str:
        digest = hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:10]
        return f"{self.name}@{digest}"
