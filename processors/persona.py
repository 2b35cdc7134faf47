"""L4 of one agent: the versioned persona document and the skills record.

Both are deterministic folds over events in log order; time comes only from
events' ``occurred_at``. Each is built from its serialised state and gives it back
with ``state()``, so a fold can stop after any event and resume exactly.

Persona merge rule (``persona.updated``):

* ``name`` / ``description`` / ``style`` left None keep their previous value; any
  string, the empty string included, replaces it;
* ``preferences`` merge by key: a non-empty value sets the key, an **empty-string
  value removes the key** (removing an absent key does nothing);
* an update that leaves the document unchanged makes no version.

Skills rule (``tool.called`` / ``tool.result``, keyed by tool name; folded by
:class:`processors.skills.Skills`, compiled with the fold):

* a call is one use; a result counts a success (``ok``) or a failure;
* a result is matched to the open call with the same ``(tool, call_id)``; a result
  without one (its call was never seen, already answered, or forgotten: at most
  :data:`MAX_OPEN_CALLS` calls are kept open, oldest forgotten first) is also a use;
* ``last_used_at`` is the latest time of a use (a call or an unmatched result).

Late arrival: times never go back. A version's ``updated_at`` and a skill's
``last_used_at`` are ``max(previous, occurred_at)``, so versions stay ordered by time
and :meth:`Persona.at` is a search over them.
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import Field

from schemas import (
    Event,
    Model,
    PersonaBody,
    PersonaUpdated,
    PersonaVersionBody,
)
from schemas.base import INT64_MAX, UtcMillis

Count = Annotated[int, Field(ge=0, le=INT64_MAX)]

MAX_OPEN_CALLS = 1024
"""Calls awaiting their result that the skills record keeps; bounds its state."""


# -- persona --------------------------------------------------------------------------


class PersonaVersion(PersonaVersionBody):
    """The whole persona document as of one update (``version`` counts from 1), and
    the event that made it."""

    source_event_id: UUID

    def content(self) -> tuple[str | None, str | None, str | None, dict[str, str]]:
        """What the document says, without its version bookkeeping."""
        return self.name, self.description, self.style, self.preferences


class PersonaState(Model):
    """Serialised persona of one agent: every version, oldest first."""

    versions: list[PersonaVersion] = []


def merge_preferences(old: dict[str, str], update: dict[str, str]) -> dict[str, str]:
    """``old`` with ``update`` merged by key; an empty-string value removes the key.

    The result's keys are sorted, so equal preferences serialise identically.
    """
    merged = {**old, **update}
    return {k: v for k, v in sorted(merged.items()) if v != ""}


class Persona:
    """The live fold of one agent's persona document; versions are kept."""

    def __init__(self, state: PersonaState | None = None) -> None:
        self.versions: list[PersonaVersion] = list((state or PersonaState()).versions)

    def apply(self, event: Event) -> PersonaVersion | None:
        """Fold one event; the new version, or None (other types, no change)."""
        if not isinstance(event, PersonaUpdated):
            return None
        candidate = self._merge(event.body, event)
        previous = self.current()
        if previous is not None and candidate.content() == previous.content():
            return None
        if previous is None and candidate.content() == (None, None, None, {}):
            return None
        self.versions.append(candidate)
        return candidate

    def _merge(self, body: PersonaBody, event: PersonaUpdated) -> PersonaVersion:
        """The version ``body`` would make on top of the current one."""
        previous = self.current()
        base = previous or PersonaVersion(
            version=1, updated_at=event.occurred_at, source_event_id=event.event_id
        )
        return PersonaVersion(
            version=previous.version + 1 if previous else 1,
            name=_keep(body.name, base.name),
            description=_keep(body.description, base.description),
            style=_keep(body.style, base.style),
            preferences=merge_preferences(base.preferences, body.preferences),
            updated_at=max(base.updated_at, event.occurred_at),
            source_event_id=event.event_id,
        )

    def current(self) -> PersonaVersion | None:
        """The latest version, or None before the first update."""
        return self.versions[-1] if self.versions else None

    def at(self, moment: datetime) -> PersonaVersion | None:
        """The version in force at ``moment`` (aware): the last one updated at or before it."""
        i = bisect_right(self.versions, moment, key=lambda v: v.updated_at)
        return self.versions[i - 1] if i else None

    def state(self) -> PersonaState:
        """Serialisable snapshot; ``Persona(state)`` resumes exactly here."""
        return PersonaState(versions=list(self.versions))


def _keep(new: str | None, old: str | None) -> str | None:
    """``new`` unless it was left out (None)."""
    return old if new is None else new


# -- skills ---------------------------------------------------------------------------


class SkillRecord(Model):
    """How one tool has been used. ``success_rate`` is ``successes / (successes +
    failures)``, None before any result; build records with
    :func:`processors.skills.skill_record` to keep it so."""

    name: str
    uses: Count = 0
    successes: Count = 0
    failures: Count = 0
    last_used_at: UtcMillis | None = None
    success_rate: Annotated[float, Field(ge=0.0, le=1.0)] | None = None


class OpenCall(Model):
    """A ``tool.called`` whose result has not been seen yet."""

    tool: str
    call_id: str


class SkillsState(Model):
    """Serialised skills of one agent: records sorted by name, open calls oldest first."""

    skills: list[SkillRecord] = []
    open_calls: list[OpenCall] = []
