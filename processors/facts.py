"""L3 key/value facts of one agent, with validity intervals (bi-temporal facts).

``fact.asserted`` / ``fact.retracted`` maintain, per ``(namespace, key)``, an ordered
history of versions. A new value closes the current version (``valid_to``) instead
of erasing it, so "what was true at T" stays answerable; a retraction closes the
current version without opening a new one.

Contract of :class:`Facts`, for events applied in log order:

* valid time comes only from events' ``occurred_at`` (no clock);
* the versions of a key have half-open intervals ``[valid_from, valid_to)`` that are
  ordered and never overlap; only the last version may be open (``valid_to`` None);
* **late arrival**: an event whose ``occurred_at`` is earlier than the latest
  boundary of its key (the current version's ``valid_from``, or the ``valid_to`` of
  the last closed version) takes effect *at that boundary* instead,
  ``t = max(boundary, occurred_at)``. Log order therefore always wins: a late
  assertion still replaces the current value, and the version it closes may be
  left with an empty interval ``[t, t)`` (kept in history, never returned by
  :meth:`Facts.value_at`). Two events at the same instant resolve the same way:
  the later in the log wins;
* asserting the value that is already current, or retracting a key that has no
  current value, changes nothing (``apply`` returns None). A repeated assertion
  keeps the original version (and its confidence).

Under these rules, for logs with non-decreasing ``occurred_at``, ``value_at(T)`` is
the value asserted last at or before ``T`` and not retracted since.
"""

from __future__ import annotations

from bisect import bisect_right
from datetime import datetime

from processors.build import fields, trusted, updated
from processors.state import FactHistory, FactsState, FactVersion
from schemas import Event, FactAsserted, FactRetracted, FactSetBody

FactKey = tuple[str, str]
"""``(namespace, key)``."""


class Facts:
    """The live fold of one agent's facts; see the module docstring for the contract.

    Built from a :class:`FactsState` (empty by default); :meth:`state` serialises it,
    so a fold stopped after any event and resumed from its state ends exactly as an
    uninterrupted one.
    """

    def __init__(self, state: FactsState | None = None) -> None:
        self.histories: dict[FactKey, list[FactVersion]] = {
            (h.namespace, h.key): list(h.versions) for h in (state or FactsState()).facts
        }

    def apply(self, event: Event) -> FactSetBody | None:
        """Fold one event; the fact change it made, or None (other types, no-ops)."""
        match event:
            case FactAsserted():
                return self._assert(event)
            case FactRetracted():
                return self._retract(event)
            case _:
                return None

    def _assert(self, event: FactAsserted) -> FactSetBody | None:
        body = event.body
        versions = self.histories.setdefault((body.namespace, body.key), [])
        previous = _current(versions)
        if previous is not None and previous.value == body.value:
            return None
        start = self._close(versions, event.occurred_at)
        version = {
            "value": body.value,
            "valid_from": start,
            "valid_to": None,
            "asserted_by": event.event_id,
            "confidence": body.confidence,
            "user_id": event.user_id,
        }
        versions.append(trusted(FactVersion, version, _VERSION_GIVEN))
        return _set(body.namespace, body.key, body.value, start, previous, body.confidence)

    def _retract(self, event: FactRetracted) -> FactSetBody | None:
        body = event.body
        versions = self.histories.get((body.namespace, body.key), [])
        previous = _current(versions)
        if previous is None:
            return None
        end = self._close(versions, event.occurred_at)
        return _set(body.namespace, body.key, None, end, previous)

    @staticmethod
    def _close(versions: list[FactVersion], at: datetime) -> datetime:
        """Close the current version, if any, at ``max(boundary, at)``; return that time."""
        moment = max(_boundary(versions) or at, at)
        if versions and versions[-1].valid_to is None:
            versions[-1] = updated(versions[-1], {"valid_to": moment})
        return moment

    # -- queries ----------------------------------------------------------------------

    def value_at(self, namespace: str, key: str, at: datetime) -> str | None:
        """The value whose ``[valid_from, valid_to)`` contains ``at`` (aware), else None."""
        versions = self.histories.get((namespace, key), [])
        i = bisect_right(versions, at, key=lambda v: v.valid_from)
        if i == 0 or not versions[i - 1].holds_at(at):
            return None
        return versions[i - 1].value

    def current(self, namespace: str, key: str) -> str | None:
        """The value that holds now (the open version), or None if none."""
        version = _current(self.histories.get((namespace, key), []))
        return version.value if version else None

    def list_current(self) -> dict[FactKey, str]:
        """Every fact that currently holds, by ``(namespace, key)``, sorted by key."""
        found = {k: _current(v) for k, v in sorted(self.histories.items())}
        return {k: v.value for k, v in found.items() if v is not None}

    def history(self, namespace: str, key: str) -> list[FactVersion]:
        """Every version of the fact, oldest first (a copy)."""
        return list(self.histories.get((namespace, key), []))

    def state(self) -> FactsState:
        """Serialisable snapshot; ``Facts(state)`` resumes exactly here."""
        return FactsState(
            facts=[
                FactHistory(namespace=ns, key=key, versions=list(versions))
                for (ns, key), versions in sorted(self.histories.items())
                if versions
            ]
        )


_VERSION_GIVEN = fields({"value", "valid_from", "asserted_by", "confidence", "user_id"})
_SET_GIVEN = fields({"namespace", "key", "value", "valid_from", "previous_value"})


def _set(
    namespace: str,
    key: str,
    value: str | None,
    start: datetime,
    previous: FactVersion | None,
    confidence: float | None = None,
) -> FactSetBody:
    """``fact.set``: ``key`` is ``value`` (None: retracted) from ``start`` on, asserted
    with ``confidence`` (None: not given, and always for a retraction)."""
    values = {
        "namespace": namespace,
        "key": key,
        "value": value,
        "valid_from": start,
        "previous_value": previous.value if previous else None,
        "confidence": confidence,
    }
    return trusted(FactSetBody, values, _SET_GIVEN)


def _current(versions: list[FactVersion]) -> FactVersion | None:
    """The open version of a history, if it has one."""
    if versions and versions[-1].valid_to is None:
        return versions[-1]
    return None


def _boundary(versions: list[FactVersion]) -> datetime | None:
    """Latest instant of a history: the open version's start, or the last ``valid_to``."""
    if not versions:
        return None
    last = versions[-1]
    return last.valid_from if last.valid_to is None else last.valid_to
