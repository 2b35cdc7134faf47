"""Erasure of a subject from one agent's memory: a pure, deterministic purge.

A subject is a user, or an agent without users: an item *belongs* to subject ``S``
in agent ``A`` when its user is ``S``, or when it has no user and ``S`` is ``A``
itself (:class:`Owner`). The purge drops everything that belongs to the subject —
working sessions, open episodes, consolidation windows (they hold episode
summaries), memories, fact versions, persona versions — and touches nothing else,
so applying it twice changes nothing the second time (every count is 0).

Facts and persona are shared documents of the agent, so dropping the subject's
versions re-folds the others' as if the subject's updates had never been made:

* a fact version the subject's assertion closed stays valid over the interval the
  subject's version held (then ends as that one ended); two adjacent versions left
  with the same value become one (the second assertion would have changed nothing);
* a persona is re-merged from the *changes* the other users' versions made, in
  order, and renumbered from 1; a version that no longer changes anything is gone.

Known limit: a retraction keeps no author, so a retraction the subject made of
another user's fact is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from processors.build import updated
from processors.consolidation import Consolidation
from processors.episodes import Episodes
from processors.facts import Facts
from processors.memories import Memories
from processors.persona import Persona, PersonaVersion, merge_preferences
from processors.state import FactVersion
from processors.working import WorkingMemory

Content = tuple[str | None, str | None, str | None, dict[str, str]]

ERASURE_AGENT = "__all__"
"""The agent id of a broadcast ``subject.erasure_requested``: published to every
partition of ``engram.events``; the fold applies it to every agent of the partition
(see :func:`streams.pipeline.erasure_for`)."""


@dataclass(frozen=True, slots=True)
class Owner:
    """Whether an item's user makes it the subject's, in agent ``agent_id``."""

    subject: str
    agent_id: str

    def owns(self, user: str | None) -> bool:
        return user == self.subject or (user is None and self.subject == self.agent_id)


@dataclass(frozen=True, slots=True)
class Purged:
    """How many items of each kind an erasure dropped."""

    sessions: int = 0
    episodes: int = 0
    memories: int = 0
    facts: int = 0
    persona: int = 0


def purge_sessions(
    working: WorkingMemory, users: dict[str, str], mine: set[str], owner: Owner
) -> int:
    """Drop the subject's working sessions: by ``users`` (session id -> its user, for
    the sessions that have one), and those in ``mine`` (whose open episode is the
    subject's); return how many."""
    gone = [sid for sid in working.sessions if sid in mine or owner.owns(users.get(sid))]
    for sid in gone:
        del working.sessions[sid]
        users.pop(sid, None)
    return len(gone)


def purge_episodes(episodes: Episodes, consolidation: Consolidation, owner: Owner) -> int:
    """Drop the subject's open episodes, the end of its episode chain and its
    consolidation windows; return how many episodes (open ones, and closed ones
    waiting in a window) left."""
    open_gone = [sid for sid, episode in episodes.open.items() if owner.owns(episode.user_id)]
    for sid in open_gone:
        del episodes.open[sid]
    for user in [u for u in episodes.previous if owner.owns(u or None)]:
        del episodes.previous[user]
    windows = consolidation.windows
    window_gone = [key for key, window in windows.items() if owner.owns(window.user_id)]
    waiting = sum(len(windows[key].episodes) for key in window_gone)
    for key in window_gone:
        del windows[key]
    if window_gone:
        consolidation.first_end = consolidation._first_end()
    return len(open_gone) + waiting


def open_sessions_of(episodes: Episodes, owner: Owner) -> set[str]:
    """Sessions whose open episode belongs to the subject."""
    return {sid for sid, episode in episodes.open.items() if owner.owns(episode.user_id)}


def purge_memories(memories: Memories, owner: Owner) -> int:
    """Drop the subject's live memories; return how many."""
    gone = [mid for mid, item in memories.items.items() if owner.owns(item.user_id)]
    for mid in gone:
        del memories.items[mid]
        memories.watch.pop(mid, None)
    return len(gone)


def purge_facts(facts: Facts, owner: Owner) -> int:
    """Drop the subject's fact versions, re-folding each key's others; return how many."""
    dropped = 0
    for key, versions in list(facts.histories.items()):
        if not any(owner.owns(v.user_id) for v in versions):
            continue
        kept = refold_fact(versions, owner)
        dropped += sum(1 for v in versions if owner.owns(v.user_id))
        if kept:
            facts.histories[key] = kept
        else:
            del facts.histories[key]
    return dropped


def refold_fact(versions: Sequence[FactVersion], owner: Owner) -> list[FactVersion]:
    """One key's versions without the subject's (see the module docstring)."""
    kept: list[FactVersion] = []
    extended = False  # whether kept[-1] was stretched over a dropped version
    for version in versions:
        last = kept[-1] if kept else None
        adjacent = last is not None and last.valid_to == version.valid_from
        mine = owner.owns(version.user_id)
        if last is not None and adjacent and (mine or (extended and last.value == version.value)):
            kept[-1] = updated(last, {"valid_to": version.valid_to})
            extended = True
        elif not mine:
            kept.append(version)
            extended = False
    return kept


def purge_persona(persona: Persona, users: list[str | None], owner: Owner) -> int:
    """Drop the subject's persona versions (``users``: each version's user, in
    order, kept in step) and re-merge the others'; return how many were dropped."""
    if not any(owner.owns(u) for u in users):
        return 0
    dropped = sum(1 for u in users if owner.owns(u))
    versions, authors = refold_persona(persona.versions, users, owner)
    persona.versions = versions
    users[:] = authors
    return dropped


def refold_persona(
    versions: Sequence[PersonaVersion], users: Sequence[str | None], owner: Owner
) -> tuple[list[PersonaVersion], list[str | None]]:
    """The persona's versions re-merged from the changes the others made."""
    kept: list[PersonaVersion] = []
    authors: list[str | None] = []
    before: Content = (None, None, None, {})
    for version, user in zip(versions, users, strict=True):
        change = _change(before, version.content())
        before = version.content()
        if owner.owns(user):
            continue
        made = _merged(kept[-1] if kept else None, change, version)
        if made is not None:
            kept.append(made)
            authors.append(user)
    return kept, authors


def _change(old: Content, new: Content) -> Content:
    """What an update changed: the fields that differ (None: left out) and the
    preferences that differ (``""``: removed)."""
    name, description, style = (_differs(new[i], old[i]) for i in range(3))
    removed = {k: "" for k in old[3] if k not in new[3]}
    changed = {k: v for k, v in new[3].items() if old[3].get(k) != v}
    return name, description, style, removed | changed


def _merged(
    base: PersonaVersion | None, change: Content, version: PersonaVersion
) -> PersonaVersion | None:
    """``change`` merged on ``base`` as the version after it, or None if it changes nothing."""
    old: Content = base.content() if base is not None else (None, None, None, {})
    name, description, style = (_keep(change[i], old[i]) for i in range(3))
    content = (name, description, style, merge_preferences(old[3], change[3]))
    if content == old:
        return None
    at = version.updated_at if base is None else max(base.updated_at, version.updated_at)
    return PersonaVersion(
        version=(base.version + 1) if base is not None else 1,
        name=name,
        description=description,
        style=style,
        preferences=content[3],
        updated_at=at,
        source_event_id=version.source_event_id,
    )


def _differs(new: str | dict[str, str] | None, old: str | dict[str, str] | None) -> str | None:
    return new if isinstance(new, str) and new != old else None


def _keep(new: str | dict[str, str] | None, old: str | dict[str, str] | None) -> str | None:
    chosen = old if new is None else new
    return chosen if isinstance(chosen, str) else None
